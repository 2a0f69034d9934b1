"""Model staging: manifests, versioned layout, fetch, relay chain, page cache.

Modules marked *node-side* (manifest, layout, fetch, relay, pagecache, node,
verify_model) use only the Python standard library: they are bundled into one
file (``bundle.py``) and run by the node's ``python3``.  ``plan`` and ``run``
are the control side.  See docs/staging.md.
"""
