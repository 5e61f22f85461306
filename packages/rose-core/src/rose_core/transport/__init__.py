"""rose_core.transport."""
