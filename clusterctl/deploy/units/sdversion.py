"""The oldest systemd our instance units run on, and a check of a unit against a version.

Every directive the unit template can emit is listed in
:data:`DIRECTIVE_MIN_SYSTEMD` with the first systemd release that accepts it
(in that section, with that value where the value matters).  The supported
minimum, :data:`MIN_SYSTEMD`, is the largest of them: **230**, set by
``StartLimitIntervalSec=``/``StartLimitBurst=`` in ``[Unit]`` (moved there from
``[Service]`` and renamed in systemd 230).  That covers Ubuntu 18.04 (237),
RHEL/Rocky 8 (239), Debian 10 (241) and everything newer.  ``Type=exec``
(240) is deliberately not used: it would drop RHEL 8, and without
``sd_notify`` from vLLM it adds nothing the readiness poll does not see.

A directive that is missing from the table is reported too, so adding one to
the template without stating its version fails the unit tests.
"""

from __future__ import annotations

#: Older than any systemd this table distinguishes (CentOS 7 ships 219).
BASELINE = 219

#: (section, directive) or (section, "directive=value") -> first systemd version.
DIRECTIVE_MIN_SYSTEMD: dict[tuple[str, str], int] = {
    ("Unit", "Description"): BASELINE,
    ("Unit", "Documentation"): BASELINE,
    ("Unit", "After"): BASELINE,
    ("Unit", "Wants"): BASELINE,
    ("Unit", "StartLimitIntervalSec"): 230,
    ("Unit", "StartLimitBurst"): 230,
    ("Service", "Type=simple"): BASELINE,
    ("Service", "User"): BASELINE,
    ("Service", "EnvironmentFile"): BASELINE,
    ("Service", "Environment"): BASELINE,
    ("Service", "ExecStartPre"): BASELINE,
    ("Service", "ExecStart"): BASELINE,
    ("Service", "Restart"): BASELINE,
    ("Service", "RestartSec"): BASELINE,
    # emitted only for hosts whose systemd has them (units.policy_for_systemd)
    ("Service", "RestartSteps"): 254,
    ("Service", "RestartMaxDelaySec"): 254,
    ("Service", "TimeoutStartSec"): BASELINE,
    ("Service", "TimeoutStopSec"): BASELINE,
    ("Service", "KillSignal"): BASELINE,
    ("Service", "KillMode=mixed"): BASELINE,  # 209
    ("Service", "LimitMEMLOCK"): BASELINE,
    ("Service", "LimitNOFILE"): BASELINE,
    ("Service", "NoNewPrivileges"): BASELINE,  # 187
    ("Service", "SyslogIdentifier"): BASELINE,
    ("Install", "WantedBy"): BASELINE,
}

#: Value-specific entries: these directives are looked up as ``directive=value``.
_BY_VALUE = {("Service", "Type"), ("Service", "KillMode")}

#: Directives emitted only where the host's systemd has them (not part of the supported minimum).
PER_HOST = {("Service", "RestartSteps"), ("Service", "RestartMaxDelaySec")}

MIN_SYSTEMD = max(v for k, v in DIRECTIVE_MIN_SYSTEMD.items() if k not in PER_HOST)


def unit_directives(unit_text: str) -> list[tuple[str, str, str]]:
    """``(section, key, value)`` for every assignment, continuation lines joined.

    Comments (``#``/``;``) and blank lines are skipped; ``X-`` sections are
    included (systemd ignores them, callers may not).
    """
    out: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for raw in unit_text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if sep:
            out.append((section, key.strip(), value.strip()))
    return out


def check_unit_against_systemd(unit_text: str, version: int) -> list[str]:
    """Problems running ``unit_text`` on systemd ``version``; empty when it is fine.

    Each message names the directive, its section and the version it needs;
    directives not in :data:`DIRECTIVE_MIN_SYSTEMD` are reported as unknown
    (their support cannot be vouched for).  ``X-`` sections are ignored, as
    systemd ignores them.
    """
    problems: list[str] = []
    for section, key, value in unit_directives(unit_text):
        if section.startswith("X-"):
            continue
        lookup = f"{key}={value}" if (section, key) in _BY_VALUE else key
        need = DIRECTIVE_MIN_SYSTEMD.get((section, lookup))
        if need is None:
            problems.append(
                f"[{section}] {lookup}: not in the supported-directive table "
                "(clusterctl.deploy.units.sdversion); its minimum systemd version is unknown"
            )
        elif need > version:
            problems.append(f"[{section}] {lookup} needs systemd >= {need}; this host has {version}")
    return problems
