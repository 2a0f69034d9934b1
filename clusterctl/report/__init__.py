"""Renderers of findings: grouping, JSON, Markdown and Prometheus text (no rich here)."""
