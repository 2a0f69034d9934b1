"""The node-side staging code as one ``python3 -c`` program (control side).

The stdlib-only modules of ``clusterctl/node/stage/`` (threads, manifest, layout, fetch, s3,
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

NODE_MODULES = ("threads", "manifest", "layout", "fetch", "s3", "relay", "pagecache", "main")
PACKAGE = "clusterctl_stage_node"

# The modules travel compressed; each is compiled when it is first imported (a finder on
# sys.meta_path), so a job that never needs s3 or pagecache does not pay for them.  Only
# names every Python 3.8+ has: type(sys) is ModuleType, type(sys.__spec__) ModuleSpec.
_BOOT = '''import sys, zlib, binascii
P = %(pkg)r
S = dict(%(mods)r)
class L:
    @staticmethod
    def create_module(spec):
        return None
    @staticmethod
    def exec_module(m):
        n = m.__name__[len(P) + 1:]
        m.__file__ = "<clusterctl stage " + n + ">"
        exec(compile(zlib.decompress(binascii.a2b_base64(S[n])), m.__file__, "exec"), m.__dict__)
class F:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.startswith(P + ".") and name[len(P) + 1:] in S:
            return type(sys.__spec__)(name, L)
        return None
sys.meta_path.insert(0, F)
pkg = type(sys)(P); pkg.__path__ = []; pkg.__package__ = P; sys.modules[P] = pkg
__import__(P + ".main")
sys.exit(sys.modules[P + ".main"].main())
'''


@lru_cache(maxsize=1)
def bootstrap() -> str:
    """The ``python3 -c`` program (about 15 KB)."""
    mods = tuple(
        (n, base64.b64encode(zlib.compress(node.path("stage/" + n).read_bytes(), 9)).decode()) for n in NODE_MODULES
    )
    return _BOOT % {"pkg": PACKAGE, "mods": mods}


def verify_model_source() -> str:
    return node.source("stage/verify_model")


def pin_model_source() -> str:
    return node.source("stage/pin_model")


def command(args: Iterable[str] = ()) -> str:
    """The shell command running the node program with ``args`` (quoted)."""
    return shell.require_python3(shell.join(["python3", "-I", "-B", "-c", bootstrap(), *args]))
