"""Every store URL a message or a log shows goes through redact_url (issue 34, item 3).

The config refuses credentials in ``store.url`` and its options, but a store
opened in Python takes any URL: a password or a signed query in it, or in an
endpoint, never reaches an error message, a repr or the CLI's output.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vcdl.errors import StoreConfigError, StoreError
from vcdl.store import WeightStore

SECRET = "st0re-S3CRET"


def test_a_store_that_cannot_open_never_shows_its_password() -> None:
    with pytest.raises(StoreConfigError) as info:
        WeightStore(f"nosuchproto://user:{SECRET}@host/prefix?token={SECRET}")
    message = str(info.value)
    assert SECRET not in message and "user:***@host" in message and "token=***" in message


def test_shown_and_repr_are_redacted(tmp_path: Path) -> None:
    store = WeightStore(str(tmp_path / f"dir?password={SECRET}"))
    assert SECRET not in store.shown("a/b") and SECRET not in repr(store)
    assert SECRET in store.uri("a/b")  # the real one, for I/O
    with pytest.raises(StoreError) as info:
        store.read_state(f"s3://u:{SECRET}@h/x")
    assert SECRET not in str(info.value)


def test_errors_reading_and_writing_show_the_redacted_uri(tmp_path: Path) -> None:
    store = WeightStore(str(tmp_path / f"d?token={SECRET}"))
    with pytest.raises(StoreError) as info:
        store.read_state("nothing/here")
    assert SECRET not in str(info.value) and "token=***" in str(info.value)
    with pytest.raises(StoreError) as info:
        store.write_state("v", {"w": "not a tensor"})  # type: ignore[dict-item]
    assert SECRET not in str(info.value)
    uri = store.write_state("v", {"w": torch.zeros(2)})
    assert uri == store.uri("v")  # what write_state returns stays the real URI
    assert not store.reader("v").uri.count(SECRET)
