"""The one way a node program travels: :func:`build` makes it, :func:`run` runs it.

Every program in ``clusterctl/node/`` that clusterctl runs on a host goes through here
(the probe, deploy's node program, pre-flight's reader, the ``collect`` bundle, the
gateway's node program, staging with its relay):

* :func:`build` turns a program's sources into one :class:`Program`: the bytes the node's
  ``python3`` runs and their sha256 (the name of the copy in the node cache).  A program of
  one file travels as that file (constants the control side passes, such as the bundle's
  ``PROBE_PAYLOAD``, in front as ``NAME = value`` lines).  A program with modules of its own
  (staging's package) or modules it carries (the probe's pynvml) travels as a bootstrap in
  syntax every Python 3 parses: an interpreter older than 3.8 exits :data:`RC_PYTHON_TOO_OLD`
  with a message; each module is packed (zlib + base64) with its compiled code (marshalled,
  as in a .pyc), which a node whose Python writes the same bytecode (:data:`CODE_TAG`) loads
  instead of compiling; package modules are compiled only when first imported.  Nothing is
  written on the node for it.
* :func:`run` runs it on a fleet through the node cache (:mod:`clusterctl.fleet.cached`): a
  short loader on the command line runs the verified cached copy; only hosts without one get
  the program on stdin (verified, stored, run).  A job (which may hold secrets: env files,
  API keys, source credentials) goes on stdin, never on a command line.

* :func:`installed` builds the node programs that systemd runs from a file (``check-gpus``,
  ``verify-model``: units' ``ExecStartPre``; ``pin-model``: a transient unit), the same way;
  :func:`install_script` (POSIX sh, deploy's node set-up) and :func:`install_job` (a node
  program's job: staging writes ``verify-model`` and ``pin-model``) write such a program as a
  file: its sha256 checked on the node before it is put in place, and written only when the
  file there does not already have it.

The nodes' minimum Python is checked for all of it in one test
(``tests/unit/node/test_node_programs.py``: each program built here, run through the loader,
the installed ones run as the files written from the builder's output).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import marshal
import sys
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from clusterctl import node
from clusterctl.fleet.cached import run_cached
from clusterctl.fleet.results import RunResults
from clusterctl.fleet.shell import quote

if TYPE_CHECKING:
    from clusterctl.fleet.fleet import Fleet

#: Exit status of a bootstrap (and of the loader) when the node's python3 is older than 3.8.
RC_PYTHON_TOO_OLD = 97

#: The bytecode this Python writes (implementation, magic number as in .pyc files).
CODE_TAG = (sys.implementation.name, importlib.util.MAGIC_NUMBER.hex())


@dataclass(frozen=True)
class Program:
    """A node program as shipped: ``data`` (what the node's python3 runs) and its sha256 ``digest``."""

    name: str
    data: bytes
    digest: str

    def __len__(self) -> int:
        return len(self.data)

    @property
    def text(self) -> str:
        return self.data.decode("ascii")


def pack(source: bytes) -> str:
    """``source`` zlib-compressed and base64-encoded (what a bootstrap carries)."""
    return base64.b64encode(zlib.compress(source, 9)).decode("ascii")


def pack_code(source: bytes, filename: str) -> str:
    """``source`` compiled here and marshalled, for a node whose Python has the same
    :data:`CODE_TAG` (what a .pyc holds): that node skips the compile (about 35 ms of CPU
    for pynvml).  Marshal format 2 has no refcount-dependent references, so the bytes are
    the same on every build.  "" when it does not compile."""
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError:
        return ""
    return pack(marshal.dumps(code, 2))


_HEAD = '''\
import sys
if sys.version_info < (3, 8):
    sys.stderr.write("clusterctl %(label)s: python %%s is too old, 3.8 or newer is needed\\n"
                     %% sys.version.split()[0])
    sys.exit(%(rc)d)
import binascii, zlib
_CODE_TAG = %(code_tag)r
def _code(packed_code, packed_source, filename):
    try:
        from _frozen_importlib_external import MAGIC_NUMBER
        if packed_code and [sys.implementation.name, MAGIC_NUMBER.hex()] == _CODE_TAG:
            import marshal
            return marshal.loads(zlib.decompress(binascii.a2b_base64(packed_code)))
    except Exception:
        pass
    return compile(zlib.decompress(binascii.a2b_base64(packed_source)), filename, "exec")
'''

_CARRIED = '''\
def _carried_%(name)s():
    mod = type(sys)(%(name)r)
    mod.__file__ = %(file)r
    sys.modules[%(name)r] = mod
    exec(_code(_%(var)s_CODE, _%(var)s, mod.__file__), mod.__dict__)
    return mod
'''

# Package modules are compiled when first imported (a finder on sys.meta_path), so a job that
# never needs one does not pay for it.  Only names every Python 3.8+ has: type(sys) is
# ModuleType, type(sys.__spec__) ModuleSpec.
_PACKAGE = '''\
_P = %(package)r
_S = %(table)s
class _L:
    @staticmethod
    def create_module(spec):
        return None
    @staticmethod
    def exec_module(m):
        packed_code, packed_source, m.__file__ = _S[m.__name__[len(_P) + 1:]]
        exec(_code(packed_code, packed_source, m.__file__), m.__dict__)
class _F:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.startswith(_P + ".") and name[len(_P) + 1:] in _S:
            return type(sys.__spec__)(name, _L)
        return None
sys.meta_path.insert(0, _F)
_pkg = type(sys)(_P); _pkg.__path__ = []; _pkg.__package__ = _P; sys.modules[_P] = _pkg
'''


def _var(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).upper()


def build(
    name: str,
    main: bytes | None = None,
    *,
    constants: Mapping[str, object] | None = None,
    carried: Mapping[str, tuple[bytes, str | None]] | None = None,
    package: tuple[str, Mapping[str, bytes]] | None = None,
    label: str | None = None,
    compiled: bool = True,
) -> Program:
    """The one builder of what a node runs.

    ``main``: the program's source, run as ``__main__`` (default: ``clusterctl/node/NAME.py``).
    ``constants``: globals the program finds set (``repr`` of each value, in front of it).
    ``carried``: modules ``NAME -> (source, version)`` the program may build when the node has
    no copy of its own, through the globals ``CARRIED_NAME()`` and ``CARRIED_NAME_VERSION``
    (the probe's pynvml).  ``package``: ``(PACKAGE, {module: source})`` rebuilt on the node as
    the package ``PACKAGE`` (compiled when imported); the program is then ``PACKAGE.main``'s
    ``main()``, its return value the exit status (``main`` unused).  ``label``: the name in the
    too-old message (default ``name``).  ``compiled``: package modules also travel compiled
    (staging's package would be 3.3x the size with its code; its modules compile in ms).
    """
    if main is None and package is None:
        main = node.path(name).read_bytes()
    consts = "".join(f"{k} = {v!r}\n" for k, v in (constants or {}).items())
    if not carried and package is None:
        assert main is not None
        data = consts.encode("ascii") + main
        return Program(name, data, hashlib.sha256(data).hexdigest())
    parts = [_HEAD % {"label": label or name, "rc": RC_PYTHON_TOO_OLD, "code_tag": list(CODE_TAG)}, consts]
    extra: list[str] = []
    for mod, (source, version) in (carried or {}).items():
        var = _var(mod)
        filename = f"<{mod} {version or 'unknown'} carried by clusterctl>"
        parts.append(f"_{var} = {pack(source)!r}\n_{var}_CODE = {pack_code(source, filename)!r}\n")
        parts.append(_CARRIED % {"name": mod, "var": var, "file": filename})
        extra.append(f'"CARRIED_{var}": _carried_{mod}, "CARRIED_{var}_VERSION": {version or "unknown"!r}')
    if package is not None:
        pkg, modules = package
        table = []
        for mod, source in modules.items():
            var, filename = _var(f"{pkg} {mod}"), f"<clusterctl {name} {mod}>"
            code = pack_code(source, filename) if compiled else ""
            parts.append(f"_{var} = {pack(source)!r}\n_{var}_CODE = {code!r}\n")
            table.append(f"{mod!r}: (_{var}_CODE, _{var}, {filename!r})")
        parts.append(_PACKAGE % {"package": pkg, "table": "{" + ", ".join(table) + "}"})
        parts.append("__import__(_P + '.main')\nsys.exit(sys.modules[_P + '.main'].main())\n")
    else:
        assert main is not None
        var, filename = _var(name), f"<clusterctl-{name}>"
        parts.append(f"_{var} = {pack(main)!r}\n_{var}_CODE = {pack_code(main, filename)!r}\n")
        parts.append(
            '_globals = {"__name__": "__main__", "__builtins__": __builtins__'
            + "".join(", " + e for e in extra)
            + "}\n"
            + "".join(f"_globals[{k!r}] = {k}\n" for k in (constants or {}))
            + f"exec(_code(_{var}_CODE, _{var}, {filename!r}), _globals)\n"
        )
    data = "".join(parts).encode("ascii")
    return Program(name, data, hashlib.sha256(data).hexdigest())


def run(
    fleet: Fleet,
    program: Program,
    args: Sequence[str] | Mapping[str, Sequence[str]] = (),
    *,
    stdin: bytes | None = None,
    cache: bool | None = None,
    **run_kwargs: Any,
) -> RunResults:
    """Run ``program`` with ``args`` (one list, or one per host name) on the fleet's hosts, the
    program shipped only where the node cache has no verified copy; ``stdin``: the job the
    program reads.  The other keyword arguments go to :func:`clusterctl.fleet.cached.run_cached`
    and ``fleet.run`` (``sudo``, ``timeout``, ``on_result``, ``on_stderr``...)."""
    run_kwargs.setdefault("require_python", True)
    return run_cached(fleet, program.data, args, stdin=stdin, cache=cache, **run_kwargs)


#: The node programs installed as files for systemd to run (clusterctl never runs them itself):
#: program name in ``clusterctl/node/`` -> the command's name on the node.
INSTALLED = {"check_gpus": "check-gpus", "stage/verify_model": "verify-model", "stage/pin_model": "pin-model"}


@lru_cache(maxsize=None)
def installed(name: str) -> Program:
    """Node program ``name`` (one of :data:`INSTALLED`) as the file systemd runs, built by
    :func:`build` (one file: the bytes written on the node are its source)."""
    if name not in INSTALLED:
        raise ValueError(f"{name!r} is not an installed node program (one of {', '.join(INSTALLED)})")
    return build(name, label=INSTALLED[name])


def install_script(program: Program, path: str) -> str:
    """POSIX ``sh`` (run as root) that writes ``program`` to ``path`` (mode 0755) unless that
    file already has its sha256 and is executable.  The bytes travel in the script (base64),
    are written to a temporary file beside ``path`` and checked against ``program.digest``
    there (``sha256sum``), then renamed into place: a reader sees the old file or the new one.
    Exit 0 (nothing printed) when the file is in place; 1 with one line on stderr when the
    bytes arrived damaged (nothing written)."""
    p, d = quote(path), quote(program.digest)
    tmp = quote(f"{path}.tmp-clusterctl")
    payload = quote(base64.b64encode(program.data).decode("ascii"))
    have = f"\"$(sha256sum < {p} 2>/dev/null | cut -d' ' -f1)\""
    return (
        "set -e; "
        f"if [ ! -x {p} ] || [ {have} != {d} ]; then "
        f"mkdir -p \"$(dirname {p})\"; "
        f"printf %s {payload} | base64 -d > {tmp}; "
        f"if [ \"$(sha256sum < {tmp} | cut -d' ' -f1)\" != {d} ]; then rm -f {tmp}; "
        f"echo {quote(f'clusterctl: {path}: the program arrived damaged (sha256 mismatch)')} >&2; exit 1; fi; "
        f"chmod 0755 {tmp}; mv -f {tmp} {p}; fi"
    )


def install_job(program: Program, path: str) -> dict[str, str]:
    """What a node program's job carries to write ``program`` as the file ``path``: the node
    checks the sha256 of ``program`` before it writes, and writes only when the file there does
    not already have it (``clusterctl/node/stage/main.py``'s ``install``)."""
    return {"path": path, "program": program.text, "sha256": program.digest}
