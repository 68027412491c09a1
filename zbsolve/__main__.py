from zbsolve.app.cli import main

main()
