"""``python -m rose_executor`` works like the ``rose-executor`` console script."""

from rose_executor.cli import main

if __name__ == "__main__":
    main()
