"""Tier 3: the CLI end to end against the lab (a package, so its module names never clash with tier 1's)."""
