"""Model factories: a built-in name or an import path, called with the data set's hints.

A run names its model as a factory: a built-in short name (see
:data:`BUILTIN_MODELS`) or ``"package.module:function"``, any callable that
returns a ``torch.nn.Module``. :func:`build_model` imports it, passes the
run's keyword arguments plus, when the factory accepts them by name (or
takes ``**kwargs``), the data set's hints: ``input_shape`` and
``num_classes`` (classification), ``vocab_size`` and ``context_length``
(language models). Every failure is a :class:`~vcdl.errors.ModelError` with
a one-line message.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from vcdl.errors import ModelError
from vcdl.usercode import import_callable

BUILTIN_MODELS: dict[str, str] = {
    "mlp": "vcdl.models:mlp",
    "cnn1d": "vcdl.models:cnn1d",
    "cnn2d": "vcdl.models:cnn2d",
    "resnet": "vcdl.models:resnet",
    "gpt": "vcdl.models:gpt",
}
"""Short names accepted in place of an import path."""

# --------------------------------------------------------------------------
# Factory resolution
# --------------------------------------------------------------------------


def resolve_factory(factory: str) -> Callable[..., nn.Module]:
    """The callable named by ``factory``: a built-in name or ``"pkg.module:attr"``."""
    return import_callable(factory, what="model factory", builtins=BUILTIN_MODELS, error=ModelError)


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # some C callables have none: skip the checks, just call


def build_model(
    factory: str,
    kwargs: Mapping[str, Any] | None = None,
    *,
    hints: Mapping[str, Any] | None = None,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
) -> nn.Module:
    """Build a model from its factory name and keyword arguments.

    ``hints`` (the data set's: ``input_shape``, ``num_classes``,
    ``vocab_size``, ``context_length``; see
    :meth:`vcdl.data.DatasetInfo.factory_hints`) are passed as keyword
    arguments only if the factory accepts them (by name or via ``**kwargs``)
    and ``kwargs`` does not already set them. ``input_shape`` and
    ``num_classes`` may also be given on their own.
    """
    fn = resolve_factory(factory)
    call_kwargs = dict(kwargs or {})
    sig = _signature(fn)
    if sig is not None:
        params = sig.parameters
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        accepted = [
            n
            for n, p in params.items()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        given: dict[str, Any] = dict(hints or {})
        if num_classes is not None:
            given["num_classes"] = num_classes
        if input_shape is not None:
            given["input_shape"] = input_shape
        if given.get("input_shape") is not None:
            given["input_shape"] = tuple(given["input_shape"])  # TOML/JSON may hand a list
        for key, value in given.items():
            if value is not None and key not in call_kwargs and (var_kw or key in accepted):
                call_kwargs[key] = value
        if not var_kw:
            unexpected = sorted(k for k in call_kwargs if k not in accepted)
            if unexpected:
                raise ModelError(
                    f"model factory {factory!r} got unexpected keyword argument(s) "
                    f"{', '.join(unexpected)}; it accepts {', '.join(accepted) or 'none'}"
                )
        try:
            sig.bind(**call_kwargs)
        except TypeError as exc:
            raise ModelError(f"model factory {factory!r} cannot be called: {exc}") from exc
    try:
        model = fn(**call_kwargs)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"model factory {factory!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ModelError(
            f"model factory {factory!r} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model
