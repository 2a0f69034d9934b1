"""``clusterctl engine install`` / ``engine remove``: pinned vLLM releases side by side, one virtualenv each.

The inventory's ``engines.NAME`` says the executable (``path``, e.g.
``/opt/vllm-0.11.0/bin/vllm``) and the ``version``; the virtualenv is the
directory two levels up (:func:`~clusterctl.bringup.engines.venv_root`).

* **plan**: one read per host (``engine list``'s :func:`~clusterctl.bringup.engines.read_command`):
  already installed with that version -> ``unchanged``; missing -> ``install``;
  anything else at the path (another version, no recorded version, not
  executable) is an error row: install never touches an existing engine.
  For ``remove``: present -> ``remove``, unless a ``clusterctl-*.service``
  unit's ``ExecStart=`` runs the path (an error row naming the units); absent
  -> ``unchanged``.
* **install** (:func:`install_script`, root ``sh`` on the node): ``python3 -m
  venv`` into a temp directory beside the path, ``pip install vllm==VERSION``
  from the wheelhouse shipped on stdin (a tar: ``--no-index --find-links``) or
  from an index URL (read from stdin: never on a command line), the venv's
  scripts pointed at the final path, checks (the ``vllm-VERSION.dist-info``
  version is the inventory's, ``import vllm`` works, the executable is there),
  then one ``rename`` to the path.  A killed install leaves only the temp
  directory (removed by the next install), never a half venv at the path.
* **remove** (:func:`remove_script`): only a virtualenv (``pyvenv.cfg``) whose
  engine no unit runs (checked again on the node); renamed aside, then deleted.

Hosts go in batches (``--serial``, ``--max-fail-percentage``) with
:func:`~clusterctl.bringup.batch.run_batches`; each changed host is read again.
Nothing here prints.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import tarfile
from typing import Any, Callable, Sequence

from clusterctl.bringup.batch import ApplyReport, HostOutcome, recheck_outcome, run_batches, settle
from clusterctl.bringup.engines import UNITS_DIR, EngineRow, parse_read, read_command, venv_root
from clusterctl.bringup.nodesetup import Change, HostPlan
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.factory import FleetFactory
from clusterctl.fleet.shell import quote
from clusterctl.inventory.model import Engine, Host, Inventory

OnEvent = Callable[[str, str, "str | None"], None]

#: Largest wheelhouse shipped over SSH stdin (held in memory here), as staging's push.
MAX_WHEELHOUSE_BYTES = 2 * 1024**3
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9_.+/-]+$")
_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+_-]*$")
#: Paths whose parent an engine's venv may never be (a path like /usr/bin/vllm has venv root /usr).
_SYSTEM_ROOTS = {
    "/",
    "/usr",
    "/usr/local",
    "/opt",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/etc",
    "/var",
    "/home",
    "/root",
    "/srv",
    "/boot",
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/tmp",
}


def check_engine(e: Engine) -> str:
    """The engine's venv root, or ClusterctlError when its path or version is not one install can own."""
    root = venv_root(e.path)
    if (
        not _PLAIN_PATH.match(e.path)
        or ".." in e.path.split("/")
        or root in _SYSTEM_ROOTS
        or posixpath.basename(posixpath.dirname(e.path)) != "bin"
    ):
        raise ClusterctlError(
            f"engine {e.name}: path {e.path!r} is not ROOT/bin/EXECUTABLE under a directory of "
            "its own (e.g. /opt/vllm-0.11.0/bin/vllm): install and remove own ROOT"
        )
    if not _VERSION.match(e.version):
        raise ClusterctlError(f"engine {e.name}: version {e.version!r} is not a release (e.g. 0.11.0)")
    return root


def _release(v: str) -> tuple[int, ...] | None:
    parts = v.split("+", 1)[0].split(".")
    if not all(p.isdigit() for p in parts):
        return None
    nums = [int(p) for p in parts]
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    return tuple(nums)


def wheelhouse(directory: str, version: str) -> bytes:
    """The wheelhouse's files (top level, as ``pip --find-links`` reads them) as a tar for a node's stdin.

    Raises ClusterctlError for a directory that is not one, holds no vLLM wheel of ``version``
    (``vllm-0.11.0-...whl``, release compared as pip does: 0.11 is 0.11.0) or is too large."""
    if not os.path.isdir(directory):
        raise ClusterctlError(f"--wheels {directory}: not a directory")
    names = sorted(
        n
        for n in os.listdir(directory)
        if os.path.isfile(os.path.join(directory, n)) and n.endswith((".whl", ".tar.gz", ".zip"))
    )
    want = _release(version)
    vllm = [
        n
        for n in names
        if n.endswith(".whl")
        and n.split("-")[0].lower() == "vllm"
        and (n.split("-")[1] == version or (want is not None and _release(n.split("-")[1]) == want))
    ]
    if not vllm:
        raise ClusterctlError(
            f"--wheels {directory}: no vllm wheel of version {version} (vllm-{version}-*.whl) among {len(names)} files"
        )
    total = sum(os.path.getsize(os.path.join(directory, n)) for n in names)
    if total > MAX_WHEELHOUSE_BYTES:
        raise ClusterctlError(
            f"--wheels {directory}: {total} bytes, more than the {MAX_WHEELHOUSE_BYTES} "
            "shipped over SSH; use --index-url with a local mirror"
        )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for n in names:
            info = tar.gettarinfo(os.path.join(directory, n), arcname=n)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with open(os.path.join(directory, n), "rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


# --------------------------------------------------------------- scripts

_PRELUDE = """set -u
umask 022
fail() { echo "failed: $*" >&2; exit 1; }
"""


#: Seconds ``vllm --version`` may take on a node (the real CLI imports torch: 96 s measured for the CPU
#: build on this 2-CPU machine under load).
VERSION_TIMEOUT_S = 300


def _lock() -> str:
    """Shell lines taking the lock of the engine's parent directory (flock on the directory itself,
    fd 9, held until the script exits; nothing left behind): a second install or remove under the
    same parent on the host is refused, so two runs never build or delete the same venv at once."""
    return "\n".join(
        [
            'exec 9<"$parent" || fail "open $parent"',
            'if command -v flock >/dev/null 2>&1; then flock -n 9 || fail "another clusterctl engine install or remove '
            'under $parent is running on this host"; fi',
        ]
    )


def install_script(e: Engine, source: str, version_timeout: float = VERSION_TIMEOUT_S) -> str:
    """Root ``sh`` installing ``e`` (module doc); ``source``: ``wheels`` (a tar on stdin) or ``index``
    (the index URL as stdin's first line)."""
    root = check_engine(e)
    exe = posixpath.relpath(e.path, root)
    parent, base = posixpath.dirname(root), posixpath.basename(root)
    if source == "wheels":
        fetch = (
            'mkdir "$tmp/.wheelhouse" && tar -x -C "$tmp/.wheelhouse" -f - || fail "unpack the wheelhouse"\n'
            'src="--no-index --find-links $tmp/.wheelhouse"\n'
        )
    else:
        fetch = 'IFS= read -r PIP_INDEX_URL || fail "no index URL on stdin"\nexport PIP_INDEX_URL\nsrc=\n'
    return "\n".join(
        [
            "#!/bin/sh",
            f"# clusterctl engine install {e.name}",
            _PRELUDE,
            f"root={quote(root)}; parent={quote(parent)}; want={quote(e.version)}",
            'mkdir -p "$parent" || fail "mkdir $parent"',
            _lock(),
            "[ -e \"$root\" ] && fail \"$root exists: not touched\"",
            f"rm -rf \"$parent\"/.{quote(base)}.clusterctl-tmp.*  # what killed installs left",
            f"tmp=\"$parent/.{base}.clusterctl-tmp.$$\"",
            "trap 'rm -rf \"$tmp\"' EXIT",
            "nopip=",
            "# no ensurepip (Debian without python3-venv): a venv without pip, pip bootstrapped from the wheelhouse",
            'python3 -m venv "$tmp" >/dev/null 2>&1 || { rm -rf "$tmp"; nopip=1; python3 -m venv --without-pip "$tmp" >&2 '
            '|| fail "python3 -m venv"; }',
            fetch.rstrip("\n"),
            'if [ -n "$nopip" ]; then w=""; for f in "$tmp"/.wheelhouse/pip-*.whl; do [ -f "$f" ] && w=$f; done',
            '  [ -n "$w" ] || fail "python3 -m venv has no ensurepip here (install python3-venv, or put a pip-*.whl in '
            'the wheelhouse)"',
            '  "$tmp/bin/python" "$w/pip" install -q --disable-pip-version-check --no-cache-dir --no-index "$w" >&2 '
            '|| fail "bootstrap pip from $(basename "$w")"; fi',
            '"$tmp/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir $src "vllm==$want" >&2 '
            '|| fail "pip install vllm==$want"',
            'rm -rf "$tmp/.wheelhouse"',
            "# the venv's scripts name the temp directory: point them at the final path",
            'for f in "$tmp"/bin/*; do [ -f "$f" ] && [ ! -L "$f" ] && grep -qIF "$tmp" "$f" && '
            '{ sed -i "s|$tmp|$root|g" "$f" || fail "rewrite $f"; }; done',
            'got=""; for d in "$tmp"/lib/python3*/site-packages/vllm-*.dist-info; do [ -d "$d" ] && '
            'got=$(basename "$d" .dist-info) && got=${got#vllm-}; done',
            '[ "$got" = "$want" ] || case "$got" in "$want"+*) ;; *) fail "installed vllm is ${got:-none}, '
            'wanted $want";; esac',
            '"$tmp/bin/python" -c "import vllm" >&2 || fail "import vllm"',
            f"[ -x \"$tmp\"/{quote(exe)} ] || fail \"no executable {exe} in the venv\"",
            "# `vllm --version` through the venv's interpreter (its first line names ROOT, not there yet)",
            f"said=$(timeout {int(version_timeout)} \"$tmp/bin/python\" \"$tmp\"/{quote(exe)} --version 2>/dev/null); vrc=$?",
            f"[ $vrc -eq 124 ] && fail \"{exe} --version did not answer within {int(version_timeout)} s\"",
            f"[ $vrc -eq 0 ] || fail \"{exe} --version failed (exit $vrc)\"",
            'said=$(printf "%s\\n" "$said" | tail -n 1)',
            '[ "$said" = "$got" ] || fail "vllm --version says ${said:-nothing}, the installed vllm is $got"',
            'mv -T "$tmp" "$root" || fail "rename to $root"',
            "trap - EXIT",
            'echo "installed $root $got"',
            "",
        ]
    )


def remove_script(e: Engine, units_dir: str = UNITS_DIR) -> str:
    """Root ``sh`` removing ``e``'s virtualenv unless a unit runs it (checked here again)."""
    root = check_engine(e)
    parent, base = posixpath.dirname(root), posixpath.basename(root)
    return "\n".join(
        [
            "#!/bin/sh",
            f"# clusterctl engine remove {e.name}",
            _PRELUDE,
            f"root={quote(root)}; path={quote(e.path)}; parent={quote(parent)}",
            '[ -d "$parent" ] || { echo "absent $root"; exit 0; }',
            _lock(),
            '[ -e "$root" ] || { echo "absent $root"; exit 0; }',
            '[ -f "$root/pyvenv.cfg" ] || fail "$root is not a virtualenv (no pyvenv.cfg): not removed"',
            f"for u in {quote(units_dir)}/clusterctl-*.service; do [ -f \"$u\" ] || continue; "
            "grep -q \"^ExecStart=$path \" \"$u\" && fail \"$(basename \"$u\") runs $path\"; done",
            f"gone=\"$parent/.{base}.clusterctl-rm.$$\"",
            'mv -T "$root" "$gone" || fail "rename $root"',
            'rm -rf "$gone" || fail "delete $gone"',
            'echo "removed $root"',
            "",
        ]
    )


# ------------------------------------------------------------------ plan


def _what(row: EngineRow) -> str:
    return f"{row.state}, version {row.version or 'not recorded'}"


def install_plan(row: EngineRow) -> HostPlan:
    p = HostPlan(row.host)
    if row.state == "unread":
        p.error = row.error or "not read"
    elif row.state == "missing":
        p.changes.append(Change(f"{row.engine} {row.path}", "missing", f"installed (vllm {row.wanted_version})"))
    elif row.state == "installed" and row.version_matches:
        pass
    else:
        p.error = (
            f"{row.path}: {_what(row)}, not vllm {row.wanted_version}: not touched (an engine path is per "
            f"version; `clusterctl engine remove {row.engine}` first if it is yours)"
        )
    return p


def remove_plan(row: EngineRow) -> HostPlan:
    p = HostPlan(row.host)
    if row.state == "unread":
        p.error = row.error or "not read"
    elif row.units:
        p.refused = True
        p.error = (
            f"{row.path} is used by "
            + ", ".join(f"{u} ({a})" for u, a in row.units)
            + ": not removed (remove or redeploy those instances first)"
        )
    elif row.state != "missing":
        p.changes.append(Change(f"{row.engine} {venv_root(row.path)}", _what(row), "removed"))
    return p


# ------------------------------------------------------------------- run


class EngineOp:
    """Plan and run ``engine install`` (``wheels`` or ``index_url``) or ``engine remove`` of one engine."""

    def __init__(
        self,
        inventory: Inventory,
        engine_name: str,
        hosts: Sequence[Host],
        make_fleet: FleetFactory,
        *,
        remove: bool = False,
        wheels: str | None = None,
        index_url: str | None = None,
        serial: Sequence[str] = ("1",),
        max_fail_percentage: float = 0.0,
        sudo: bool = True,
        install_timeout: float = 1800.0,
        units_dir: str = UNITS_DIR,
        on_event: OnEvent | None = None,
    ) -> None:
        if engine_name not in inventory.engines:
            raise ClusterctlError(
                f"{inventory.path}: no engine {engine_name} in the inventory's engines "
                f"(it has {', '.join(inventory.engines) or 'none'})"
            )
        self.engine = inventory.engines[engine_name]
        check_engine(self.engine)
        self.remove = remove
        if wheels is not None and index_url is not None:
            raise ClusterctlError("engine install takes one of --wheels and --index-url")
        self.wheels, self.index_url = wheels, index_url
        self._payload: bytes | None = None
        if wheels is not None and not remove:
            self._payload = wheelhouse(wheels, self.engine.version)
        self.hosts = list(hosts)
        self.by_name = {h.name: h for h in self.hosts}
        self.make_fleet = make_fleet
        self.serial = list(serial) or ["1"]
        self.max_fail = max_fail_percentage
        self.sudo = sudo
        self.install_timeout = install_timeout
        self.units_dir = units_dir
        self.on_event = on_event or (lambda kind, msg, host: None)

    def _rows(self, fleet: Any, hosts: Sequence[Host]) -> dict[str, EngineRow]:
        out: dict[str, EngineRow] = {}
        e = self.engine
        for r in fleet.run(read_command([e], self.units_dir), sudo=self.sudo, timeout=30):
            if r.ok:
                out[r.host] = parse_read(r.host, [e], r.stdout)[0]
            else:
                why = r.error or (r.stderr or "").strip()[-200:] or f"exit {r.rc}"
                out[r.host] = EngineRow(r.host, e.name, e.path, e.version, "unread", error=why)
        return out

    def _plans(self, fleet: Any, hosts: Sequence[Host]) -> list[HostPlan]:
        rows = self._rows(fleet, hosts)
        make = remove_plan if self.remove else install_plan
        return [
            make(
                rows.get(h.name)
                or EngineRow(
                    h.name, self.engine.name, self.engine.path, self.engine.version, "unread", error="no result"
                )
            )
            for h in hosts
        ]

    def plan(self) -> list[HostPlan]:
        verb = "remove" if self.remove else "install"
        self.on_event("phase", f"reading engine {self.engine.name} on {len(self.hosts)} hosts ({verb})", None)
        with self.make_fleet(self.hosts) as fleet:
            return self._plans(fleet, self.hosts)

    def run(self, plans: list[HostPlan] | None = None) -> ApplyReport:
        if not self.remove and self.wheels is None and self.index_url is None:
            raise ClusterctlError(
                "engine install needs one of --wheels DIR (offline: shipped over SSH) "
                "or --index-url URL (hosts with network)"
            )
        plans = self.plan() if plans is None else plans
        return run_batches(
            plans, [h.name for h in self.hosts], self.serial, self.max_fail, self._apply_batch, self.on_event
        )

    def _apply_batch(self, plans: list[HostPlan], n: int) -> list[HostOutcome]:
        hosts = [self.by_name[p.host] for p in plans]
        out: dict[str, HostOutcome] = {}
        if self.remove:
            script, stdin = remove_script(self.engine, self.units_dir), None
        elif self._payload is not None:
            script, stdin = install_script(self.engine, "wheels"), self._payload
        else:
            script, stdin = install_script(self.engine, "index"), (self.index_url or "").encode() + b"\n"
        with self.make_fleet(hosts) as fleet:
            for row in fleet.run(
                "sh -c " + quote(script),
                stdin=stdin,
                sudo=self.sudo,
                timeout=60 if self.remove else self.install_timeout,
            ):
                if not row.ok:
                    detail = [
                        ln[len("failed: ") :]
                        for ln in (row.stderr or "").strip().splitlines()
                        if ln.startswith("failed: ")
                    ] or (row.stderr or "").strip().splitlines()[-3:]
                    out[row.host] = HostOutcome(
                        row.host, "failed", error=row.error or "; ".join(detail) or f"exit {row.rc}", batch=n
                    )
            ok_hosts = [h for h in hosts if h.name not in out]
            if ok_hosts:
                for p in self._plans(fleet, ok_hosts):  # read again: the engine list must now agree
                    out[p.host] = recheck_outcome(p, n)
        return settle(plans, out, self.on_event)
