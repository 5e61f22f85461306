from rose_core.app.cli import main

main()
