"""``lab inject`` / ``lab heal``: network faults here, hardware faults there.

Network faults live in :mod:`clusterctl.lab.netfaults`.  Every other fault
name goes to the simulated hardware's ``clusterctl.lab.hardware.faults``
module (``FAULTS``, ``parse_options``, ``inject``, ``heal``); it is
imported only when needed, so the network faults work without it.
"""

from __future__ import annotations

from types import ModuleType

from clusterctl.errors import LabError
from clusterctl.lab import container, netfaults
from clusterctl.lab import state as st
from clusterctl.lab.config import HostSpec, LabConfig
from clusterctl.lab.hardware import faults as hardware_faults


def _hardware_faults() -> ModuleType | None:
    return hardware_faults


def known() -> list[str]:
    """Every fault name ``inject`` accepts."""
    hwf = _hardware_faults()
    return [*netfaults.NET_FAULTS, *sorted(getattr(hwf, "FAULTS", {}) if hwf else {})]


def inject(
    cfg: LabConfig,
    h: HostSpec,
    fault: str,
    *,
    rate: str | None = None,
    percent: float | None = None,
    options: list[str] | None = None,
) -> str:
    """Apply ``fault`` to ``h``; return a one-line description of what changed.

    ``options`` are ``key=value`` strings for a hardware fault (typed by the
    fault's own defaults); network faults take ``rate``/``percent`` instead.
    """
    options = list(options or [])
    if fault in netfaults.NET_FAULTS:
        if options:
            raise LabError(f"{fault} takes no option(s) {' '.join(options)}")
        return netfaults.inject(cfg, h, fault, rate=rate, percent=percent)
    hwf = _hardware_faults()
    if hwf is None or fault not in hwf.FAULTS:
        raise LabError(f"unknown fault {fault!r}; known: {', '.join(known())}")
    if rate is not None or percent is not None:
        raise LabError(f"--rate/--percent are network-fault options, not {fault}'s")
    opts = hwf.parse_options(fault, options)
    msg = str(hwf.inject(container.host_dir(cfg, h.name), fault, **opts))
    return msg if msg.startswith(f"{h.name}:") else f"{h.name}: {msg}"


def heal(cfg: LabConfig, h: HostSpec | None) -> list[str]:
    """Remove every fault from ``h`` (or every host); one line per host healed."""
    state = st.load(cfg.state_file)
    if state is None:
        raise LabError(f"no lab is up in {cfg.lab_dir}")
    hosts = [h] if h is not None else [x.spec for x in state.hosts]
    hwf = _hardware_faults()
    lines = []
    for x in hosts:
        was = netfaults.heal(cfg, x)
        hd = container.host_dir(cfg, x.name)
        if hwf is not None and (hd / "hw").is_dir():
            hwf.heal(hd)
        lines.append(f"{x.name}: healed" + (f" ({', '.join(was)})" if was else ""))
    return lines
