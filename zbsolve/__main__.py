from zbsolve.cli import main

main()
