"""Bring-up: converge nodes to what the inventory says (``clusterctl net apply``).

Each piece reads the node with the probe doctor uses, shows the difference
(a plan), changes only what differs, one batch of hosts at a time, and
re-checks every host with doctor's own analyzers (docs/bring-up.md).
"""
