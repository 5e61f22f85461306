"""rose_core.app.rl.trainer."""
