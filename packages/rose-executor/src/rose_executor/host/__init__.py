"""rose_executor.host."""
