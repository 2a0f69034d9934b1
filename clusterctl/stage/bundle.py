"""The node-side staging code as one ``python3 -c`` program (control side).

The stdlib-only modules of ``clusterctl/node/stage/`` (manifest, layout, fetch, s3,
relay, pagecache, main) are
compressed into a small bootstrap that rebuilds them as the package
``clusterctl_stage_node`` in the node's interpreter and calls
``main.main()``.  Nothing is written on the node for it; the job itself
(which may carry source credentials) goes on stdin, never on the command line.
"""

from __future__ import annotations

import base64
import zlib
from functools import lru_cache
from typing import Iterable

from clusterctl import node
from clusterctl.fleet import shell

NODE_MODULES = ("manifest", "layout", "fetch", "s3", "relay", "pagecache", "main")
PACKAGE = "clusterctl_stage_node"

_BOOT = '''import sys, types, zlib, base64
P = %(pkg)r
pkg = types.ModuleType(P); pkg.__path__ = []; sys.modules[P] = pkg
for n, src in %(mods)r:
    m = types.ModuleType(P + "." + n); m.__package__ = P; m.__file__ = "<clusterctl stage " + n + ">"
    sys.modules[m.__name__] = m; setattr(pkg, n, m)
    exec(compile(zlib.decompress(base64.b64decode(src)), m.__file__, "exec"), m.__dict__)
sys.exit(sys.modules[P + ".main"].main())
'''


@lru_cache(maxsize=1)
def bootstrap() -> str:
    """The ``python3 -c`` program (about 15 KB)."""
    mods = tuple((n, base64.b64encode(zlib.compress(node.path("stage/" + n).read_bytes(), 9)).decode())
                 for n in NODE_MODULES)
    return _BOOT % {"pkg": PACKAGE, "mods": mods}


def verify_model_source() -> str:
    return node.source("stage/verify_model")


def pin_model_source() -> str:
    return node.source("stage/pin_model")


def command(args: Iterable[str] = ()) -> str:
    """The shell command running the node program with ``args`` (quoted)."""
    return shell.require_python3(shell.join(["python3", "-I", "-B", "-c", bootstrap(), *args]))
