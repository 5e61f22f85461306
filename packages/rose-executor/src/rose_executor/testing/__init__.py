"""rose_executor.testing."""
