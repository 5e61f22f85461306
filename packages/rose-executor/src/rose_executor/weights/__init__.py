"""rose_executor.weights."""
