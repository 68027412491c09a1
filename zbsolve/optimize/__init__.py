"""The integer program, its lower bounds and backends, and solve(): warm starts, bound and search under one time
limit."""
