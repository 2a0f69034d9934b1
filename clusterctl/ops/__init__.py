"""Workflows between the CLI and the features (docs/architecture.md, Layers).

A workflow takes a typed request (what the user asked for, already parsed and
loaded by the CLI), calls the features (fleet, diagnose, drift, report,
gateway, ...) and returns a typed result; progress goes through event
callbacks.  Rules: ``ops`` may import the features, the features never import
``ops``; ``ops`` never imports the CLI, never prints and never exits (errors
are :class:`clusterctl.errors.ClusterctlError`).
"""
