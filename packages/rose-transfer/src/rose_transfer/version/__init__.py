"""A weight version: its flat byte stream, its manifest (layout, buckets, checksums, digest), element
types, host buffers, and tensors in and out (numpy; torch through its one adapter)."""
