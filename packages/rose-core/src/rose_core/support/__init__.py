"""rose_core.support."""
