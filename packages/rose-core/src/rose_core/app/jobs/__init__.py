"""rose_core.app.jobs."""
