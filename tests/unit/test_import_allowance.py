"""No module is imported unless the operator allows it (docs/design.md §7).

Built-in models and objectives always work; any other import path only for
modules under a prefix of ``$VCDL_ALLOW_IMPORTS`` or granted in the process
by a trusted caller. The check comes before anything is imported: a module
whose import would write a marker file never runs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vcdl.config import RunConfig, parse_config
from vcdl.errors import ConfigError, ModelError
from vcdl.models import build_model
from vcdl.objectives import objective_for
from vcdl.runcode import run_check
from vcdl.usercode import (
    ALLOW_ENV,
    check_allowed,
    env_allowance,
    grant,
    grant_beside_config,
    granted,
    revoke_grants,
)

MARKER_MODULE = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")

def make(**kwargs):
    import torch
    pathlib.Path({marker!r}).write_text("called")
    return torch.nn.Linear(2, 2)
"""


@pytest.fixture
def no_grants() -> Iterator[None]:
    before = granted()
    revoke_grants()
    yield
    revoke_grants()
    grant(before)


@pytest.fixture
def marker_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    marker = tmp_path / "marker.txt"
    (tmp_path / "vcdl_marker_mod.py").write_text(MARKER_MODULE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop("vcdl_marker_mod", None)


def test_env_allowance_parses_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_ENV, " a.b , c,, * ")
    assert env_allowance() == ("a.b", "c", "*")
    monkeypatch.delenv(ALLOW_ENV)
    assert env_allowance() == ()


def test_without_allowance_nothing_is_imported(
    marker_module: Path, monkeypatch: pytest.MonkeyPatch, no_grants: None
) -> None:
    monkeypatch.setenv(ALLOW_ENV, "tests")
    with pytest.raises(ModelError) as info:
        build_model("vcdl_marker_mod:make")
    message = str(info.value)
    assert "\n" not in message and ALLOW_ENV in message and "vcdl_marker_mod" in message
    assert "vcdl_marker_mod" not in sys.modules
    assert not marker_module.exists()


@pytest.mark.parametrize("allow", ["vcdl_marker_mod", "*", "other,vcdl_marker_mod"])
def test_with_allowance_the_factory_runs(
    allow: str, marker_module: Path, monkeypatch: pytest.MonkeyPatch, no_grants: None
) -> None:
    monkeypatch.setenv(ALLOW_ENV, allow)
    build_model("vcdl_marker_mod:make")
    assert marker_module.read_text() == "called"


def test_a_prefix_is_a_whole_module_name(monkeypatch: pytest.MonkeyPatch, no_grants: None) -> None:
    monkeypatch.setenv(ALLOW_ENV, "vcdl_marker")
    with pytest.raises(ModelError, match=ALLOW_ENV):
        check_allowed("vcdl_marker_mod:make", what="model factory", builtins={}, error=ModelError)
    monkeypatch.setenv(ALLOW_ENV, "pkg")
    check_allowed("pkg.sub.mod:f", what="model factory", builtins={}, error=ModelError)


def test_stdlib_paths_are_refused_before_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_grants: None
) -> None:
    monkeypatch.setenv(ALLOW_ENV, "tests")
    marker = tmp_path / "touched"
    with pytest.raises(ModelError, match=f"module 'os' is not allowed.*{ALLOW_ENV}"):
        build_model("os:system", {"command": f"touch {marker}"})
    with pytest.raises(ConfigError, match=ALLOW_ENV):
        objective_for(parse_config({"train": {"objective": "subprocess:getoutput"}}).train)
    with pytest.raises(ConfigError, match=ALLOW_ENV):
        objective_for(
            parse_config({"train": {"objective": "tests.x:f", "metrics": "shutil:rmtree"}}).train
        )
    assert not marker.exists()


def test_builtins_always_work(monkeypatch: pytest.MonkeyPatch, no_grants: None) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    run_check("cnn1d", "classification", None, grants=False)
    run_check("vcdl.models:mlp", "causal_lm", None, grants=False)
    build_model("mlp", {"hidden": [4]}, input_shape=(3,), num_classes=2)
    # vcdl's other modules are no built-ins: the benchmark's sleeper needs the allowance.
    with pytest.raises(ModelError, match=ALLOW_ENV):
        run_check("vcdl.models.synthetic:sleeper", "classification", None, grants=False)
    with pytest.raises(ModelError, match=ALLOW_ENV):
        run_check("vcdl.driver.runs:clean_orphans", "classification", None, grants=False)


def test_grants_apply_only_where_asked(monkeypatch: pytest.MonkeyPatch, no_grants: None) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    grant(["mymodel", "bad name; rm -rf"])
    assert granted() == ("mymodel",)
    run_check("mymodel:make", "classification", None, grants=True)
    with pytest.raises(ModelError, match=ALLOW_ENV):
        run_check("mymodel:make", "classification", None, grants=False)


def test_the_config_author_gets_the_modules_beside_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_grants: None
) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    (tmp_path / "mymodel.py").write_text("import layers\ndef make(): pass\n")
    (tmp_path / "layers.py").write_text("X = 1\n")
    (tmp_path / "os.py").write_text("# shadows nothing: the standard library's os wins\n")
    names = grant_beside_config(["mymodel:make", "os:system", "elsewhere:f"], str(tmp_path))
    assert sorted(names) == ["layers", "mymodel"]
    run_check("mymodel:make", "classification", None, grants=True)
    with pytest.raises(ModelError, match="module 'os' is not allowed"):
        run_check("os:system", "classification", None, grants=True)


def test_a_long_spec_is_cut_in_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    spec = "m" * 500 + ":f"
    with pytest.raises(ModelError) as info:
        check_allowed(spec, what="model factory", builtins={}, error=ModelError, grants=False)
    assert len(str(info.value)) < 500


# --------------------------------------------------------------------------
# A flow run from a deployment (the form): flows/guard.py
# --------------------------------------------------------------------------


@pytest.fixture
def from_form(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    import flows.guard

    home = tmp_path / "deployment-home"
    monkeypatch.setattr(flows.guard, "from_deployment", lambda: True)
    monkeypatch.setenv("VCDL_HOME", str(home))
    monkeypatch.delenv(flows.guard.FORM_LOCATIONS_ENV, raising=False)
    return home


def test_a_form_imports_only_what_the_environment_allows(
    from_form: Path, monkeypatch: pytest.MonkeyPatch, no_grants: None
) -> None:
    from flows.guard import check_train_form

    monkeypatch.setenv(ALLOW_ENV, "allowed_pkg")
    grant(["granted_mod"])  # a grant of some trusted caller in this process: not the form's
    check_train_form(RunConfig(), None, None)
    ok = parse_config({"model": {"factory": "allowed_pkg.models:net"}})
    check_train_form(ok, None, None)
    for data in (
        {"model": {"factory": "granted_mod:make"}},
        {"model": {"factory": "os:system", "kwargs": {"command": "true"}}},
        {"train": {"objective": "builtins:eval"}},
    ):
        with pytest.raises((ModelError, ConfigError), match=ALLOW_ENV):
            check_train_form(parse_config(data), None, None)


def test_a_form_keeps_the_deployments_locations(
    from_form: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flows.guard import FORM_LOCATIONS_ENV, check_train_form, form_home, form_ledger_url

    own = RunConfig().with_locations(from_form)
    check_train_form(own, str(from_form), None)  # the deployment's own: fine
    elsewhere = str(tmp_path / "elsewhere")
    refused: list[tuple[dict[str, Any], str | None, Any]] = [
        ({}, elsewhere, None),
        ({"store": {"url": elsewhere}}, None, None),
        ({"ledger": {"url": f"sqlite:///{elsewhere}/l.db"}}, None, None),
        ({"run": {"code_dir": elsewhere}}, None, None),
        ({}, None, type("Chaos", (), {"log": f"{elsewhere}/log"})()),
        ({"metrics": {"port": 9400, "address": "0.0.0.0"}}, None, None),
    ]
    for data, home, chaos in refused:
        with pytest.raises(ConfigError, match=FORM_LOCATIONS_ENV) as info:
            check_train_form(parse_config(data), home, chaos)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=FORM_LOCATIONS_ENV):
        form_home(elsewhere)
    with pytest.raises(ConfigError, match=FORM_LOCATIONS_ENV):
        form_ledger_url(f"sqlite:///{elsewhere}/l.db", None)
    with pytest.raises(ConfigError, match="credentials") as info:
        form_ledger_url("postgresql://u:s3cr3t@h/db", None)
    assert "s3cr3t" not in str(info.value)
    # The deployment may let its forms choose.
    monkeypatch.setenv(FORM_LOCATIONS_ENV, "1")
    for data, home, chaos in refused:
        check_train_form(parse_config(data), home, chaos)
    assert form_home(elsewhere) == elsewhere


def test_a_called_flow_is_no_form(tmp_path: Path) -> None:
    from flows.guard import check_train_form, form_home

    cfg = parse_config({"store": {"url": str(tmp_path / "s")}, "run": {"code_dir": "x"}})
    check_train_form(cfg, str(tmp_path), None)  # outside a deployment's flow run: no limits
    assert form_home(str(tmp_path)) == str(tmp_path)


def test_a_form_turns_on_the_preemption_simulator_only_if_the_deployment_allows(
    from_form: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator kills the deployment's workers: the operator decides, not the form."""
    import flows.train
    from flows.guard import ALLOW_CHAOS_ENV, check_train_form
    from flows.train import ChaosSpec
    from flows.train import train as train_flow

    events: list[tuple[Any, ...]] = []  # the failure event, without starting a Prefect server
    monkeypatch.setattr(flows.train, "emit", lambda *a: events.append(a))

    monkeypatch.delenv(ALLOW_CHAOS_ENV, raising=False)
    chaos = ChaosSpec(rate=0.5)
    check_train_form(RunConfig(), None, ChaosSpec(rate=0))  # rate 0: no simulator, fine
    with pytest.raises(ConfigError, match=ALLOW_CHAOS_ENV) as info:
        check_train_form(RunConfig(), None, chaos)
    assert "\n" not in str(info.value) and "preemption simulator" in str(info.value)
    # The flow itself refuses it before anything is prepared: no home, no ledger.
    with pytest.raises(ConfigError, match=ALLOW_CHAOS_ENV):
        train_flow.fn(config=RunConfig(), home=None, chaos=chaos)
    assert not from_form.exists()
    assert [e[0] for e in events] == ["vcdl.run.failed"]
    monkeypatch.setenv(ALLOW_CHAOS_ENV, "1")
    check_train_form(RunConfig(), None, chaos)
