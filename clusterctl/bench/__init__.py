"""Load generation and latency statistics for OpenAI-compatible endpoints (``clusterctl bench``)."""
