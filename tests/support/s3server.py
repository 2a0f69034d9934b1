"""A real S3-compatible server for tests: moto's server in a subprocess, with authentication on.

moto checks SigV4 signatures only when IAM access control is enabled
(``INITIAL_NO_AUTH_ACTION_COUNT``): the first three requests create an IAM user, its access
key and a policy allowing s3:*; every later request must be signed with that key.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    proc: subprocess.Popen[bytes]

    def client(self, region: str = "us-east-1") -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def start(host: str = "127.0.0.1") -> S3Server:
    import boto3

    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://{host}:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection((host, port), 0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto's S3 server did not start")
            time.sleep(0.1)
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )
    iam.create_user(UserName="stager")
    key = iam.create_access_key(UserName="stager")["AccessKey"]
    iam.put_user_policy(
        UserName="stager",
        PolicyName="s3",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        ),
    )
    return S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], proc)
