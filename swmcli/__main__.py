from swmcli.cli.app import main

main()
