"""Transient S3 errors retried under vcdl's policy, below Zarr, one request at a time.

This module owns which S3 failures are transient (:func:`transient`) and where
they are retried: every S3 request of a store's s3fs client
(:func:`install`), so a write retries the one chunk or document that failed,
never the whole group, and a read the one object. Every request vcdl makes is
safe to repeat: a PUT of the same key and bytes, a GET, a HEAD, a listing, a
DELETE. A group is published by its ``zarr.json``, written last (one PUT, which
S3 stores whole or not at all), so a result or version written over a link
that fails for good stays unpublished: an orphan the ledger never names, or a
result the driver rejects as torn, never half of one merged.

s3fs and botocore retry a few times themselves (seconds in all; s3fs not at
all after a refused connection); the policy here (:mod:`vcdl.transient`) goes
on for at least a minute, pausing on Zarr's I/O loop without blocking it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from http.client import IncompleteRead
from typing import Any, Final

import aiohttp
from botocore import exceptions as boto

from vcdl.errors import VcdlError
from vcdl.transient import DEFAULT_POLICY, RetryPolicy, outage, retry_async

# S3 error codes that say "later", whatever their HTTP status.
_LATER_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "RequestLimitExceeded",
    }
)

# Set while a request is being retried here, so that the requests it makes
# inside (a GET's body read wraps the GET) are not retried a second time.
_RETRYING: contextvars.ContextVar[bool] = contextvars.ContextVar("vcdl_s3_retrying", default=False)


def transient(error: BaseException) -> bool:
    """Whether ``error`` from an S3 request may pass: a refused, reset or timed-out
    connection, a broken response body, a 5xx or throttling answer. A missing key, a
    denied permission, a TLS certificate refused and vcdl's own errors (a checksum) are
    not."""
    if isinstance(
        error,
        VcdlError | FileNotFoundError | PermissionError | boto.SSLError | aiohttp.ClientSSLError,
    ):
        return False
    if isinstance(
        error,
        boto.ConnectionError
        | boto.HTTPClientError
        | aiohttp.ClientConnectionError
        | aiohttp.ClientPayloadError
        | ConnectionError
        | TimeoutError
        | IncompleteRead,
    ):
        return True
    # s3fs turns an error answer it has no mapping for into OSError(EIO), the
    # answer as its cause.
    answer = error if isinstance(error, boto.ClientError) else error.__cause__
    if isinstance(answer, boto.ClientError):
        info = answer.response.get("Error", {})
        status = answer.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return info.get("Code") in _LATER_CODES or int(status) >= 500
    return False


def install(fs: Any, name: str, policy: RetryPolicy = DEFAULT_POLICY) -> None:
    """Retry the transient errors of every request of the s3fs client ``fs`` (its own
    instance, not shared) under ``policy``; outages logged as ``name``."""
    service = outage(name)

    def retrying(call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _RETRYING.get():
                return await call(*args, **kwargs)
            token = _RETRYING.set(True)
            try:
                return await retry_async(lambda: call(*args, **kwargs), transient, service, policy)
            finally:
                _RETRYING.reset(token)

        return wrapper

    # _call_s3 is every S3 request; _cat_file also reads a GET's body after it.
    fs._call_s3 = retrying(fs._call_s3)
    fs._cat_file = retrying(fs._cat_file)
