"""rose_core.app.rl.environments."""
