from swmcli.cli import main

main()
