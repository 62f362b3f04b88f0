from fabricprobe.cli import main

main()
