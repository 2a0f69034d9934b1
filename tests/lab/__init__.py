"""Tier 2: tests against the lab (a package, so its module names never clash with tier 1's)."""
