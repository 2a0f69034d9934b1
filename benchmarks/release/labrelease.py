"""What the lab release benchmarks share (``surge.py``, ``lab.py``): an inventory of one replica of
the tiny model on GPU 4 of each of the first N lab hosts behind real nginx (``clusterctl gateway``)
on the first host, the CLI run against it, a completion through the gateway, and the clean-up.

The replicas are ``PREFIX-1`` .. ``PREFIX-N`` of the model ``PREFIX-tiny`` on port 8470; the
simulator serves at time scale 0 (requests are instant) and starts at ``startup_scale``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "tests") not in sys.path:
    sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.deploy_lab import remove_deployed, tiny_entry, tiny_model  # noqa: E402

GW_PORT = 8080
PORT = 8470
GPU = 4


class LabRelease:
    """``hosts`` replicas named ``PREFIX-N`` on a running lab; ``gateway``: extra ``gateway:`` keys."""

    def __init__(
        self,
        lab: Any,
        root: Path,
        hosts: int,
        startup_scale: float,
        prefix: str,
        gateway: dict[str, Any] | None = None,
    ) -> None:
        self.lab, self.root, self.prefix = lab, root, prefix
        self.inv_path, self.state_dir = root / "inventory.yaml", root / "state"
        self.hosts = lab.names[:hosts]
        self.gw_host = lab.names[0]
        self.model = f"{prefix}-tiny"
        self.doc = yaml.safe_load(Path(lab.inventory).read_text())
        self.doc["models"] = {self.model: tiny_entry(tiny_model(root), f"/models/{self.model}", served_name=self.model)}
        self.doc.pop("templates", None)
        self.doc["gateway"] = {
            "hosts": self.gw_host,
            "port": GW_PORT,
            **(gateway or {}),
            "sync_interval_s": 1,
            "auth": "none",
        }
        self.startup_scale = startup_scale
        self.url = f"http://{lab.host(self.gw_host).address}:{GW_PORT}"
        self.names = [f"{prefix}-{n}" for n in range(1, hosts + 1)]

    def write(self, max_model_len: int) -> None:
        """The inventory with every replica at ``max_model_len`` (a change restarts every replica)."""
        self.doc["instances"] = {
            name: {
                "model": self.model,
                "engine": "vllm-0.11",
                "placement": f"{h}:{GPU}",
                "port": PORT,
                "args": {"max-model-len": max_model_len},
                "env": {"VLLM_SIM_TIME_SCALE": "0", "VLLM_SIM_STARTUP_SCALE": str(self.startup_scale)},
            }
            for name, h in zip(self.names, self.hosts)
        }
        self.inv_path.write_text(yaml.safe_dump(self.doc, sort_keys=False))

    def cli(self, *args: str, head: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        """``clusterctl ARGS`` (``head``: another command line that takes the CLI's arguments) against the
        inventory and state directory; raises RuntimeError with the output's tail on a non-zero exit."""
        env = {**os.environ, "PYTHONPATH": str(REPO), "CLUSTERCTL_STATE_DIR": str(self.state_dir)}
        res = subprocess.run(
            [
                *(head or [sys.executable, "-m", "clusterctl.cli.main"]),
                *args,
                "-i",
                str(self.inv_path),
                "--state-dir",
                str(self.state_dir),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
            env=env,
        )
        if res.returncode != 0:
            raise RuntimeError(f"{args}: rc {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
        return res

    def complete(self) -> tuple[bool, str]:
        """One one-token completion through the gateway: (ok, the instance that answered or the error)."""
        req = urllib.request.Request(
            self.url + "/v1/completions",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"model": self.model, "prompt": "hi", "max_tokens": 1}).encode(),
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return bool(r.status == 200 and json.loads(r.read()).get("choices")), r.headers.get(
                    "X-Gateway-Instance", ""
                )
        except (urllib.error.URLError, OSError, ValueError) as e:
            return False, f"{type(e).__name__}: {e}"

    def cleanup(self, hosts: list[str] | None = None) -> None:
        """Remove the replicas' units, env files, previous copies and model on ``hosts`` (default: the
        replicas' hosts), and stop nginx on the gateway host."""
        p = self.prefix
        remove_deployed(
            self.lab,
            f"clusterctl-{p}-*.service",
            f"/etc/clusterctl/instances/{p}-*.env "
            f"/var/lib/clusterctl/deploy/previous/{p}-* /models/{self.model} /models/.versions/{self.model}",
            hosts=hosts or self.hosts,
        )
        self.lab.run(self.gw_host, "systemctl disable --now nginx.service", timeout=60)
