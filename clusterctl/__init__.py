"""clusterctl: bring up and diagnose bare-metal vLLM inference clusters.

The package follows one pipeline, and its sub-packages are named after it:
inventory -> fleet (SSH fan-out) -> probe (node facts) -> diagnose (analyzers)
-> report (renderers).  ``clusterctl.cli`` is the only layer that knows about
terminals; nothing in the core imports it.
"""

__version__ = "0.1.0"
