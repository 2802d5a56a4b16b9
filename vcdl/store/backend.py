"""The weight store's backend: one root URL opened, paths checked against it, calls run.

This module owns the connection of a store to where its bytes live.
:class:`Backend` wraps one root URL: a local directory through Zarr's
``LocalStore``, anything else (``s3://bucket/prefix``...) through its
``FsspecStore`` with a private s3fs client (its transient errors retried,
:mod:`vcdl.store.s3retry`), and a read-only twin of either for reads. It
checks the paths a caller gives against the root (:meth:`Backend.rel`), runs
coroutines on Zarr's I/O loop and turns backend failures into
:class:`StoreError` saying what to check (:meth:`Backend.run`); a missing
bucket is named as such, never reported as a missing group. What a group's
write, read and removal do to the backend is :mod:`vcdl.store.groups`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import zarr
from zarr.core.sync import _get_loop as _zarr_loop
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore

from vcdl.errors import StoreConfigError, StoreError, VcdlError
from vcdl.redact import redact_text, redact_url

_T = TypeVar("_T")

# Protocols whose first path component is a bucket that must exist.
_BUCKET_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}


class Backend:
    """One root URL and the Zarr stores that reach it (see the module).

    ``url`` and ``storage_options`` as for :class:`~vcdl.store.weights.WeightStore`.
    Constructing it does no I/O.
    """

    url: str
    """The normalized root: an absolute directory, or ``scheme://bucket/prefix``."""
    store: LocalStore | FsspecStore
    """The Zarr store of the root, for writes."""
    reader: LocalStore | FsspecStore
    """Its read-only twin: a typo in a reader can never write."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        if isinstance(url, os.PathLike):
            url = os.fspath(url)
        if not isinstance(url, str) or not url:
            raise StoreError(f"store url must be a non-empty string, got {url!r}")
        self._options = dict(storage_options or {})
        self._bucket_checked = False
        if "://" not in url or url.startswith("file://"):
            local = url.removeprefix("file://")
            self.url = os.path.abspath(os.path.expanduser(local))
            self._protocol = "file"
            self.store = LocalStore(self.url)
        else:
            self._protocol, location = url.split("://", 1)
            if not location.strip("/"):
                # "s3://" with its bucket left out: stripped to "s3:", fsspec
                # takes it for a local directory named "s3:" and the run's
                # weights would go to this machine's disk.
                raise StoreConfigError(
                    f"store url {redact_url(url)!r} names nothing after {self._protocol}://; "
                    "give the location after it, e.g. s3://bucket/prefix"
                )
            self.url = url.rstrip("/")
            # A private fs instance: fsspec's instance cache would hand our
            # loop-bound async s3fs client to other code (docs/stack.md).
            options = {"skip_instance_cache": True, **self._options}
            if self._protocol in ("s3", "s3a"):
                # Each tensor is one GET already, fetched concurrently; s3fs's
                # default (max_concurrency > 1) adds a HEAD per GET to plan
                # ranged reads, which doubled read time on the S3 endpoint here.
                options.setdefault("max_concurrency", 1)
                # One retry policy, not two stacked: botocore's own retries
                # (seconds in all) would hide an outage's start from ours, which
                # logs it (vcdl/store/s3retry.py). A user's own setting stands.
                config = dict(options.get("config_kwargs") or {})
                config.setdefault("retries", {"total_max_attempts": 1})
                options["config_kwargs"] = config
            try:
                self.store = FsspecStore.from_url(self.url, storage_options=options)
            except (ValueError, TypeError, ImportError) as exc:
                # An unknown protocol, a driver not installed, a bad option: the
                # config's mistake (exit 2), not the store's.
                raise StoreConfigError(
                    f"cannot open store {redact_url(self.url)!r}: {type(exc).__name__}: "
                    f"{redact_text(str(exc))}; "
                    "check store.url and store.storage_options"
                ) from exc
            except Exception as exc:
                raise StoreError(
                    f"cannot open store {redact_url(self.url)!r}: {type(exc).__name__}: "
                    f"{redact_text(str(exc))}; "
                    "check store.url and store.storage_options"
                ) from exc
        if self._protocol in ("s3", "s3a") and isinstance(self.store, FsspecStore):
            # Imported here: botocore and aiohttp come with s3fs, not with vcdl.
            from vcdl.store import s3retry

            s3retry.install(self.store.fs, f"store {redact_url(self.url)}")
        self.reader = self.store.with_read_only(True)
        if isinstance(self.store, FsspecStore):
            # An asynchronous s3fs leaves closing its HTTP session to its owner;
            # without this every store leaks one until exit ("Unclosed client
            # session").
            weakref.finalize(self, _close_session, self.store.fs)

    # ------------------------------------------------------------------ paths

    def rel(self, path: str, allow_root: bool = False) -> str:
        """``path`` checked and made relative to the root."""
        if not isinstance(path, str):
            raise StoreError(f"store paths are strings, got {type(path).__name__}")
        rel = path
        for root in (self.url, f"file://{self.url}"):
            if rel == root:
                rel = ""
            elif rel.startswith(root + "/"):
                rel = rel[len(root) + 1 :]
        if "://" in rel or rel.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[\\/]", rel):
            raise StoreError(
                f"store path {redact_text(path)!r} is absolute or outside "
                f"{redact_url(self.url)}; "
                "give a '/'-separated path relative to the store root"
            )
        rel = rel.rstrip("/")
        parts = rel.split("/") if rel else []
        for part in parts:
            if part in ("", ".", "..") or part.startswith("__") or "\\" in part:
                raise StoreError(
                    f"invalid store path {path!r}: components may not be empty, '.', '..', "
                    "start with '__' or contain '\\'"
                )
        if not parts and not allow_root:
            raise StoreError("an empty path names the store root; give a group path")
        return rel

    def uri(self, path: str) -> str:
        """Full URI of ``path`` under the root (the root itself for ``""``)."""
        rel = self.rel(path, allow_root=True)
        return f"{self.url}/{rel}" if rel else self.url

    def shown(self, path: str = "") -> str:
        """:meth:`uri` as messages and logs show it: through :func:`~vcdl.redact.redact_url`."""
        return redact_url(self.uri(path))

    def local_dir(self, rel: str) -> str | None:
        """The directory of ``rel`` on a local root (its files moved in place); else None."""
        return os.path.join(self.url, rel) if isinstance(self.store, LocalStore) else None

    # ------------------------------------------------------ running, errors

    def run(self, coro: Coroutine[Any, Any, _T], what: str, uri: str) -> _T:
        """Run ``coro`` on Zarr's I/O loop; backend failures become StoreError."""
        try:
            return sync(coro)
        except VcdlError:
            raise
        except BaseExceptionGroup as group:  # from a TaskGroup: report the first
            first = group.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            if isinstance(first, VcdlError):
                raise first from group
            raise self.backend_error(first, what, uri) from group
        except Exception as exc:
            raise self.backend_error(exc, what, uri) from exc

    def backend_error(self, exc: BaseException, what: str, uri: str) -> StoreError:
        """The :class:`StoreError` for a backend failure while ``what`` ``uri``."""
        # A backend's message may name a URL (an endpoint, a presigned key): redacted too.
        detail = f"{type(exc).__name__}: {redact_text(str(exc))}"
        if isinstance(exc, PermissionError):
            return StoreError(
                f"permission denied {what} {uri}: {detail}; check the credentials "
                "(storage_options key/secret or the environment) and access rights"
            )
        if isinstance(exc, FileNotFoundError) and self._bucket() is not None:
            try:
                sync(self.check_bucket())
            except StoreError as missing:
                return missing
            except Exception:  # the diagnosis failed too; report the original
                pass
        return StoreError(
            f"{what} {uri} failed: {detail}; check store.url and store.storage_options"
        )

    async def check_bucket(self) -> None:
        """Raise a clear StoreError if the store's bucket does not exist (once per store)."""
        bucket = self._bucket()
        if bucket is None or self._bucket_checked:
            return
        assert isinstance(self.store, FsspecStore)
        if not await self.store.fs._exists(bucket):
            raise StoreError(
                f"bucket {bucket!r} does not exist at {self._endpoint()}; "
                f"create it or fix store.url ({redact_url(self.url)})"
            )
        self._bucket_checked = True

    def _bucket(self) -> str | None:
        if self._protocol not in _BUCKET_PROTOCOLS or not isinstance(self.store, FsspecStore):
            return None
        return self.store.path.split("/", 1)[0]

    def _endpoint(self) -> str:
        ep = self._options.get("endpoint_url") or (self._options.get("client_kwargs") or {}).get(
            "endpoint_url"
        )
        return redact_url(ep) if ep else "the default endpoint"


async def in_threads(jobs: Sequence[Callable[[], _T]]) -> list[_T]:
    """Run blocking jobs in Zarr's loop's worker threads; results in order."""
    return list(await asyncio.gather(*(asyncio.to_thread(job) for job in jobs)))


def concurrency() -> int:
    """How many backend requests of one group may be in flight (zarr's ``async.concurrency``)."""
    return max(1, int(zarr.config.get("async.concurrency") or 10))


def _close_session(fs: Any) -> None:
    """Close s3fs's aiobotocore client on Zarr's loop; best effort (runs at GC/exit)."""
    client = getattr(fs, "_s3", None)
    if client is None:
        return

    async def close() -> None:
        await client.close()

    coro = close()
    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the usual case: wait (briefly) for the close
            sync(coro, timeout=2)
        else:  # collected on an event loop thread, maybe Zarr's own: don't block it
            asyncio.run_coroutine_threadsafe(coro, _zarr_loop())
    except Exception:  # the loop is gone (interpreter exit)
        with contextlib.suppress(Exception):
            coro.close()  # never started: no "never awaited" warning
