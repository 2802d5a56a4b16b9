"""Secrets are refused in configs (at any depth, in any part of a URL) and redacted when shown."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vcdl.config import parse_config
from vcdl.config_files import apply_overrides
from vcdl.errors import ConfigError
from vcdl.redact import MASK, redact_text, redact_url, redact_value, secret_keys, url_secrets

SECRET = "s3cr3t-Pl4nted"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            f"postgresql+psycopg://vcdl:{SECRET}@db:5432/vcdl?pool_size=2",
            "postgresql+psycopg://vcdl:***@db:5432/vcdl?pool_size=2",
        ),
        (
            f"postgresql://vcdl@db/vcdl?sslmode=require&password={SECRET}",
            "postgresql://vcdl@db/vcdl?sslmode=require&password=***",
        ),
        (f"s3://AKIA:{SECRET}@bucket/prefix", "s3://AKIA:***@bucket/prefix"),
        (
            f"s3://bucket/p?X-Amz-Signature={SECRET}&x=1&token={SECRET}",
            "s3://bucket/p?X-Amz-Signature=***&x=1&token=***",
        ),
        (f"https://h/p?api_key={SECRET}#frag", "https://h/p?api_key=***#frag"),
        ("sqlite:////abs/path/ledger.db", "sqlite:////abs/path/ledger.db"),
        ("/a/plain/path", "/a/plain/path"),
        ("postgresql://vcdl@db:5432/vcdl", "postgresql://vcdl@db:5432/vcdl"),
        (f"postgresql://u:{SECRET}@h:notaport/db", "<unparseable postgresql URL>"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert SECRET not in redact_url(url)


def test_url_secrets_name_where_never_what() -> None:
    found = url_secrets(f"postgresql://u:{SECRET}@h/db?sslpassword={SECRET}&key={SECRET}")
    assert found == ["password", "query parameter 'sslpassword'", "query parameter 'key'"]
    assert url_secrets("postgresql://u@h/db?sslmode=require") == []
    assert url_secrets("s3://bucket/prefix") == []


def test_secret_keys_at_any_depth() -> None:
    options = {
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "x", "config": {"aws_session_token": SECRET}},
        "profiles": [{"name": "a"}, {"Secret-Key": SECRET}],
        "proxy": f"http://u:{SECRET}@proxy:3128",
        "anon": False,
    }
    assert secret_keys(options) == [
        "client_kwargs.config.aws_session_token",
        "profiles[1].Secret-Key",
        "proxy",
    ]
    assert secret_keys({"endpoint_url": "http://h:9000", "use_ssl": True}) == []


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (
            {"store": {"storage_options": {"client_kwargs": {"aws_secret_access_key": SECRET}}}},
            "client_kwargs.aws_secret_access_key",
        ),
        ({"store": {"storage_options": {"config_kwargs": [{"token": SECRET}]}}}, "token"),
        ({"store": {"url": f"s3://AKIA:{SECRET}@bucket/p"}}, "password"),
        ({"store": {"url": f"s3://bucket/p?token={SECRET}"}}, "query parameter 'token'"),
        (
            {"ledger": {"url": f"postgresql+psycopg://u@h/db?password={SECRET}"}},
            "query parameter 'password'",
        ),
        ({"ledger": {"url": f"postgresql+psycopg://u:{SECRET}@h/db"}}, "password"),
    ],
)
def test_config_refuses_planted_secrets_in_one_line(data: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    message = str(info.value)
    assert "\n" not in message and SECRET not in message
    assert "must not" in message and where in message


def test_a_bad_set_never_echoes_its_value() -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides({}, [f"ledger=postgresql://u:{SECRET}@h/db"])
    assert SECRET not in str(info.value) and "ledger" in str(info.value)


def test_redact_text_masks_every_url_in_a_message() -> None:
    text = (
        f"cannot open postgresql://u:{SECRET}@h/db and s3://b/p?token={SECRET}; "
        "see sqlite:////tmp/l.db"
    )
    shown = redact_text(text)
    assert SECRET not in shown
    assert "postgresql://u:***@h/db" in shown and "s3://b/p?token=***;" in shown
    assert "sqlite:////tmp/l.db" in shown


PLANTED = "Pl4nted-Secr3t"


def test_redact_value_masks_credentials_at_any_depth_and_keeps_the_rest() -> None:
    value = {
        "config": {
            "run": {"name": "r", "epochs": 3},
            "store": {
                "url": f"s3://b/p?token={PLANTED}&region=eu",
                "storage_options": {"secret": PLANTED, "endpoint_url": "http://h:9000"},
            },
            "ledger": {"url": f"postgresql+psycopg://u:{PLANTED}@h/db"},
            "list": [{"api_key": PLANTED}, 1, None],
        },
        "home": "/tmp/h",
        "chaos": None,
    }
    out = redact_value(value)
    assert PLANTED not in json.dumps(out)
    assert out["config"]["run"] == {"name": "r", "epochs": 3} and out["home"] == "/tmp/h"
    assert out["config"]["store"]["storage_options"] == {
        "secret": MASK,
        "endpoint_url": "http://h:9000",
    }
    assert out["config"]["store"]["url"] == f"s3://b/p?token={MASK}&region=eu"
    assert out["config"]["ledger"]["url"] == f"postgresql+psycopg://u:{MASK}@h/db"
    assert out["config"]["list"] == [{"api_key": MASK}, 1, None]
    assert value["config"]["store"]["storage_options"]["secret"] == PLANTED  # not mutated


_json = st.recursive(
    # No "//" in the texts: a URL is another test's (redact_url)
    st.none() | st.booleans() | st.integers() | st.text(alphabet="ab:. ", max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["a", "name", "token", "x_key", "pwd", "b"]), inner, max_size=3
        )
    ),
    max_leaves=12,
)


@given(value=_json)
def test_redact_value_leaves_no_value_under_a_credential_key(value: object) -> None:
    out = redact_value(value)

    def under_secret_keys(v: object) -> list[object]:
        if isinstance(v, dict):
            return [x for k, x in v.items() if k in ("token", "x_key", "pwd") and x is not None] + [
                y
                for k, x in v.items()
                if k not in ("token", "x_key", "pwd")
                for y in under_secret_keys(x)
            ]
        if isinstance(v, list):
            return [y for x in v for y in under_secret_keys(x)]
        return []

    assert all(x == MASK for x in under_secret_keys(out))
    # Without credential keys, a value is returned as it is.
    if not under_secret_keys(value):
        assert out == value
