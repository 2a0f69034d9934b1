"""Faults of a running simulator, switched through a control endpoint on loopback only.

``POST /sim/fault`` with a JSON body, from 127.0.0.0/8 or ::1 (others get 403)::

    {"fault": "death"}                 engine death: /health 503, in-flight requests fail,
                                       the server exits 1 after the watchdog (as SIGUSR1)
    {"fault": "hang"}                  steps stop completing (requests stall, tokens stop),
                                       /health stays 200, until the execute timeout
                                       (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 300 s, scaled)
                                       kills the engine
    {"fault": "tp_rank_lost", "rank": 1}
                                       one TP worker is gone: the other ranks wait in their
                                       collective (a hang as above); with TP 1, a death
    {"fault": "slowdown", "factor": 3} every step takes ``factor`` times longer (1 = normal)
    {"fault": "leak"}                  context leakage: each new request first copies words
                                       of the previous request's prompt (another session's)
    {"fault": "clear"}                 hang, slowdown and leak off (death is final)

``GET /sim/fault`` returns the current state.  Answers: 200 with the state,
400 naming a bad field, 403 from a non-loopback address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass
from typing import Any

NAMES = ("death", "hang", "tp_rank_lost", "slowdown", "leak", "clear")


class FaultError(ValueError):
    """A bad control request (the message names the field)."""


@dataclass
class Faults:
    dead: bool = False
    hang: bool = False
    lost_rank: int | None = None
    slowdown: float = 1.0
    leak: bool = False

    def stalled(self) -> bool:
        """Steps do not complete (hang or a lost TP rank)."""
        return self.hang or self.lost_rank is not None

    def state(self) -> dict[str, Any]:
        return asdict(self)

    def apply(self, body: Any, tp: int) -> str | None:
        """Apply a control request; returns a log message for the engine's log, if any."""
        if not isinstance(body, dict) or body.get("fault") not in NAMES:
            raise FaultError(f"'fault' must be one of {', '.join(NAMES)}")
        name = body["fault"]
        if name == "death":
            self.dead = True
        elif name == "hang":
            self.hang = True
        elif name == "tp_rank_lost":
            rank = body.get("rank", tp - 1)
            if not isinstance(rank, int) or not 0 <= rank < tp:
                raise FaultError(f"'rank' must be an integer in 0..{tp - 1}")
            if tp == 1:
                self.dead = True
            else:
                self.lost_rank = rank
            return f"Worker_TP{rank} died unexpectedly"
        elif name == "slowdown":
            f = body.get("factor")
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1000:
                raise FaultError("'factor' must be a number in (0, 1000]")
            self.slowdown = float(f)
        elif name == "leak":
            self.leak = True
        else:
            self.hang, self.lost_rank, self.slowdown, self.leak = False, None, 1.0, False
        return None


def is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
