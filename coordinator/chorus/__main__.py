from chorus.cli.main import main

main()
