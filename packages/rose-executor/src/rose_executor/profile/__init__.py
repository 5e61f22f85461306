"""rose_executor.profile."""
