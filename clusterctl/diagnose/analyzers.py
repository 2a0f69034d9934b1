"""Imports every analyzer module so that each registers its checks."""

# Analyzer modules are added here as they land (gpu, xid, oom, serving, tp, roce, qos).
from clusterctl.diagnose import baseline, gpu, oom, reach, serving, tp, xid  # noqa: F401,E402
from clusterctl.diagnose import datanet, dcgm, instances, linkflap, nccl, qos, roce  # noqa: F401,E402
from clusterctl.diagnose import nodeprep, pd, pdrouter  # noqa: F401,E402
