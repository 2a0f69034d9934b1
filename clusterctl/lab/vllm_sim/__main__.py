"""``python3 -m clusterctl.lab.vllm_sim serve ...`` (or ``-m vllm_sim`` on lab hosts)."""

import sys

from .cli import main

sys.exit(main())
