"""Node-side S3 source: ranged GETs signed with AWS Signature Version 4 (stdlib only).

Works with any S3-compatible object store (AWS, MinIO, Ceph RGW, moto) using
path-style addressing: ``<endpoint>/<bucket>/<key>``.  Every request is
signed with the payload hash of an empty body (GETs only).  The secret key
and session token reach this module only inside the job on stdin and never
appear in a message.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse
from typing import Dict, Optional

from .fetch import HttpSource

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def sigv4_headers(
    method: str,
    host: str,
    path: str,
    query: str,
    headers: Dict[str, str],
    *,
    region: str,
    access_key: str,
    secret_key: str,
    session_token: Optional[str] = None,
    now: Optional[datetime.datetime] = None,
    service: str = "s3",
) -> Dict[str, str]:
    """The headers to add to a request so S3 accepts it (SigV4, header-based).

    ``path`` is the URI-encoded absolute path (``/bucket/key``), ``query`` the
    canonical query string ('' for none), ``headers`` the other headers sent
    (all of them are signed).  Returns ``x-amz-date``,
    ``x-amz-content-sha256``, ``x-amz-security-token`` when given and
    ``Authorization``.
    """
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    added = {"x-amz-date": amz_date, "x-amz-content-sha256": EMPTY_SHA256}
    if session_token:
        added["x-amz-security-token"] = session_token
    signed = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
    signed.update(added)
    signed["host"] = host
    names = sorted(signed)
    canonical = "\n".join(
        [method, path, query, "".join(f"{n}:{signed[n]}\n" for n in names), ";".join(names), EMPTY_SHA256]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret_key).encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    added["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return added


class S3Source(HttpSource):
    """Objects under ``s3://bucket/prefix/`` at ``endpoint``, read with signed range requests.

    ``endpoint``: ``http(s)://host[:port]`` of the object store.  Errors name
    ``s3://bucket/prefix/key`` and the HTTP status, never a credential.
    """

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        prefix: str,
        *,
        region: str,
        access_key: str,
        secret_key: str,
        session_token: Optional[str] = None,
        timeout: float = 30.0,
    ):
        prefix = prefix.strip("/")
        super().__init__(
            endpoint.rstrip("/")
            + "/"
            + urllib.parse.quote(bucket)
            + ("/" + urllib.parse.quote(prefix) if prefix else "")
            + "/",
            timeout=timeout,
        )
        self.label = f"s3://{bucket}/{prefix + '/' if prefix else ''}"
        self._creds = (region, access_key, secret_key, session_token)
        self._host = self.host if self.port is None else f"{self.host}:{self.port}"

    def _sign(self, url: str, headers: Dict[str, str]) -> Dict[str, str]:
        region, access_key, secret_key, token = self._creds
        return dict(
            headers,
            **sigv4_headers(
                "GET",
                self._host,
                url,
                "",
                headers,
                region=region,
                access_key=access_key,
                secret_key=secret_key,
                session_token=token,
            ),
        )

    def __repr__(self) -> str:
        return f"S3Source({self.label!r})"
