"""Every view of a figure: tables for the terminal and notebooks, Gantt and frontier charts, the forms of results."""
