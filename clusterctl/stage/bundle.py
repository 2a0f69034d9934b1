"""The node-side staging code as one program (control side).

The stdlib-only modules of ``clusterctl/node/stage/`` (threads, manifest, layout, fetch, s3,
relay, pagecache, main) are built by the one builder of node programs
(:func:`clusterctl.fleet.ship.build`) into a small bootstrap that rebuilds them as the
package ``clusterctl_stage_node`` in the node's interpreter (each module compiled when
first imported) and calls ``main.main()``; it runs the one way node programs do
(:func:`clusterctl.fleet.ship.run`: from the node cache, shipped only where missing).
Nothing is written on the node for it but the cached program; the job itself (which may
carry source credentials) goes on stdin, never on the command line.  The scripts systemd runs
(``verify-model``, ``pin-model``) come from the same builder (:func:`verify_model`,
:func:`pin_model`) and travel in the job (:func:`clusterctl.fleet.ship.install_job`).
"""

from __future__ import annotations

from functools import lru_cache

from clusterctl import node
from clusterctl.fleet import ship

NODE_MODULES = ("threads", "manifest", "layout", "fetch", "s3", "relay", "pagecache", "main")
PACKAGE = "clusterctl_stage_node"


@lru_cache(maxsize=1)
def program() -> ship.Program:
    """The staging node program as shipped."""
    return ship.build(
        "stage",
        package=(PACKAGE, {n: node.path("stage/" + n).read_bytes() for n in NODE_MODULES}),
        compiled=False,  # the sources alone, as before: a quarter of the size, and these compile in ms
    )


def bootstrap() -> str:
    """The program's text (what ``python3 -I -B -c`` would run)."""
    return program().text


def verify_model() -> ship.Program:
    """``verify-model`` (the units' ExecStartPre) as the builder makes it, for the file it is installed as."""
    return ship.installed("stage/verify_model")


def pin_model() -> ship.Program:
    """``pin-model`` (run by ``stage pin``'s transient unit), likewise."""
    return ship.installed("stage/pin_model")
