"""Render an instance as systemd units: the unit and EnvironmentFile, quoting, systemd versions, secrets, node setup, prefill/decode and multi-node units (pure)."""
