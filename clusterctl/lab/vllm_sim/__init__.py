"""A vLLM simulator for lab hosts (no GPU, no vLLM): ``vllm serve`` with vLLM's flags,
memory arithmetic against the fake NVML GPUs, log lines, endpoints and metrics.

Stdlib only and relative imports only: the package is copied into lab hosts as
``vllm_sim`` (see :mod:`.install`) and runs there with Debian's python3.
Docs: docs/vllm-simulator.md.
"""
