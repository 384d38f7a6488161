"""Observe: trace sessions and their networkx subgraphs, per-group counters, and group-level
anomaly detection."""
