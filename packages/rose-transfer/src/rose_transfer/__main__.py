"""``python -m rose_transfer``: the `rose-transfer` command."""

from rose_transfer.cli import main

main()
