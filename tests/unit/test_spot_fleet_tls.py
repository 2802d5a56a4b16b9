"""docs/spot-fleet.md's TLS commands and config are the ones tests/integration/test_tls.py runs.

The integration test builds its commands with tests/tlsservers.py and its
run config from the doc's TOML block; here each command the doc shows is
compared with the beginning of the command that test runs, with the doc's
placeholders for addresses and files, and the TOML block is checked as a
run config.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.spotfleetdoc import CA_FILE, SCHEDULER, TLS_DIR, Command, commands, config_text
from tests.tlscerts import Leaf
from tests.tlsservers import dask_client_env, prefect_argv, scheduler_argv, worker_argv
from vcdl.config import parse_config
from vcdl.errors import ConfigError


def _leaf(name: str) -> Leaf:
    return Leaf(Path(f"{TLS_DIR}/{name}.pem"), Path(f"{TLS_DIR}/{name}-key.pem"))


def _begins(doc: Command, tested: list[str]) -> None:
    assert doc.argv == tested[: len(doc.argv)], (doc.argv, tested)


def _by_program() -> dict[str, list[Command]]:
    found: dict[str, list[Command]] = {}
    for command in commands():
        key = " ".join(command.argv[:2]) if command.argv else "export"
        found.setdefault(key, []).append(command)
    return found


def test_the_servers_and_workers_are_started_as_the_test_starts_them() -> None:
    shown = _by_program()
    (scheduler,) = shown["dask scheduler"]
    _begins(scheduler, scheduler_argv("10.0.0.11", 8786, Path(CA_FILE), _leaf("scheduler")))
    (worker,) = shown["dask worker"]
    _begins(worker, worker_argv(SCHEDULER, "$(hostname)", Path(CA_FILE), _leaf("worker")))
    (prefect,) = shown["prefect server"]
    _begins(prefect, prefect_argv("10.0.0.10", 4200))
    assert list(prefect.env) == ["PREFECT_SERVER_API_AUTH_STRING"]


def test_the_driver_and_the_workers_get_what_the_test_gives_them() -> None:
    exported = _by_program()["export"]
    names = [name for command in exported for name in command.env]
    client = dask_client_env(Path(CA_FILE), _leaf("client"))
    assert {k: v for c in exported for k, v in c.env.items() if k.startswith("DASK_")} == client
    # Workers, then the driver: each gets the Prefect API, its auth string and the password.
    for name in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PGPASSWORD"):
        assert names.count(name) == 2, name
    (train,) = _by_program()["vcdl train"]
    assert train.argv == ["vcdl", "train", "run-tls.toml"]


def test_the_run_config_is_valid_and_uses_tls_everywhere() -> None:
    cfg = parse_config(tomllib.loads(config_text()))
    assert cfg.cluster.address == SCHEDULER
    assert cfg.store.storage_options["client_kwargs"] == {"verify": CA_FILE}
    assert str(cfg.store.storage_options["endpoint_url"]).startswith("https://")
    assert cfg.ledger.url is not None
    assert cfg.ledger.url.endswith(f"?sslmode=verify-full&sslrootcert={CA_FILE}")


def test_the_ledger_urls_tls_files_are_allowed_and_a_key_passphrase_is_not() -> None:
    """Paths are no secrets (they are recorded with the config); libpq's sslpassword is."""
    base = "postgresql+psycopg://vcdl@db.internal:5432/vcdl?sslmode=verify-full"
    files = f"&sslrootcert={CA_FILE}&sslcert={TLS_DIR}/client.pem&sslkey={TLS_DIR}/client-key.pem"
    assert parse_config({"ledger": {"url": base + files}}).ledger.url == base + files
    with pytest.raises(ConfigError) as info:
        parse_config({"ledger": {"url": base + files + "&sslpassword=Key-Passphrase-1"}})
    assert "sslpassword" in str(info.value) and "Key-Passphrase-1" not in str(info.value)
