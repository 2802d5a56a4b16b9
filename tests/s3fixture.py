"""S3 fixtures on a loopback moto server: ``s3_endpoint`` and ``s3_bucket_url``.

A plain module (not a conftest) so tests/conftest.py can import the fixtures
and test modules can import them directly.

``s3_endpoint`` starts one in-process ``moto.server.ThreadedMotoServer`` on
127.0.0.1 (a free port) per session: a real HTTP S3 endpoint, so s3fs,
aiohttp and zarr run their real code paths; nothing is mocked in-process.
Without ``moto[server]`` the tests that need it are skipped, except under
``CI=true``, where a missing dependency is a broken CI job and fails.

``s3_bucket_url`` gives each test a fresh bucket and yields
``("s3://<bucket>/store", storage_options)``. No ``region_name`` anywhere:
with ``us-east-1`` s3fs sends a LocationConstraint that moto rejects
(``InvalidLocationConstraint``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

S3_KEY = "testing"
S3_SECRET = "testing"


def s3_storage_options(endpoint: str) -> dict[str, Any]:
    """fsspec/s3fs options for the moto endpoint (credentials are moto's dummies)."""
    return {"endpoint_url": endpoint, "key": S3_KEY, "secret": S3_SECRET}


def _unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: moto[server] must be installed)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of a moto S3 server on 127.0.0.1, shared by the session."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        _unavailable(f"moto[server] is not installed ({exc}); pip install 'moto[server]'")
        raise AssertionError("unreachable") from exc  # skip/fail raise; this is for mypy
    # Dummy credentials in the environment too, so no client ever looks for
    # real ones (~/.aws, instance metadata) while talking to moto.
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_ACCESS_KEY_ID"] = S3_KEY
    os.environ["AWS_SECRET_ACCESS_KEY"] = S3_SECRET
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def make_bucket(endpoint: str, name: str | None = None) -> str:
    """Create a bucket on the endpoint and return its name."""
    import boto3  # a moto dependency

    bucket = name or f"vcdl-test-{uuid.uuid4().hex[:16]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_KEY,
        aws_secret_access_key=S3_SECRET,
    )
    client.create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture
def s3_bucket_url(s3_endpoint: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("s3://<fresh bucket>/store", storage_options)`` for one test."""
    bucket = make_bucket(s3_endpoint)
    yield f"s3://{bucket}/store", s3_storage_options(s3_endpoint)
