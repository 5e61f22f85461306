"""rose_core.app.rl.demo."""
