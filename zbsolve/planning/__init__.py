"""Choosing partition, placement and schedule together (plan), its split bound and baselines, and the step-time-against-memory frontier."""
