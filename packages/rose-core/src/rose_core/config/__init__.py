"""rose_core.config."""
