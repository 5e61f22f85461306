from rose_core.cli import main

main()
