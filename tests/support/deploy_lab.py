"""What the deploy-family lab tests share: the tiny model and removing what a test deployed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from clusterctl.lab import workload
from clusterctl.lab.vllm_sim import synth


def tiny_model(root: Path) -> Path:
    """The tiny synthetic model (real bytes, about 6.6 MB) under ``root/tiny``, made on this machine."""
    out = root / "tiny"
    synth.write_model(workload.ARCH, out)
    return out


def tiny_entry(model_dir: Path, path: str, served_name: str = "tiny", version: str = "v1") -> dict[str, Any]:
    """The inventory ``models:`` entry of the tiny model at ``path`` on the hosts."""
    return workload.model_entry(model_dir, version, path=path, served_name=served_name)


def remove_deployed(lab: Any, units: str, files: str, hosts: Sequence[str] | None = None) -> None:
    """On ``hosts`` (default: every lab host): disable and stop the ``units`` glob (e.g.
    ``clusterctl-sc-*.service``), remove their unit files and ``files`` (space-separated
    paths, globs allowed), reload systemd."""
    for host in lab.names if hosts is None else hosts:
        lab.run(
            host,
            f"for u in $(systemctl list-unit-files '{units}' --no-legend | awk '{{print $1}}'); "
            f"do systemctl disable --now $u; done; rm -f /etc/systemd/system/{units}; rm -rf {files}; "
            f"systemctl daemon-reload; systemctl reset-failed '{units}'",
            timeout=120,
        )
