from computecatalog_cli.main import main

main()
