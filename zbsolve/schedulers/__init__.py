"""Schedules built without a solver: the handcrafted families, the Zero Bubble heuristic, ZB-V's greedy generator
and torch's built-in orders."""
