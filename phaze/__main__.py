from phaze.cli import main

main()
