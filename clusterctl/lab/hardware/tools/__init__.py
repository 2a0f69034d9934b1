"""The fake NIC tools and their shared model, installed into lab hosts as plain scripts.

Stdlib only and importable on their own (each script puts its directory on
``sys.path``), because inside a host they run without clusterctl installed.
"""
