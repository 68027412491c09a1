"""Choosing partition, placement and schedule together (plan), its split bound, memory bound and baselines."""
