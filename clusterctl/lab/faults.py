"""``lab inject`` / ``lab heal``: network faults here, hardware faults there.

Network faults live in :mod:`clusterctl.lab.netfaults`.  Every other fault
name goes to the simulated hardware's ``clusterctl.lab.hardware.faults``
module, which exposes ``FAULTS: dict[str, callable]`` (and optionally
``heal``); it is imported only when needed, so the lab works without it.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

from clusterctl.errors import LabError
from clusterctl.lab import container, netfaults
from clusterctl.lab import state as st
from clusterctl.lab.config import HostSpec, LabConfig


def _hardware_faults() -> ModuleType | None:
    try:
        from clusterctl.lab.hardware import faults as hwf
    except ImportError:
        return None
    return hwf


def known() -> list[str]:
    """Every fault name ``inject`` accepts."""
    hwf = _hardware_faults()
    return [*netfaults.NET_FAULTS, *sorted(getattr(hwf, "FAULTS", {}) if hwf else {})]


def _call(fn: Any, **available: Any) -> Any:
    """Call ``fn`` with the keyword arguments its signature names (or all with **kw)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**available)
    unknown = [k for k in available if k not in params and k not in _CONTEXT]
    if unknown:
        raise LabError(f"unknown option(s) {', '.join('--' + k.replace('_', '-') for k in unknown)}"
                       f"; this fault takes: "
                       f"{', '.join('--' + p.replace('_', '-') for p in params if p not in _CONTEXT) or 'none'}")
    return fn(**{k: v for k, v in available.items() if k in params})


_CONTEXT = ("host_dir", "name", "index", "lab_dir")


def inject(cfg: LabConfig, h: HostSpec, fault: str, *, rate: str | None = None,
           percent: float | None = None, options: dict[str, Any] | None = None) -> str:
    """Apply ``fault`` to ``h``; return a one-line description of what changed."""
    options = dict(options or {})
    if fault in netfaults.NET_FAULTS:
        if options:
            raise LabError(f"{fault} takes no option(s) {', '.join('--' + k for k in options)}")
        return netfaults.inject(cfg, h, fault, rate=rate, percent=percent)
    hwf = _hardware_faults()
    table = getattr(hwf, "FAULTS", {}) if hwf else {}
    if fault not in table:
        raise LabError(f"unknown fault {fault!r}; known: {', '.join(known())}")
    if rate is not None or percent is not None:
        raise LabError(f"--rate/--percent are network-fault options, not {fault}'s")
    out = _call(table[fault], host_dir=container.host_dir(cfg, h.name), name=h.name,
                index=h.index, lab_dir=cfg.lab_dir, **options)
    return out if isinstance(out, str) else f"{h.name}: {fault} injected"


def heal(cfg: LabConfig, h: HostSpec | None) -> list[str]:
    """Remove every fault from ``h`` (or every host); one line per host healed."""
    state = st.load(cfg.state_file)
    if state is None:
        raise LabError(f"no lab is up in {cfg.lab_dir}")
    hosts = [h] if h is not None else [x.spec for x in state.hosts]
    hwf = _hardware_faults()
    hw_heal = getattr(hwf, "heal", None) if hwf else None
    lines = []
    for x in hosts:
        was = netfaults.heal(cfg, x)
        if hw_heal is not None:
            _call(hw_heal, host_dir=container.host_dir(cfg, x.name), name=x.name,
                  index=x.index, lab_dir=cfg.lab_dir)
        lines.append(f"{x.name}: healed" + (f" ({', '.join(was)})" if was else ""))
    return lines


def host_dir(cfg: LabConfig, name: str) -> Path:
    return container.host_dir(cfg, name)
