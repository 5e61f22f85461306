"""rose_core.testing."""
