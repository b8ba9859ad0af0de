"""Rows onto the broker: connections with deadlines, producers, Redis pipelines."""
