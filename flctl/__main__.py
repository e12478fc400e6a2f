from flctl.cli import main

main()
