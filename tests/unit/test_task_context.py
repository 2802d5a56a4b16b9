"""flows.workarounds.task_settings: Prefect's settings built once per worker and distinct dict."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prefect.context import SyncClientContext

from flows.workarounds import task_settings as task_context
from flows.workarounds.task_settings import built_settings, run_with_settings, settings_key

_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_dicts = st.dictionaries(st.text(max_size=6), _values, max_size=5)


@given(_dicts)
def test_the_key_ignores_order_and_survives_a_pickle(data: dict[str, Any]) -> None:
    reordered = dict(reversed(list(data.items())))
    assert settings_key(reordered) == settings_key(data)
    assert settings_key(pickle.loads(pickle.dumps(data))) == settings_key(data)


@given(_dicts, st.text(min_size=1, max_size=6))
def test_a_different_dict_has_a_different_key(data: dict[str, Any], extra: str) -> None:
    changed = {**data, "\0" + extra: 1}
    assert settings_key(changed) != settings_key(data)


def test_settings_are_built_once_per_dict_with_this_processs_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(task_context, "_built", {})
    monkeypatch.setenv("PREFECT_CLIENT_MAX_RETRIES", "9")
    data = {"logging": {"level": "DEBUG"}}
    first = built_settings(settings_key(data), data)
    assert first.logging.level == "DEBUG"  # from the dict
    assert first.client.max_retries == 9  # unset in the dict: this process's environment
    assert built_settings(settings_key(data), data) is first
    other = {"logging": {"level": "ERROR"}}
    assert built_settings(settings_key(other), other) is not first


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_context, "_built", {})
    for i in range(task_context.MAX_BUILT + 3):
        data = {"client": {"max_retries": i}}
        built_settings(settings_key(data), data)
        assert len(task_context._built) <= task_context.MAX_BUILT


def test_the_wrapper_hands_the_engine_built_settings_and_the_threads_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(task_context, "_built", {})
    monkeypatch.setattr(task_context, "_thread", threading.local())
    # An API nobody serves: the client is made, never used (no version check).
    data = {
        "api": {"url": "http://127.0.0.1:9/api"},
        "client": {"server_version_check_enabled": False},
        "logging": {"level": "DEBUG"},
    }
    seen: list[dict[str, Any]] = []

    def engine(**kwargs: Any) -> str:  # stands in for prefect-dask's wrapper of the engine
        seen.append(kwargs | {"client": SyncClientContext.get()})
        return "done"

    def call() -> str:
        context = {"settings_context": {"profile": {"name": "x"}, "settings": None}, "other": 1}
        return run_with_settings(engine, settings_key(data), data, task="t", context=context)

    assert call() == "done" and call() == "done"
    other_thread = threading.Thread(target=call)
    other_thread.start()
    other_thread.join()
    first, second, third = seen
    assert first["task"] == "t" and first["context"]["other"] == 1
    settings_context = first["context"]["settings_context"]
    assert settings_context["profile"] == {"name": "x"}
    assert settings_context["settings"] is task_context._built[settings_key(data)]
    assert settings_context["settings"].logging.level == "DEBUG"
    # One open client per thread, on the settings' API, shared by its tasks.
    assert first["client"] is second["client"] is not third["client"]
    assert str(first["client"].client.api_url) == "http://127.0.0.1:9/api/"
    assert SyncClientContext.get() is None  # set only while the task runs


def test_submissions_serialize_a_settings_context_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.context import SettingsContext
    from prefect.settings import temporary_settings
    from prefect.settings.models.root import Settings as PrefectSettings

    monkeypatch.setattr(task_context, "_serialized", {})
    context = SettingsContext.get()
    assert context is not None
    prefect_own = task_context._prefect_serialize(context)
    # Outside a submission: Prefect's method, a fresh dict each time.
    assert context.serialize() is not context.serialize()
    assert context.serialize() == prefect_own
    monkeypatch.setattr(task_context._submitting, "active", True, raising=False)
    first = context.serialize()
    assert first == prefect_own and context.serialize() is first
    assert task_context._memo_settings_key(first["settings"]) == settings_key(
        prefect_own["settings"]
    )
    # An equal dict that is not the memo's is hashed, to the same key.
    assert task_context._memo_settings_key(dict(first["settings"])) == settings_key(
        first["settings"]
    )
    # Another settings context (temporary settings): serialized afresh, its own values.
    with temporary_settings({"PREFECT_CLIENT_MAX_RETRIES": 7}):
        other = SettingsContext.get()
        assert other is not None and other is not context
        changed = other.serialize()
        assert changed is not first and changed["settings"]["client"]["max_retries"] == 7
        assert PrefectSettings(**changed["settings"]).client.max_retries == 7
    assert context.serialize() is first


def test_the_client_marks_only_its_own_task_submissions(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect import task
    from prefect_dask.client import PrefectDaskClient

    seen: list[bool] = []

    def fake_submit(self: Any, func: Any, *args: Any, **kwargs: Any) -> str:
        seen.append(getattr(task_context._submitting, "active", False))
        return "future"

    monkeypatch.setattr(PrefectDaskClient, "submit", fake_submit)
    client = object.__new__(task_context.VcdlDaskClient)  # no cluster: only submit's wrapping

    @task
    def shard() -> None:
        return None

    assert client.submit(shard) == "future" and client.submit(len, [1]) == "future"
    assert seen == [True, False]
    assert getattr(task_context._submitting, "active", False) is False
