from rose_tui.cli import main

main(prog_name="rose-tui")
