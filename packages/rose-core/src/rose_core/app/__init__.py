"""rose_core.app."""
