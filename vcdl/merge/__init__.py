"""Merge rules and what they share: pure functions from state dicts to state dicts.

:mod:`.rules` (the registry: each rule by its ``merge.rule`` name),
:mod:`.interface` (what a rule implements, and the settings it may own),
:mod:`.builtin` (the rules, a module each: vc_asgd, delta, average, easgd,
diloco), :mod:`.settings` (the config's ``merge`` section, composed from the
rules'), :mod:`.ops` (VC-ASGD, averaging, EASGD, DiLoCo, partial results),
:mod:`.delta` (the delta rule), :mod:`.elementwise` (their building blocks),
:mod:`.checks` (result checks), :mod:`.staleness` and :mod:`.schedules` (α),
:mod:`.codec` (results in reduced precision).

The names below are imported on first use, not with the package: the run
config imports :mod:`.settings` and :mod:`.rules`, which need no torch, and a
command that only reads a config does not import torch. ``vcdl.merge.delta``
is the module (the function is ``vcdl.merge.delta.delta``): a package
attribute named like a submodule would change with what was imported first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vcdl.merge.checks import state_norm, update_norm, validate_result
    from vcdl.merge.delta import validated_delta
    from vcdl.merge.elementwise import output_problem
    from vcdl.merge.ops import average, diloco, easgd, scale_result, validated_vc_asgd, vc_asgd
    from vcdl.merge.schedules import SCHEDULES, alpha_schedule
    from vcdl.merge.staleness import STALENESS_POLICIES, staleness_alpha

# Each exported name and the submodule that defines it.
_EXPORTS = {
    "SCHEDULES": "schedules",
    "STALENESS_POLICIES": "staleness",
    "alpha_schedule": "schedules",
    "average": "ops",
    "diloco": "ops",
    "easgd": "ops",
    "output_problem": "elementwise",
    "scale_result": "ops",
    "staleness_alpha": "staleness",
    "state_norm": "checks",
    "update_norm": "checks",
    "validate_result": "checks",
    "validated_delta": "delta",
    "validated_vc_asgd": "ops",
    "vc_asgd": "ops",
}

__all__ = [
    "SCHEDULES",
    "STALENESS_POLICIES",
    "alpha_schedule",
    "average",
    "diloco",
    "easgd",
    "output_problem",
    "scale_result",
    "staleness_alpha",
    "state_norm",
    "update_norm",
    "validate_result",
    "validated_delta",
    "validated_vc_asgd",
    "vc_asgd",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
