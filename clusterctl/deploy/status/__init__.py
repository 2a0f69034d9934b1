"""``clusterctl status``: every instance's unit, health, versions, GPUs and load (HTTP reads of vLLM, load score, throughput peaks)."""
