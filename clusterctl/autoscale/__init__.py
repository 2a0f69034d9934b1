"""Elastic scaling of templates from live load (issue 25, docs/autoscale.md)."""
