"""Prefect's settings and API client, made once per Dask worker, not once per task.

prefect-dask sends every task the submitting flow's context, its Prefect
settings as a plain dict; the worker's task engine validates that dict into a
new ``Settings`` before the task body runs: 54 nested pydantic-settings models,
each reading the environment and the dotenv files again; and it opens two new
API clients, each loading the CA bundle into an SSL context. Profiled on a
Dask worker of this machine that was about 0.15 + 0.06 s of the engine's
0.27 s per task, paid again at every epoch barrier while both workers idle
(docs/benchmark-history.md; ``benchmarks/task_engine.py`` measures it).

:class:`VcdlDaskClient` submits each task through :func:`run_with_settings`,
which hands the engine a ``Settings`` built from an equal dict before: built
exactly as the engine would build it (the dict, then the worker's own
environment for what the dict leaves unset), once per worker process and
distinct dict, and the worker thread's one open API client for those
settings. The dict travels beside the context, not inside an object that
unpickles into settings: the Dask scheduler unpickles every task too (in the
driver's process for a LocalCluster), where such an object would be built from
the scheduler's environment and sent on built.
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
        return super().submit(run_with_settings, func, settings_key(data), data, *args, **kwargs)


class VcdlDaskClient(PrefectDaskClient, _SettingsOnce):
    """prefect-dask's client, whose tasks rebuild Prefect's settings once per worker."""
