"""rose_core.protocol."""
