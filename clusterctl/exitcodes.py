"""Exit codes, part of the command-line interface.

Monitoring commands (``doctor``, ``report``, ``ping``, ``facts``) follow the
Nagios/Icinga plugin convention, so monitoring systems understand them:

====  =========  ============================================================
code  name       meaning
====  =========  ============================================================
0     OK         every check passed / every host answered
1     WARN       at least one warning, nothing worse
2     CRIT       at least one critical finding / failed host
3     UNKNOWN    could not check: usage error, bad configuration, bad input
====  =========  ============================================================

Usage and configuration errors exit 3 for *every* command (click's default of
2 would read as CRIT to a monitoring system).  ``exec`` exits with the worst
remote return code, or 255 when any host could not be reached (as ``ssh``).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    WARN = 1
    CRIT = 2
    UNKNOWN = 3


USAGE_ERROR = ExitCode.UNKNOWN
#: ``exec``: at least one host could not be reached or authenticated (as ssh).
UNREACHABLE = 255
#: Interrupted by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130
