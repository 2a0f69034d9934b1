"""Control side: where a model comes from, its manifest, and who reads from whom.

Source forms (``Model.source`` or ``--source``):

=======================  ==============================================================
``http(s)://host/dir/``  ranged HTTP reads; the manifest is ``dir/.clusterctl-manifest.json``
                         (write it once at the source with ``clusterctl stage manifest DIR``)
``file:///mnt/models/x`` a path every node mounts (NFS, Lustre...); the manifest is read or
                         computed here when this machine mounts it too
``s3://bucket/prefix/``  S3-compatible object storage, signed (SigV4) ranged GETs; the
                         manifest is the object ``prefix/.clusterctl-manifest.json``
``/local/dir``           a directory on this machine: the manifest is computed here and the
                         bytes are pushed over each SSH connection (stdin)
=======================  ==============================================================

Credentials for HTTP sources come from the environment
(``CLUSTERCTL_STAGE_AUTH``: a whole ``Authorization`` header value) or the
URL's user:password.  S3 takes the AWS CLI's variables: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or
``AWS_DEFAULT_REGION``, default us-east-1) and the endpoint from
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (default AWS's regional one).
Credentials travel to nodes only inside the job on stdin and are redacted
from every message.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Sequence

from clusterctl.errors import ClusterctlError
from clusterctl.node.stage import fetch, manifest as mf, s3

#: TCP port of the node-side relay servers (data plane).
DEFAULT_PORT = 7707
AUTH_ENV = "CLUSTERCTL_STAGE_AUTH"


class StageError(ClusterctlError):
    """Staging cannot start: bad source, manifest or options (message names the place)."""


@dataclass(frozen=True)
class Source:
    kind: str  # "http" | "s3" | "file" | "push"
    location: str  # URL, path on the nodes, or directory here
    headers: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    #: S3 only: endpoint, region and credentials (secrets: job on stdin only).
    s3: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __repr__(self) -> str:  # the location may carry user:password
        return f"Source({self.kind!r}, {self.label!r})"

    @property
    def label(self) -> str:
        return fetch.redact_url(self.location) if self.kind == "http" else self.location

    def node_spec(self) -> dict[str, Any]:
        """The ``source`` part of a node job (may carry credentials: stdin only)."""
        if self.kind == "http":
            return {"kind": "http", "url": self.location, "headers": dict(self.headers)}
        if self.kind == "file":
            return {"kind": "file", "root": self.location}
        if self.kind == "s3":
            bucket, _, prefix = self.location[len("s3://") :].partition("/")
            return {"kind": "s3", "bucket": bucket, "prefix": prefix, **self.s3}
        return {"kind": "stream"}

    def reader(self) -> fetch.HttpSource:
        """A control-side reader of an http or s3 source (for its manifest)."""
        if self.kind == "s3":
            spec = self.node_spec()
            return s3.S3Source(
                spec["endpoint"],
                spec["bucket"],
                spec["prefix"],
                region=spec["region"],
                access_key=spec["access_key"],
                secret_key=spec["secret_key"],
                session_token=spec.get("session_token"),
            )
        return fetch.HttpSource(self.location, self.headers)


def parse_source(text: str, where: str = "--source") -> Source:
    """A :class:`Source` from ``text``; StageError naming ``where`` when it is unusable."""
    if not text:
        raise StageError(f"{where}: the model has no source; set models.<name>.source or pass --source")
    u = urllib.parse.urlsplit(text)
    if u.scheme in ("http", "https"):
        headers = {}
        if os.environ.get(AUTH_ENV):
            headers["Authorization"] = os.environ[AUTH_ENV]
        return Source("http", text if text.endswith("/") else text + "/", headers)
    if u.scheme == "s3":
        return _s3_source(u, where)
    if u.scheme == "file":
        if not u.path.startswith("/"):
            raise StageError(f"{where}: {text!r}: a file:// source needs an absolute path")
        return Source("file", u.path)
    if u.scheme:
        raise StageError(
            f"{where}: unsupported source scheme {u.scheme!r} in {fetch.redact_url(text)} "
            f"(http, https, s3, file, or a local directory)"
        )
    if not os.path.isdir(text):
        raise StageError(f"{where}: {text}: no such directory on this machine")
    return Source("push", os.path.abspath(text))


def _s3_source(u: urllib.parse.SplitResult, where: str) -> Source:
    if not u.hostname or u.username or u.password or u.query:
        raise StageError(
            f"{where}: an S3 source is s3://BUCKET/PREFIX/ (credentials come from "
            f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, never the URL)"
        )
    env = os.environ
    missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not env.get(k)]
    if missing:
        raise StageError(f"{where}: s3://{u.hostname}{u.path}: set {' and '.join(missing)} for the object store")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or f"https://s3.{region}.amazonaws.com"
    if urllib.parse.urlsplit(endpoint).scheme not in ("http", "https"):
        raise StageError(f"{where}: the S3 endpoint {fetch.redact_url(endpoint)} must be http(s)://host[:port]")
    creds = {
        "endpoint": endpoint,
        "region": region,
        "access_key": env["AWS_ACCESS_KEY_ID"],
        "secret_key": env["AWS_SECRET_ACCESS_KEY"],
    }
    if env.get("AWS_SESSION_TOKEN"):
        creds["session_token"] = env["AWS_SESSION_TOKEN"]
    prefix = u.path.strip("/")
    return Source("s3", f"s3://{u.hostname}/{prefix + '/' if prefix else ''}", s3=creds)


def load_manifest(source: Source, name: str, version: str | None, chunk_size: int = mf.DEFAULT_CHUNK) -> mf.Manifest:
    """The manifest of ``source``, named ``name`` at ``version`` (default: its content id).

    HTTP: the source's ``.clusterctl-manifest.json``.  Directory or mounted
    shared path: that file when present and newer than every model file, else
    computed here (reads the model once).
    """
    if source.kind in ("http", "s3"):
        src = source.reader()
        where = f"{source.label}{mf.MANIFEST_NAME}"
        try:
            text = src.get(mf.MANIFEST_NAME).decode()
        except fetch.FetchError as e:
            raise StageError(
                f"cannot read the manifest {where}: {e} (write it at the source with "
                f"'clusterctl stage manifest DIR --name {name}')"
            ) from None
        finally:
            src.close()
        try:
            man = mf.loads(text, where)
        except mf.ManifestError as e:
            raise StageError(str(e)) from None
        return man.with_identity(name, version or man.version or None)
    root = source.location
    if not os.path.isdir(root):
        raise StageError(
            f"{root}: not a directory on this machine; write {mf.MANIFEST_NAME} there from a "
            f"machine that mounts it ('clusterctl stage manifest DIR')"
        )
    saved = os.path.join(root, mf.MANIFEST_NAME)
    if os.path.isfile(saved):
        newest = max((os.path.getmtime(os.path.join(root, p)) for p in mf.model_files(root)), default=0.0)
        if os.path.getmtime(saved) >= newest:
            with open(saved) as fh:
                try:
                    man = mf.loads(fh.read(), saved)
                except mf.ManifestError as e:
                    raise StageError(str(e)) from None
            if man.chunk_size == chunk_size or chunk_size == mf.DEFAULT_CHUNK:
                return man.with_identity(name, version or man.version or None)
    try:
        return mf.compute(root, name, version, chunk_size)
    except mf.ManifestError as e:
        raise StageError(str(e)) from None
    except OSError as e:
        raise StageError(f"{root}: cannot hash {e.filename}: {e.strerror} (is it changing?)") from None


def write_manifest(root: str, man: mf.Manifest) -> str:
    """Write ``man`` as ``root/.clusterctl-manifest.json`` (temp + rename); returns the path."""
    path = os.path.join(root, mf.MANIFEST_NAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(json.dumps(man.to_dict(), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


@dataclass
class NodePlan:
    """One host's part: where it reads from (``upstreams``, nearest first; empty: the source)."""

    host: str
    address: str
    upstreams: list[tuple[str, int]] = field(default_factory=list)
    upstream_hosts: list[str] = field(default_factory=list)
    children: int = 0
    port: int | None = None

    def relay_spec(self, stall_timeout: float, linger: float) -> dict[str, Any]:
        return {
            "bind": self.address if self.port is not None else "",
            "port": self.port,
            "upstreams": [list(u) for u in self.upstreams],
            "children": self.children,
            "stall_timeout": stall_timeout,
            "linger": linger,
        }


RELAYS = ("chain", "tree", "none")


def plan_chains(
    hosts: Sequence[tuple[str, str]],
    relay: str,
    chains: int = 1,
    port: int = DEFAULT_PORT,
    *,
    fanout: int = 2,
    groups: Sequence[Sequence[tuple[str, str]]] | None = None,
) -> list[NodePlan]:
    """Plan for ``hosts`` (name, data address), in the given order.

    ``relay="none"``: every host reads the source.  ``relay="chain"``: the
    hosts are cut into ``chains`` contiguous chains (so at most ``chains``
    hosts read the source); each host's upstreams are its predecessors,
    nearest first, so a dead parent is skipped by re-attaching to the
    grandparent.  ``relay="tree"``: the same cut, but each group is a tree in
    breadth-first order where every node feeds up to ``fanout`` children (depth
    log_fanout(N) instead of N; upstreams are the ancestors, nearest first).
    ``groups`` (e.g. one per rack) replaces the cut: each group has its own
    chain or tree, so the source is read once per group.
    """
    if relay not in RELAYS:
        raise StageError(f"--relay {relay!r}: expected one of {', '.join(RELAYS)}")
    if fanout < 1:
        raise StageError(f"--tree-fanout {fanout}: must be at least 1")
    if relay == "none":
        return [NodePlan(h, a) for h, a in hosts]
    if groups is None:
        n = len(hosts)
        k = max(1, min(chains, n))
        size, extra = divmod(n, k)
        cut: list[Sequence[tuple[str, str]]] = []
        i = 0
        for c in range(k):
            cut.append(hosts[i : i + size + (1 if c < extra else 0)])
            i += len(cut[-1])
        groups = cut
    width = 1 if relay == "chain" else fanout
    plans: list[NodePlan] = []
    for members in groups:
        for j, (h, a) in enumerate(members):
            ancestors = []
            p = j
            while p > 0:
                p = (p - 1) // width
                ancestors.append(p)
            kids = sum(1 for c in range(width * j + 1, width * j + width + 1) if c < len(members))
            plans.append(
                NodePlan(
                    h,
                    a,
                    [(members[p][1], port) for p in ancestors],
                    [members[p][0] for p in ancestors],
                    children=kids,
                    port=port if kids else None,
                )
            )
    return plans


def rack_groups(hosts: Sequence[tuple[str, str]], racks: Sequence[str]) -> list[list[tuple[str, str]]]:
    """``hosts`` split by rack (``racks[i]`` is host i's rack label), in first-seen order."""
    out: dict[str, list[tuple[str, str]]] = {}
    for h, r in zip(hosts, racks):
        out.setdefault(r, []).append(h)
    return list(out.values())


def push_frames(source: Source, man: mf.Manifest) -> bytes:
    """Every chunk of a local directory as relay frames, for a node's stdin (push source)."""
    from clusterctl.node.stage.relay import HEADER  # start-up: --help reaches this module

    out = bytearray()
    for c in man.chunks():
        with open(os.path.join(source.location, c.path), "rb") as fh:
            data = os.pread(fh.fileno(), c.length, c.offset)
        out += HEADER.pack(c.index, len(data)) + data
    return bytes(out)
