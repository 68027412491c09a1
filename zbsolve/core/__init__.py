"""The scheduling model, stated once: placements, per-stage profiles, passes and schedules, the dependency,
timing and memory rules, the simulator that judges every schedule, and step time."""
