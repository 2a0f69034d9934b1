"""Versioned model layout on a node (node-side, stdlib).

For a model whose path is ``/models/qwen3-8b`` (``Model.path``)::

    /models/.versions/qwen3-8b/<version>/            complete, verified copies
    /models/.versions/qwen3-8b/<version>/.clusterctl-manifest.json
    /models/.versions/qwen3-8b/<version>/.clusterctl-verified   JSON marker
    /models/.versions/qwen3-8b/.partial-<version>/   a fetch in progress (resumable)
    /models/qwen3-8b -> .versions/qwen3-8b/<version> the symlink vLLM reads

A version directory only gets its final name after every chunk verified, and
the model path is switched by renaming a temporary symlink over it (atomic:
a reader sees the old or the new version, never neither).  The marker holds
the manifest digest; ``verify_model.py`` (the deploy unit's ExecStartPre)
checks it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional

from . import manifest as mf

VERSIONS_DIR = ".versions"
MARKER_NAME = ".clusterctl-verified"
PARTIAL_PREFIX = ".partial-"


class LayoutError(RuntimeError):
    """The model path cannot be managed (e.g. it is a real directory, not our symlink)."""


def _safe_component(value: str, what: str) -> str:
    if not value or "/" in value or value in (".", "..") or value.startswith(".") or "\0" in value:
        raise LayoutError(f"unusable {what} {value!r} for a directory name")
    return value


class Layout:
    """The directories of one model (``name``) whose served path is ``model_path``."""

    def __init__(self, model_path: str, name: str):
        if not os.path.isabs(model_path):
            raise LayoutError(f"model path {model_path!r} must be absolute")
        self.model_path = os.path.normpath(model_path)
        self.name = _safe_component(name, "model name")
        self.base = os.path.dirname(self.model_path)
        self.versions = os.path.join(self.base, VERSIONS_DIR, self.name)

    def version_dir(self, version: str) -> str:
        return os.path.join(self.versions, _safe_component(version, "version"))

    def partial_dir(self, version: str) -> str:
        return os.path.join(self.versions, PARTIAL_PREFIX + _safe_component(version, "version"))

    def current(self) -> Optional[str]:
        """The version the model path points at, or None (absent, or not our symlink)."""
        try:
            target = os.readlink(self.model_path)
        except OSError:
            return None
        full = os.path.normpath(os.path.join(self.base, target))
        if os.path.dirname(full) != self.versions:
            return None
        return os.path.basename(full)

    def list_versions(self) -> List[str]:
        """Complete versions on disk, oldest first (by marker time)."""
        try:
            names = [n for n in os.listdir(self.versions) if not n.startswith(".")]
        except FileNotFoundError:
            return []

        def when(n: str) -> float:
            try:
                return os.stat(os.path.join(self.versions, n, MARKER_NAME)).st_mtime
            except OSError:
                return 0.0

        return sorted(names, key=lambda n: (when(n), n))

    def read_marker(self, version: str) -> Optional[Dict[str, Any]]:
        try:
            with open(os.path.join(self.version_dir(version), MARKER_NAME)) as fh:
                data = json.load(fh)
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def finalize(self, version: str, manifest: "mf.Manifest") -> str:
        """Write manifest and marker into the verified partial dir and give it its final name.

        The caller has verified every chunk.  An existing complete directory of
        the same version (same digest) is kept and the partial one removed.
        """
        part, final = self.partial_dir(version), self.version_dir(version)
        _write_atomic(os.path.join(part, mf.MANIFEST_NAME), manifest.to_json().encode())
        marker = {
            "manifest_sha256": manifest.digest(),
            "name": manifest.name,
            "version": version,
            "bytes": manifest.total_bytes,
            "files": len(manifest.files),
            "verified_at": time.time(),
        }
        _write_atomic(os.path.join(part, MARKER_NAME), json.dumps(marker, sort_keys=True).encode())
        _fsync_dir(part)
        if os.path.isdir(final):
            existing = self.read_marker(version)
            if existing and existing.get("manifest_sha256") == marker["manifest_sha256"]:
                import shutil  # only here and in prune: not on every node program's start

                shutil.rmtree(part)
                return final
            raise LayoutError(f"{final} exists with other content; remove it or use another version")
        os.rename(part, final)
        _fsync_dir(self.versions)
        return final

    def switch(self, version: str) -> None:
        """Point the model path at ``version`` atomically (rename of a temporary symlink)."""
        if not os.path.isfile(os.path.join(self.version_dir(version), MARKER_NAME)):
            raise LayoutError(f"version {version} of {self.name} is not verified; not switching")
        if os.path.lexists(self.model_path) and not os.path.islink(self.model_path):
            raise LayoutError(
                f"{self.model_path} is a real file or directory, not a clusterctl symlink; move it away before staging"
            )
        tmp = f"{self.model_path}.clusterctl-tmp-{os.getpid()}"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.path.join(VERSIONS_DIR, self.name, version), tmp)
        os.replace(tmp, self.model_path)
        _fsync_dir(self.base)

    def prune(self, keep: int, protect: tuple = ()) -> List[str]:
        """Remove the oldest complete versions beyond ``keep``; never the current one or ``protect``.

        Returns the versions removed.  ``keep`` counts every version left, the
        current one included (minimum 1).
        """
        keep = max(1, keep)
        current = self.current()
        versions = self.list_versions()
        removable = [v for v in versions if v != current and v not in protect]
        removed = []
        excess = len(versions) - keep
        for v in removable:
            if excess <= 0:
                break
            # Rename first, so a half-deleted tree never carries a version name.
            doomed = os.path.join(self.versions, f".deleting-{v}-{os.getpid()}")
            os.rename(self.version_dir(v), doomed)
            import shutil

            shutil.rmtree(doomed, ignore_errors=True)
            removed.append(v)
            excess -= 1
        return removed


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
