"""The command line and the grid runner: what parses a user's request and hands it down."""
