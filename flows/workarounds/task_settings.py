"""Prefect's settings and API client, made once per Dask worker, not once per task.

prefect-dask sends every task the submitting flow's context, its Prefect
settings as a plain dict; the worker's task engine validates that dict into a
new ``Settings`` before the task body runs: 54 nested pydantic-settings models,
each reading the environment and the dotenv files again; and it opens two new
API clients, each loading the CA bundle into an SSL context. Profiled on a
Dask worker of this machine that was about 0.15 + 0.06 s of the engine's
0.27 s per task, paid again at every epoch barrier while both workers idle
(docs/results.md, "Prefect's task engine"; ``benchmarks/task_engine.py`` measures it).

:class:`VcdlDaskClient` submits each task through :func:`run_with_settings`,
which hands the engine a ``Settings`` built from an equal dict before: built
exactly as the engine would build it (the dict, then the worker's own
environment for what the dict leaves unset), once per worker process and
distinct dict, and the worker thread's one open API client for those
settings. The dict travels beside the context, not inside an object that
unpickles into settings: the Dask scheduler unpickles every task too (in the
driver's process for a LocalCluster), where such an object would be built from
the scheduler's environment and sent on built.

The submitting side has the mirror-image cost: prefect-dask serializes the
flow's ``SettingsContext`` for every task it submits (``model_dump`` of the
same 54 models, secrets rendered: ~12 ms of the driver's CPU per submission
here, a quarter of the driver's busy time in part (a) of
``benchmarks/time_to_accuracy.py``, on the cores the workers train on).
While :class:`VcdlDaskClient` submits a task, a settings context is
serialized once and the result reused for as long as that context object is
the current one; anything else that serializes settings gets Prefect's
method unchanged.

Works around Prefect 3.8 with prefect-dask 0.3.7 (a patch of
``SettingsContext.serialize`` while vcdl's client submits). Guarded by
``tests/unit/test_task_context.py`` and ``tests/integration/test_shared_runner.py``;
re-measure with ``benchmarks/task_engine.py`` when either moves.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from dask.utils import funcname
from distributed import Client
from prefect.context import SettingsContext, SyncClientContext
from prefect.settings import Settings
from prefect.tasks import Task
from prefect_dask.client import PrefectDaskClient

#: Distinct settings one worker process keeps built (a run has one or two).
MAX_BUILT = 8

_built: dict[str, Settings] = {}
_lock = threading.Lock()
_thread = threading.local()  # each Dask worker thread's open API clients

# -- the submitting side (the driver) -----------------------------------------

_prefect_serialize = SettingsContext.serialize
_submitting = threading.local()  # set while VcdlDaskClient submits a task in this thread
# (id of a SettingsContext, include_secrets) -> (that context, its serialization,
# its settings_key): the context is held so that its id is not reused meanwhile.
_serialized: dict[tuple[int, bool], tuple[SettingsContext, dict[str, Any], str]] = {}


def _serialize_once(self: SettingsContext, include_secrets: bool = True) -> dict[str, Any]:
    """Prefect's ``SettingsContext.serialize``, memoized while VcdlDaskClient submits.

    The memo hands every submission the same dict: prefect-dask and
    :class:`_SettingsOnce` only read it (and Dask pickles a copy per task).
    """
    if not getattr(_submitting, "active", False):
        return _prefect_serialize(self, include_secrets=include_secrets)
    memo_key = (id(self), include_secrets)
    with _lock:
        hit = _serialized.get(memo_key)
    if hit is not None and hit[0] is self:
        return hit[1]
    value = _prefect_serialize(self, include_secrets=include_secrets)
    data = value.get("settings")
    key = settings_key(data) if isinstance(data, dict) else ""  # hashed outside the lock
    with _lock:
        if len(_serialized) >= MAX_BUILT:
            _serialized.clear()
        _serialized[memo_key] = (self, value, key)
    return value


def _memo_settings_key(data: dict[str, Any]) -> str:
    """``settings_key(data)``, without hashing it again when it came from the memo."""
    with _lock:
        for _, value, key in _serialized.values():
            if value.get("settings") is data and key:
                return key
    return settings_key(data)


SettingsContext.serialize = _serialize_once  # type: ignore[method-assign]


def settings_key(data: dict[str, Any]) -> str:
    """A digest that two equal serialized settings share (pure)."""
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def built_settings(key: str, data: dict[str, Any]) -> Settings:
    """The ``Settings`` for ``data``: built on the first call in this process, then kept."""
    with _lock:
        settings = _built.get(key)
    if settings is None:
        settings = Settings(**data)  # what the engine's SettingsContext(**context) does
        with _lock:
            if len(_built) >= MAX_BUILT:
                _built.clear()
            _built[key] = settings
    return settings


def _thread_client(key: str, settings_context: dict[str, Any]) -> SyncClientContext:
    """This thread's open API client for these settings, made on its first task."""
    clients: dict[str, SyncClientContext] = _thread.__dict__.setdefault("clients", {})
    client_context = clients.get(key)
    if client_context is None:
        with SettingsContext(**settings_context):  # the API URL and auth of these settings
            client_context = SyncClientContext()
        # Entered as the engine would, and never left: it serves this thread's
        # next tasks (an httpx client cannot be reopened once closed).
        client_context.client.__enter__()
        if settings_context["settings"].client.server_version_check_enabled:
            client_context.client.raise_for_api_version_mismatch_once()
        if len(clients) >= MAX_BUILT:
            for old in clients.values():
                old.client.__exit__(None, None, None)
            clients.clear()
        clients[key] = client_context
    return client_context


def run_with_settings(
    wrapped: Any, key: str, data: dict[str, Any], /, **kwargs: Any
) -> Any:  # runs on the worker
    """Run prefect-dask's wrapper with the built settings and this thread's API client.

    The engine otherwise opens two API clients per task, each loading the CA
    bundle into a new SSL context (~0.03 s apiece here), plain HTTP or not;
    it takes the client of the current ``SyncClientContext`` when there is one.
    """
    context = kwargs["context"]
    settings_context = {**context["settings_context"], "settings": built_settings(key, data)}
    context["settings_context"] = settings_context
    token = SyncClientContext.__var__.set(_thread_client(key, settings_context))
    try:
        return wrapped(**kwargs)
    finally:
        SyncClientContext.__var__.reset(token)


class _SettingsOnce(Client):
    """After PrefectDaskClient in the MRO: sees the call it built for a Prefect task."""

    def submit(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        # prefect-dask's wrapper of a task (functools.wraps) is the only call
        # whose ``context`` is Prefect's serialized context.
        is_task = isinstance(getattr(func, "__wrapped__", None), Task)
        context = kwargs.get("context") if is_task else None
        settings_context = context.get("settings_context") if isinstance(context, dict) else None
        data = settings_context.get("settings") if isinstance(settings_context, dict) else None
        if not isinstance(data, dict):  # anything else goes as it came
            return super().submit(func, *args, **kwargs)
        assert isinstance(context, dict) and isinstance(settings_context, dict)
        kwargs["context"] = {**context, "settings_context": {**settings_context, "settings": None}}
        if kwargs.get("key") is None:
            # The key Dask would give the wrapper (its task's name), unique per
            # task run: not the name of the function below for every task.
            kwargs["key"] = f"{funcname(func)}-{kwargs['task_run_id'].hex}"
        key = _memo_settings_key(data)
        return super().submit(run_with_settings, func, key, data, *args, **kwargs)


class VcdlDaskClient(PrefectDaskClient, _SettingsOnce):
    """prefect-dask's client: settings serialized once per run, rebuilt once per worker."""

    def submit(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(func, Task):
            return super().submit(func, *args, **kwargs)
        # prefect-dask serializes the current context in here (_serialize_once).
        _submitting.active = True
        try:
            return super().submit(func, *args, **kwargs)
        finally:
            _submitting.active = False
