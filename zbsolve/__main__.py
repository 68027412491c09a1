from zbsolve_cli import main

main()
