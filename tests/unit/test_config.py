"""The run config: defaults, validation messages, overrides, TOML loading."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from vcdl.config import RunConfig, parse_config
from vcdl.config_files import apply_overrides, load_config, resolve_home
from vcdl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_valid_and_frozen() -> None:
    cfg = RunConfig()
    assert cfg.merge.alpha == 0.5 and cfg.data.shards == 8
    with pytest.raises(ValidationError):
        cfg.merge.alpha = 0.3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"merge": {"alpah": 0.5}}, "merge.alpah: unknown key (allowed: rule, alpha"),
        ({"bogus": {}}, "bogus: unknown key"),
        ({"merge": {"alpha": 1.5}}, "merge.alpha: Input should be less than or equal to 1"),
        ({"merge": {"alpha": -0.1}}, "merge.alpha"),
        ({"data": {"shards": 0}}, "data.shards: Input should be greater than or equal to 1"),
        ({"train": {"lr": -1}}, "train.lr: Input should be greater than 0"),
        # A number must be one: pydantic's lax mode took "1" for 1 and true for 1.
        ({"train": {"batch_size": "big"}}, "train.batch_size: must be a number"),
        ({"train": {"optimizer": "lbfgs"}}, "train.optimizer"),
        ({"merge": {"schedule": "linear"}}, "alpha_end is required"),
        ({"merge": {"schedule": "list", "alphas": [0.5, 2.0]}}, "outside [0, 1]"),
        ({"merge": {"staleness": "reject"}}, "max_staleness is required"),
        ({"data": {"cache_mb": -1}}, "data.cache_mb: Input should be greater than or equal to 0"),
        ({"run": {"name": "bad name!"}}, "run.name"),
        (
            {"ledger": {"url": "postgresql+psycopg://u:s3cret@h/db"}},
            "must not contain credentials (password)",
        ),
        ({"store": {"storage_options": {"secret": "x"}}}, "must not hold credentials (secret)"),
    ],
)
def test_invalid_configs_name_the_key(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    msg = str(info.value)
    assert needle in msg
    assert "\n" not in msg
    assert "s3cret" not in msg


def test_overrides_parse_toml_values() -> None:
    data = apply_overrides(
        {"train": {"lr": 0.1}}, ["train.lr=0.01", "run.name=abc", "merge.alphas=[0.5, 0.9]"]
    )
    assert data == {"train": {"lr": 0.01}, "run": {"name": "abc"}, "merge": {"alphas": [0.5, 0.9]}}


@pytest.mark.parametrize("item", ["nodot=1", "train.lr", ".x=1"])
def test_bad_override_rejected(item: str) -> None:
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        apply_overrides({}, [item])


def test_load_examples() -> None:
    cfg = load_config(REPO / "examples" / "mnist1d.toml")
    assert cfg.run.name == "mnist1d" and cfg.model.kwargs == {"width": 64}
    assert load_config(REPO / "examples" / "digits.toml").data.name == "digits"


def test_name_defaults_to_file_stem(tmp_path: Path) -> None:
    p = tmp_path / "my exp.toml"
    p.write_text("[run]\nepochs = 2\n")
    assert load_config(p).run.name == "my-exp"


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nepochs = 2\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_locations_resolve_under_home(tmp_path: Path) -> None:
    cfg = RunConfig().with_locations(tmp_path)
    assert cfg.store.url == str(tmp_path / "store")
    assert cfg.ledger.url == f"sqlite:///{tmp_path / 'ledger.db'}"
    explicit = RunConfig.model_validate({"store": {"url": "s3://b/p"}}).with_locations(tmp_path)
    assert explicit.store.url == "s3://b/p"


def test_home_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("VCDL_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_home() == tmp_path / ".vcdl"
    monkeypatch.setenv("VCDL_HOME", str(tmp_path / "h"))
    assert resolve_home() == tmp_path / "h"
    assert resolve_home(tmp_path / "o") == tmp_path / "o"


def test_config_json_roundtrip() -> None:
    cfg = load_config(REPO / "examples" / "mnist1d.toml")
    assert RunConfig.model_validate_json(cfg.model_dump_json()) == cfg


def test_global_batch_size_is_every_workers_batch_together() -> None:
    cfg = RunConfig.model_validate({"train": {"batch_size": 30}, "cluster": {"workers": 3}})
    assert cfg.global_batch_size == 90
    assert "global_batch_size" not in cfg.model_dump()  # derived, never a setting


def test_split_cache_default() -> None:
    assert parse_config({}).data.cache_mb == 256
    assert parse_config({"data": {"cache_mb": 0}}).data.cache_mb == 0


@pytest.mark.parametrize("section", ["store", "ledger"])
def test_a_location_with_a_nul_byte_is_a_config_error(section: str) -> None:
    # Found by the config fuzz: store.url "\x00" passed the config and failed
    # when the store opened, as a run-time error (exit 1) instead of exit 2.
    url = "sqlite:///a\x00b.db" if section == "ledger" else "dir\x00/store"
    with pytest.raises(ConfigError, match="without a NUL byte") as info:
        parse_config({section: {"url": url}})
    assert info.value.exit_code == 2


def test_a_local_store_with_a_name_over_the_file_system_limit_is_a_config_error() -> None:
    # Found by the config fuzz: a 4000-character store.url failed when the store
    # opened ("File name too long"), exit 1 instead of exit 2.
    with pytest.raises(ConfigError, match="longer than 255 bytes") as info:
        parse_config({"store": {"url": "x" * 4000}})
    assert info.value.exit_code == 2
    assert parse_config({"store": {"url": "s3://bucket/" + "x" * 200}}).store.url


def test_fold_is_bounded_and_cannot_keep_every_version() -> None:
    assert parse_config({}).merge.fold == 1  # off unless asked for
    assert parse_config({"merge": {"fold": 4}}).merge.fold == 4
    with pytest.raises(ConfigError, match=r"merge\.fold"):
        parse_config({"merge": {"fold": 0}})
    # A fold writes only its last version: keeping every version's weights cannot hold.
    with pytest.raises(ConfigError, match=r"merge\.fold above 1 .* store\.keep\.all"):
        parse_config({"merge": {"fold": 4}, "store": {"keep": {"all": True}}})
