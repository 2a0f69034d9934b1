"""Manifest of one model version: files, sizes, sha256, per-chunk sha256 (node-side, stdlib).

A manifest is JSON::

    {"format": 1, "name": "qwen3-8b", "version": "2025-06", "chunk_size": 8388608,
     "files": [{"path": "model.safetensors", "size": 123, "sha256": "...",
                "chunks": ["<sha256 of bytes [0, chunk_size)>", ...]}, ...]}

Every file is cut into chunks of ``chunk_size`` bytes (the last one shorter);
chunks are numbered globally in file order (:meth:`Manifest.chunks`), which is
the order a relay passes them on.  :meth:`Manifest.digest` is the sha256 of the
canonical JSON; the verified marker records it.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, NamedTuple, Optional

from .threads import pmap

FORMAT = 1
#: Default chunk size in bytes (8 MiB): the unit of ranged reads, retries and relay.
DEFAULT_CHUNK = 8 * 1024 * 1024
#: Name of the manifest file inside a version directory and at an HTTP source.
MANIFEST_NAME = ".clusterctl-manifest.json"
#: Files and directories of ours that are never part of a model.
RESERVED_PREFIX = ".clusterctl"


class ManifestError(ValueError):
    """The manifest is malformed or unsafe (a path leaving the model directory)."""


# NamedTuples, not dataclasses: importing dataclasses (it imports inspect) cost the
# node program more CPU at start than the rest of its imports.
class FileEntry(NamedTuple):
    path: str
    size: int
    sha256: str
    chunks: tuple  # of sha256 hex strings


class Chunk:
    """One chunk: global ``index``, its file, byte ``offset`` and ``length`` in it (a value:
    compared and hashed by its fields; a plain class because ``index`` is a tuple method)."""

    __slots__ = ("index", "file", "path", "offset", "length", "sha256")

    def __init__(self, index: int, file: int, path: str, offset: int, length: int, sha256: str):
        self.index, self.file, self.path = index, file, path
        self.offset, self.length, self.sha256 = offset, length, sha256

    def _key(self) -> tuple:
        return (self.index, self.file, self.path, self.offset, self.length, self.sha256)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Chunk) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "Chunk(index=%d, file=%d, path=%r, offset=%d, length=%d, sha256=%r)" % self._key()


def check_relpath(path: str) -> str:
    """``path`` if it is a safe relative path inside a model directory, else ManifestError."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\0" in path:
        raise ManifestError(f"unsafe file path in manifest: {path!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0].startswith(RESERVED_PREFIX):
        raise ManifestError(f"unsafe file path in manifest: {path!r}")
    return path


class Manifest(NamedTuple):
    name: str
    version: str
    chunk_size: int
    files: tuple  # of FileEntry

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def chunks(self) -> List[Chunk]:
        out: List[Chunk] = []
        for fi, f in enumerate(self.files):
            for ci, digest in enumerate(f.chunks):
                off = ci * self.chunk_size
                out.append(Chunk(len(out), fi, f.path, off, min(self.chunk_size, f.size - off), digest))
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "version": self.version,
            "chunk_size": self.chunk_size,
            "files": [
                {"path": f.path, "size": f.size, "sha256": f.sha256, "chunks": list(f.chunks)} for f in self.files
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """sha256 (hex) of the canonical JSON: identifies this exact content."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def with_identity(self, name: str, version: Optional[str]) -> "Manifest":
        """This content under another name and version (default: the first 12 hex of the digest)."""
        return Manifest(name, version or self.content_id(), self.chunk_size, self.files)

    def content_id(self) -> str:
        """Version-independent id of the bytes: sha256 over the file list (12 hex)."""
        h = hashlib.sha256()
        for f in self.files:
            h.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
        return h.hexdigest()[:12]


def from_dict(data: Any, where: str = "manifest") -> Manifest:
    """Validate and build a :class:`Manifest`; ManifestError names ``where`` and the field."""

    def bad(msg: str) -> ManifestError:
        return ManifestError(f"{where}: {msg}")

    if not isinstance(data, dict):
        raise bad("not a JSON object")
    if data.get("format") != FORMAT:
        raise bad(f"unsupported format {data.get('format')!r} (expected {FORMAT})")
    cs = data.get("chunk_size")
    if not isinstance(cs, int) or cs < 4096:
        raise bad(f"chunk_size must be an integer >= 4096 (got {cs!r})")
    files = []
    seen = set()
    for i, f in enumerate(data.get("files") or []):
        if not isinstance(f, dict):
            raise bad(f"files[{i}] is not an object")
        try:
            path = check_relpath(str(f.get("path") or ""))
        except ManifestError as e:
            raise bad(f"files[{i}]: {e}") from None
        if path in seen:
            raise bad(f"files[{i}]: {path} listed twice")
        seen.add(path)
        size, sha, chunks = f.get("size"), f.get("sha256"), f.get("chunks")
        if not isinstance(size, int) or size < 0:
            raise bad(f"files[{i}] ({path}): size must be a non-negative integer")
        if not _is_hex(sha):
            raise bad(f"files[{i}] ({path}): sha256 must be 64 hex digits")
        if not isinstance(chunks, list) or not all(_is_hex(c) for c in chunks):
            raise bad(f"files[{i}] ({path}): chunks must be a list of sha256 hex digests")
        want = max(1, -(-size // cs)) if size else 0
        if len(chunks) != want:
            raise bad(
                f"files[{i}] ({path}): {len(chunks)} chunk digests for {size} bytes "
                f"(expected {want} at chunk_size {cs})"
            )
        files.append(FileEntry(path, size, str(sha), tuple(chunks)))
    name, version = data.get("name"), data.get("version")
    if not isinstance(name, str) or not isinstance(version, str):
        raise bad("name and version must be strings")
    return Manifest(name, version, cs, tuple(files))


def loads(text: str, where: str = "manifest") -> Manifest:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ManifestError(f"{where}: not JSON: {e}") from None
    return from_dict(data, where)


def _is_hex(s: Any) -> bool:
    return isinstance(s, str) and len(s) == 64 and all(c in "0123456789abcdef" for c in s)


def _hash_file(path: str, chunk_size: int) -> tuple:
    whole = hashlib.sha256()
    chunks = []
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk_size)
            if not block:
                break
            whole.update(block)
            chunks.append(hashlib.sha256(block).hexdigest())
    return whole.hexdigest(), tuple(chunks)


def model_files(root: str) -> List[str]:
    """Relative paths of the regular files under ``root`` (sorted), ours excluded."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(RESERVED_PREFIX))
        for fn in filenames:
            if fn.startswith(RESERVED_PREFIX):
                continue
            full = os.path.join(dirpath, fn)
            if os.path.isfile(full) and not os.path.islink(full):
                out.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return sorted(out)


def compute(
    root: str, name: str, version: Optional[str] = None, chunk_size: int = DEFAULT_CHUNK, workers: int = 4
) -> Manifest:
    """Hash every file under directory ``root`` (``workers`` files at once; hashlib frees the GIL)."""
    if not os.path.isdir(root):
        raise ManifestError(f"{root}: not a directory")
    paths = model_files(root)
    if not paths:
        raise ManifestError(f"{root}: no files to stage")
    hashes = pmap(lambda p: _hash_file(os.path.join(root, p), chunk_size), paths, workers)
    files = tuple(FileEntry(p, os.path.getsize(os.path.join(root, p)), h[0], h[1]) for p, h in zip(paths, hashes))
    return Manifest(name, "", chunk_size, files).with_identity(name, version)
