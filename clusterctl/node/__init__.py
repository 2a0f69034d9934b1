"""The programs that run ON the nodes, one package, split by job.

Every module here runs on a node's own ``python3`` (3.8 or newer, the oldest
the nodes are required to have: docs/facts.md), so each one imports only the
standard library and modules of this package (``clusterctl.node.stage``'s
modules import each other relatively, as the node rebuilds them as one
package).  The control side ships them; nothing here imports the rest of
clusterctl, and ``tests/unit/node/test_node_programs.py`` runs each of them on
Python 3.8 and checks what they import.

Every program that clusterctl runs on a node travels one way, :mod:`clusterctl.fleet.ship`:
``ship.build`` makes it (one file as it is, or a bootstrap carrying modules) with its sha256,
``ship.run`` runs it from the node cache (shipped on stdin only to a host without a verified
copy), its job on stdin.  ``tests/unit/node/test_node_programs.py`` runs each one so, on the
nodes' minimum Python.

======================  ==============================================  =================================
program                 job                                             built with ``ship.build`` by
======================  ==============================================  =================================
``collector.py``        the probe: facts as one JSON document           ``probe/payload.py`` (+ pynvml)
``deploy.py``           deploy's reader/writer of units, env, files     ``deploy/remote.py``
``preflight.py``        deploy pre-flight reader (models, ports)        ``deploy/preflight/hosts.py``
``bundle.py``           ``collect`` bundle's node side                  ``probe/snapshot.py`` (+ the probe)
``gateway.py``          gateway host: install, config, drain scores     ``gateway/deploy.py``
``stage/``              model staging: fetch, relay, layout, page       ``stage/bundle.py`` (a package)
                        cache (``main.py``)
======================  ==============================================  =================================

Installed as files for systemd to run (not run by clusterctl itself), built the same way
(``ship.installed``: content and sha256) and written from the builder's output, their sha256
checked on the node, only when the file there differs: ``check_gpus.py`` (the units'
``check-gpus`` ExecStartPre) and ``stage/verify_model.py`` (``verify-model``, the same), by
deploy's node set-up (``ship.install_script`` from ``deploy/units/nodesetup.py``) and, for
``verify-model``, by every staging run; ``stage/pin_model.py`` (``pin-model``, run by ``stage
pin``'s transient unit), by the staging program (``ship.install_job``).

:func:`source` is the one way the control side reads a program's text.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The file of node program ``name`` (``"collector"``, ``"stage/main"``, ...)."""
    p = HERE / f"{name}.py"
    if not p.is_file():
        raise FileNotFoundError(f"no node program {name!r} in {HERE}")
    return p


def source(name: str) -> str:
    """The text of node program ``name`` (see :func:`path`)."""
    return path(name).read_text(encoding="utf-8")
