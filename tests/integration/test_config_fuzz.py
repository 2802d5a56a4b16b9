"""Fuzz: any config and any ``--set`` through the CLI's preflight is accepted or one line, exit 2.

Issue 34, item 6. Hypothesis writes configs (every key of every section, plus
unknown ones, with values of the wrong type, NaN and infinities, huge and
negative numbers, odd strings, nested tables) and ``--set`` overrides, and
runs them through what ``vcdl train CONFIG --set ...`` runs before the banner:
:func:`vcdl.config_files.apply_overrides`, :func:`vcdl.config.parse_config` and
:func:`vcdl.api.resolve` (locations, the run's own code, the preflight: data
set, sizes, objective, model, prices). In process, for speed: whatever
escapes as anything but a :class:`~vcdl.errors.VcdlError` would be a
traceback in the CLI. A few hostile inputs go through the real CLI in a
subprocess, and every refusal leaves no ledger behind.

The data sets are made once per module, so that no generated config makes
preflight generate a big one (``data.samples`` up to ten million).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from vcdl import api
from vcdl.config import RunConfig, parse_config
from vcdl.config_files import apply_overrides
from vcdl.data import make_digits, make_mnist1d
from vcdl.errors import VcdlError
from vcdl.store import WeightStore
from vcdl.usercode import revoke_grants

BASE: dict[str, Any] = {
    "run": {"name": "fuzz", "epochs": 1},
    "data": {"name": "digits", "shards": 2},
    "model": {"factory": "cnn2d"},
}


def _fields() -> dict[str, list[str]]:
    out = {}
    for section, field in RunConfig.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            out[section] = list(model.model_fields)
    return out


FIELDS = _fields()
KEYS = [(s, k) for s, keys in FIELDS.items() for k in keys]
DEFAULTS = RunConfig().model_dump()

# Strings a careless or hostile user types: paths that exist but are no TOML or
# no directory, a NUL byte, an unknown user's home, URLs, import paths of
# functions that run commands, names of the built-in data sets (made above).
ODD = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "~nosuchuser_vcdl/x",
    "/",
    "/etc/passwd",
    "/dev/null",
    "..",
    "../../etc",
    "x" * 5000,
    "\u202e\u0000\U0001f600",
    "nan",
    "inf",
    "-1",
    "1e400",
    "0x10",
    "os:system",
    "subprocess:getoutput",
    "builtins:eval",
    "vcdl.models:mlp",
    "tcp://",
    "tcp://127.0.0.1",
    "tcp://127.0.0.1:99999",
    "http://u:p@h/x?password=secret",
    "sqlite://",
    "sqlite:////nonexistent/dir/ledger.db",
    "postgresql+psycopg://",
    "s3://",
    "file:///",
    "memory://x",
    "digits",
    "mnist1d",
    "auto",
    "-1GiB",
    "10 PB",
    "lots",
    "{}",
    "[]",
    "cuda",
]

scalars = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324]),
    st.sampled_from(ODD),
    st.text(max_size=20).filter(lambda s: s != "pytext"),
    st.booleans(),
    st.none(),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(
        st.sampled_from(["GPU", "a", "", "key", "hidden", "width"]), scalars, max_size=2
    ),
)
# Model keyword arguments: any type, but sizes that build quickly or fail at once
# (a width of 10^6 x 10^6 allocates nothing: torch refuses it).
model_kwargs = st.dictionaries(
    st.sampled_from(["width", "hidden", "depth", "layers", "heads", "dropout", "bogus"]),
    st.one_of(
        st.integers(min_value=-3, max_value=48),
        st.sampled_from([10**18, -(10**18), 2**63]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.lists(st.integers(min_value=-2, max_value=48), max_size=3),
        st.sampled_from(ODD),
        st.none(),
    ),
    max_size=2,
)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {k: dict(v) for k, v in BASE.items()}
    for section, key in draw(st.lists(st.sampled_from(KEYS), max_size=4)):
        if (section, key) == ("model", "kwargs"):
            data["model"]["kwargs"] = draw(model_kwargs)
        elif (section, key) == ("data", "name"):
            data["data"]["name"] = draw(st.sampled_from(["digits", "mnist1d", "nosuch", *ODD]))
        else:
            # Half the time a valid value (its default), so that many configs get as
            # far as the data set and the model.
            default = st.just(DEFAULTS[section][key])
            data.setdefault(section, {})[key] = draw(st.one_of(default, values))
    if draw(st.integers(0, 4)) == 0:
        # Unknown keys and sections, and a section that is not a table.
        where = draw(st.sampled_from([*FIELDS, "bogus"]))
        data.setdefault(where, {})
        if isinstance(data[where], dict):
            data[where][draw(st.sampled_from(["bogus", "", "lr", "x.y"]))] = draw(scalars)
    if draw(st.integers(0, 9)) == 0:
        data[draw(st.sampled_from(list(FIELDS)))] = draw(scalars)
    return data


set_keys = st.one_of(
    st.sampled_from([f"{s}.{k}" for s, k in KEYS]),
    st.sampled_from(["lr", "train.", ".lr", "train..lr", "nosuch.key", "run.name.x", "=", ""]),
    st.text(max_size=15),
)
set_values = st.one_of(
    st.sampled_from(ODD),
    st.text(max_size=25),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "-5", "10000000000000000000000", "true"]),
    st.sampled_from(['"quoted"', "[1, 2", "{ a = 1 }", "[1, 'x']", "{ GPU = nan }", "'''"]),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats().map(repr),
)
sets = st.one_of(
    st.just([]),
    st.lists(st.tuples(set_keys, set_values).map(lambda kv: f"{kv[0]}={kv[1]}"), max_size=2),
)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A vcdl home whose store holds the built-in data sets a config may name."""
    root = tmp_path_factory.mktemp("fuzz")
    home = root / "home"
    store = WeightStore(str(home / "store"))
    make_digits(store, name="digits")
    make_mnist1d(store, name="mnist1d", samples=1000)
    cwd = os.getcwd()
    # Import paths are looked for beside the config, else in the cwd: an empty one here.
    (root / "cwd").mkdir()
    os.chdir(root / "cwd")
    try:
        yield home
    finally:
        os.chdir(cwd)
        revoke_grants()


def preflight_exit(data: dict[str, Any], overrides: list[str], home: Path) -> tuple[int, str]:
    """The exit code and message ``vcdl train`` would give before its banner."""
    path = list(sys.path)
    try:
        cfg = parse_config(apply_overrides(data, overrides))
        api.resolve(cfg, home=home)
    except VcdlError as exc:
        return exc.exit_code, str(exc)
    finally:
        # A code_dir of "/" is put on sys.path: one example's entries must not leak.
        sys.path[:] = path
    return 0, ""


def _check(code: int, message: str, home: Path) -> None:
    assert code in (0, 2), (code, message)
    if code == 2:
        assert message and "\n" not in message and "\r" not in message, message
        assert len(message) < 2000, message[:300]
    # Preflight never writes the ledger, valid config or not.
    assert not (home / "ledger.db").exists()


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(configs(), sets)
def test_any_config_and_set_through_preflight_is_accepted_or_one_line_exit_2(
    home: Path, data: dict[str, Any], overrides: list[str]
) -> None:
    code, message = preflight_exit(data, overrides, home)
    event(f"exit {code}")  # --hypothesis-show-statistics: how many got through preflight
    _check(code, message, home)


@pytest.mark.parametrize(
    "overrides",
    [
        ["run.code_dir=a\x00b"],
        ["run.code_dir=~nosuchuser_vcdl/x", "model.factory=mymod:make"],
        ["cost.prices=/etc/passwd"],
        ["cost.prices=/"],
        ["cluster.memory_limit=lots"],
        ["cluster.memory_limit='1e400'"],  # found by the fuzz: parses to infinity
        ["cluster.address=tcp://127.0.0.1"],
        ["cluster.task_resources={ GPU = nan }"],
        ["train.batch_size=100000"],
        ["data.name=mnist1d", "data.samples=10000000", "data.shards=100000"],
        ["model.kwargs={ width = 1000000000000000000 }"],
        ["cost.prices=/bin/sh"],
        ["model.factory=os:system", "model.kwargs={ command = 'touch x' }"],
    ],
)
def test_hostile_values_through_preflight(home: Path, overrides: list[str]) -> None:
    code, message = preflight_exit({k: dict(v) for k, v in BASE.items()}, overrides, home)
    _check(code, message, home)
    assert code == 2, f"accepted: {overrides}"


CLI_CASES = [
    ["--set", "train.lr=nan", "--set", "fault.quorum=inf", "--set", "x" * 3000 + "=1"],
    ["--set", "run.code_dir=/", "--set", "model.factory=subprocess:getoutput"],
]


@pytest.mark.parametrize("extra", CLI_CASES, ids=["numbers-and-keys", "code"])
def test_hostile_sets_through_the_real_cli(extra: list[str], tmp_path: Path) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text('[data]\nname = "digits"\nshards = 2\n[model]\nfactory = "cnn2d"\n')
    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-m", "vcdl.cli", "train", str(cfg), "--home", str(home), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("vcdl: error: ") and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert not (home / "ledger.db").exists()
