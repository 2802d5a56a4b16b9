"""The code a run names: its import paths, and whether this process may import them.

A run names three callables (``model.factory``, ``train.objective``,
``train.metrics``), each a built-in name or an import path. The mechanism,
checking a path against the operator's allow-list and importing it, is
:mod:`vcdl.usercode`'s and knows nothing of runs; this module applies it to a
run's three, with each one's built-ins (the model factories of
:data:`vcdl.models.factory.BUILTIN_MODELS`; the objectives' built-ins are
names, never paths).
"""

from __future__ import annotations

from vcdl.errors import ConfigError, ModelError
from vcdl.models.factory import BUILTIN_MODELS
from vcdl.usercode import check_allowed

__all__ = ["run_check", "run_specs"]


def run_check(model_factory: str, objective: str, metrics: str | None, *, grants: bool) -> None:
    """:func:`~vcdl.usercode.check_allowed` for every import path of a run (model factory,
    objective, metrics): imports nothing, raises one line for the first path not allowed."""
    check_allowed(
        model_factory,
        what="model factory",
        builtins=BUILTIN_MODELS,
        error=ModelError,
        grants=grants,
    )
    check_allowed(objective, what="objective", builtins={}, error=ConfigError, grants=grants)
    if metrics is not None:
        check_allowed(metrics, what="metrics", builtins={}, error=ConfigError, grants=grants)


def run_specs(model_factory: str, objective: str, metrics: str | None) -> list[str]:
    """The import paths of a run's own code (built-in names are no paths, and skipped)."""
    return [s for s in (model_factory, objective, metrics) if s is not None and ":" in s]
