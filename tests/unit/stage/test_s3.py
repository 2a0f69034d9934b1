"""S3 sources: SigV4 signing (AWS's published example) and staging from an S3 server (moto)
that checks every signature."""

from __future__ import annotations

import datetime
import os
import uuid
from collections.abc import Iterator

import pytest

from clusterctl.stage import plan
from clusterctl.node.stage import s3, verify_model
from support import s3server
from unit.stage.nodehelp import make_model, manifest_for, run_node, stage_job

SIZES = {"config.json": 3_000, "model-00001-of-00002.safetensors": 300_000, "model-00002-of-00002.safetensors": 200_001}
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_signature_matches_aws_published_example() -> None:
    # "GET Object" example of the SigV4 documentation (Authenticating Requests: Using the
    # Authorization Header): its signature is f0e8bd...db41.
    h = s3.sigv4_headers(
        "GET",
        "examplebucket.s3.amazonaws.com",
        "/test.txt",
        "",
        {"Range": "bytes=0-9"},
        region="us-east-1",
        access_key="AKIAIOSFODNN7EXAMPLE",
        secret_key=SECRET,
        now=datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc),
    )
    assert h["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


@pytest.fixture(scope="module")
def server() -> Iterator[s3server.S3Server]:
    srv = s3server.start()
    yield srv
    srv.stop()


@pytest.fixture
def bucket(server: s3server.S3Server, tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A bucket holding a model and its manifest under ``models/m/``; the AWS variables set."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    src = make_model(tmp_path / "src", SIZES)
    man = manifest_for(src)
    plan.write_manifest(str(src), man)
    client = server.client("eu-west-1")
    name = f"models-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    for p in sorted(src.rglob("*")):
        if p.is_file():
            client.upload_file(str(p), name, f"models/m/{p.relative_to(src)}")
    return name, src, man


def test_stages_a_model_from_s3_and_verifies_it(tmp_path, bucket) -> None:
    name, src, _ = bucket
    source = plan.parse_source(f"s3://{name}/models/m/")
    man = plan.load_manifest(source, "m", "v1", chunk_size=64 * 1024)
    assert man.total_bytes == sum(SIZES.values())
    target = tmp_path / "models" / "m"
    rc, res = run_node(stage_job(man, target, source.node_spec()))
    assert rc == 0 and res["ok"], res
    assert res["bytes"] == man.total_bytes and verify_model.check(str(target)) is None
    assert all((target / rel).read_bytes() == (src / rel).read_bytes() for rel in SIZES)
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert secret not in str(res) and secret not in repr(source)


def test_wrong_secret_is_refused_by_the_store_and_never_shown(tmp_path, bucket, monkeypatch) -> None:
    name, _, man = bucket
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-right-one")
    source = plan.parse_source(f"s3://{name}/models/m")
    rc, res = run_node(stage_job(man, tmp_path / "models" / "m", source.node_spec(), attempts=1))
    assert rc == 1 and res["kind"] == "fetch" and "HTTP 403" in res["error"]
    assert f"s3://{name}/models/m/" in res["error"] and "not-the-right-one" not in str(res)


def test_missing_credentials_and_bad_urls_are_clear_errors(monkeypatch) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(plan.StageError, match="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        plan.parse_source("s3://bucket/m/", "models.m.source")
    with pytest.raises(plan.StageError, match="models.m.source: an S3 source is s3://BUCKET/PREFIX/"):
        plan.parse_source("s3://key:secret@bucket/m/", "models.m.source")
