"""rose_core.app.rl.algorithm."""
