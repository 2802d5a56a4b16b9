"""Merge rules and what they share: pure functions from state dicts to state dicts.

:mod:`.rules` (the rules behind one interface, chosen by ``merge.rule``),
:mod:`.ops` (VC-ASGD, averaging, EASGD, DiLoCo, partial results),
:mod:`.delta` (the delta rule), :mod:`.elementwise` (their building blocks),
:mod:`.checks` (result checks), :mod:`.staleness` and :mod:`.schedules` (α),
:mod:`.codec` (results in reduced precision).
"""

from __future__ import annotations

from vcdl.merge.checks import state_norm, update_norm, validate_result
from vcdl.merge.delta import delta, validated_delta
from vcdl.merge.elementwise import output_problem
from vcdl.merge.ops import average, diloco, easgd, scale_result, validated_vc_asgd, vc_asgd
from vcdl.merge.schedules import SCHEDULES, alpha_schedule
from vcdl.merge.staleness import STALENESS_POLICIES, staleness_alpha

__all__ = [
    "SCHEDULES",
    "STALENESS_POLICIES",
    "alpha_schedule",
    "average",
    "delta",
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
