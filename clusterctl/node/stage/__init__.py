"""Model staging's node side: manifests, versioned layout, fetch (HTTP, S3), relay
chain, page cache (``main.py`` runs them), plus ``verify_model.py`` and
``pin_model.py`` installed beside the units.  Standard library only; the modules
import each other relatively, because ``clusterctl/stage/bundle.py`` rebuilds them
on the node as one package.  The control side (``clusterctl/stage/plan.py``,
``run.py``) imports ``manifest``, ``fetch``, ``s3`` and ``relay`` from here too.
See docs/staging.md.
"""
