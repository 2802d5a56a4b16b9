"""Model factories: built-ins, import paths, and every ModelError case."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from torch import nn

from vcdl.errors import ModelError
from vcdl.models import BUILTIN_MODELS, build_model, resolve_factory

# --- factories referenced by import path from the tests below ---------------


def tiny_factory(input_shape: tuple[int, ...], num_classes: int, hidden: int = 4) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(input_shape[0], hidden), nn.Linear(hidden, num_classes)
    )


def kwargs_factory(**kwargs: Any) -> nn.Module:
    kwargs_factory.seen = kwargs  # type: ignore[attr-defined]
    return nn.Linear(1, 1)


def no_data_factory(size: int = 3) -> nn.Module:
    return nn.Linear(size, 2)


def needs_depth(depth: int) -> nn.Module:
    return nn.Linear(depth, 1)


def not_a_module() -> Any:
    return {"weight": torch.zeros(1)}


def raising_factory() -> nn.Module:
    raise RuntimeError("boom")


NOT_CALLABLE = 42

HERE = "tests.unit.test_models"


# --- built-ins ---------------------------------------------------------------

BUILTIN_CASES = [
    ("mlp", (40,), 10, {}),
    ("mlp", (1, 8, 8), 3, {"hidden": [16]}),
    ("cnn1d", (40,), 10, {}),
    ("cnn1d", (1, 40), 10, {"width": 8}),
    ("cnn2d", (1, 32, 32), 10, {}),
    ("cnn2d", (3, 16, 24), 5, {"width": 4}),
    ("resnet", (3, 32, 32), 10, {}),
    ("resnet", (1, 32, 32), 10, {"depth": 14, "width": 4}),
]


@pytest.mark.parametrize(("factory", "shape", "classes", "kwargs"), BUILTIN_CASES)
def test_builtin_forward_shape(
    factory: str, shape: tuple[int, ...], classes: int, kwargs: dict[str, Any]
) -> None:
    model = build_model(factory, kwargs, input_shape=shape, num_classes=classes)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(3, *shape))
    assert out.shape == (3, classes)


def test_cnn1d_accepts_rows_with_or_without_channel() -> None:
    torch.manual_seed(0)
    model = build_model("cnn1d", input_shape=(40,), num_classes=10)
    x = torch.randn(2, 40)
    assert torch.equal(model(x), model(x[:, None, :]))


def test_builtins_listed_and_resolvable() -> None:
    assert set(BUILTIN_MODELS) == {"mlp", "cnn1d", "cnn2d", "resnet", "gpt"}
    for name, path in BUILTIN_MODELS.items():
        assert resolve_factory(name) is resolve_factory(path)


@pytest.mark.parametrize("factory", sorted(BUILTIN_MODELS))
def test_construction_is_deterministic_under_manual_seed(factory: str) -> None:
    shape = {"mlp": (10,), "cnn1d": (40,)}.get(factory, (1, 16, 16))
    states = []
    for _ in range(2):
        torch.manual_seed(123)
        states.append(build_model(factory, input_shape=shape, num_classes=4).state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_resnet_has_batchnorm_buffers() -> None:
    model = build_model("resnet", input_shape=(1, 32, 32), num_classes=10)
    buffers = dict(model.named_buffers())
    assert any(k.endswith("running_mean") for k in buffers)
    assert any(k.endswith("running_var") for k in buffers)
    counts = [v for k, v in buffers.items() if k.endswith("num_batches_tracked")]
    assert counts and all(v.dtype == torch.int64 for v in counts)
    model.train()
    model(torch.randn(4, 1, 32, 32))
    assert all(int(v) == 1 for v in counts)


def test_explicit_kwargs_win_over_data_set_values() -> None:
    model = build_model("mlp", {"num_classes": 7}, input_shape=(5,), num_classes=10)
    assert model(torch.randn(1, 5)).shape == (1, 7)


@pytest.mark.parametrize(
    ("factory", "kwargs", "match"),
    [
        ("cnn1d", {"input_shape": (1, 2, 3, 4)}, "cnn1d: input_shape must be"),
        ("cnn1d", {"input_shape": (2,)}, "L >= 3"),
        ("cnn2d", {"input_shape": (1, 4, 4)}, "cnn2d: input_shape must be"),
        ("resnet", {"input_shape": (32, 32)}, "resnet: input_shape must be"),
        ("resnet", {"depth": 10}, "depth must be 6n\\+2"),
        ("mlp", {"input_shape": (0, 3)}, "positive sizes"),
        ("mlp", {"num_classes": 0}, "num_classes must be >= 1"),
    ],
)
def test_builtin_rejects_bad_arguments(factory: str, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelError, match=match):
        build_model(factory, kwargs, input_shape=(1, 8, 8), num_classes=10)


# --- import paths ------------------------------------------------------------


def test_custom_import_path() -> None:
    model = build_model(f"{HERE}:tiny_factory", {"hidden": 3}, input_shape=(6,), num_classes=2)
    assert model(torch.randn(4, 6)).shape == (4, 2)


def test_data_set_values_passed_through_var_kwargs() -> None:
    build_model(f"{HERE}:kwargs_factory", {"a": 1}, input_shape=(2,), num_classes=5)
    assert kwargs_factory.seen == {"a": 1, "input_shape": (2,), "num_classes": 5}  # type: ignore[attr-defined]


def test_data_set_values_not_passed_when_not_accepted() -> None:
    model = build_model(f"{HERE}:no_data_factory", input_shape=(2,), num_classes=5)
    assert isinstance(model, nn.Linear) and model.in_features == 3


@pytest.mark.parametrize(
    ("factory", "kwargs", "match"),
    [
        (
            "nonsense",
            None,
            r"neither a built-in \(mlp, cnn1d, cnn2d, resnet, gpt\) nor an import path",
        ),
        ("pkg.module", None, "nor an import path 'package.module:function'"),
        (":fn", None, "nor an import path"),
        ("pkg.module:", None, "nor an import path"),
        ("a:b:c", None, "nor an import path"),
        (
            "vcdl_no_such_pkg.models:fn",
            None,
            "cannot import module 'vcdl_no_such_pkg.models': ModuleNotFoundError: "
            "No module named 'vcdl_no_such_pkg'",
        ),
        (f"{HERE}:missing_fn", None, f"module '{HERE}' has no attribute 'missing_fn'"),
        (f"{HERE}:NOT_CALLABLE", None, "is not callable \\(it is a int\\)"),
        (
            f"{HERE}:tiny_factory",
            {"hiddn": 3, "zz": 1},
            "unexpected keyword argument\\(s\\) hiddn, zz; "
            "it accepts input_shape, num_classes, hidden",
        ),
        (f"{HERE}:needs_depth", None, "cannot be called: missing a required argument: 'depth'"),
        (f"{HERE}:not_a_module", None, "returned a dict, not a torch.nn.Module"),
        (f"{HERE}:raising_factory", None, "raised RuntimeError: boom"),
        ("mlp", {"hidden": [4]}, "missing a required argument: 'input_shape'"),
    ],
)
def test_model_errors(
    factory: str, kwargs: dict[str, Any] | None, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Import failures themselves: every module is allowed (test_import_allowance.py
    # checks the allow-list).
    monkeypatch.setenv("VCDL_ALLOW_IMPORTS", "*")
    with pytest.raises(ModelError, match=match) as info:
        build_model(factory, kwargs)
    assert "\n" not in str(info.value)


def test_module_failing_at_import(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "vcdl_test_bad_import.py").write_text("raise RuntimeError('bad module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("VCDL_ALLOW_IMPORTS", "vcdl_test_bad_import")
    with pytest.raises(
        ModelError, match="importing module 'vcdl_test_bad_import' raised RuntimeError: bad module"
    ):
        resolve_factory("vcdl_test_bad_import:fn")
    sys.modules.pop("vcdl_test_bad_import", None)


def test_model_error_is_value_error() -> None:
    with pytest.raises(ValueError):
        resolve_factory("nope")
