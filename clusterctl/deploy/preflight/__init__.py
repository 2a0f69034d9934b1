"""Pre-flight: refuse, before anything starts, an instance vLLM would refuse or that would clash (memory budget, flags, ports, hosts, KV check after start)."""
