"""The ``merge`` section of the run config: the keys every rule reads, and each rule's own.

:class:`MergeSection` is what :class:`vcdl.config.RunConfig` holds under
``merge``. Its ``merge.rule`` choices are the names of
:data:`vcdl.merge.rules.RULES`, in the registry's order, and the choice's
description in the Prefect form is the rules' summaries; the keys only one
rule reads are that rule's :class:`~vcdl.merge.interface.RuleSettings`
(:class:`~vcdl.merge.builtin.diloco.DilocoSettings`,
:class:`~vcdl.merge.builtin.diloco_async.DilocoAsyncSettings`), inherited here, so
they stay flat keys of the section (``merge.outer_momentum``) and a recorded
config keeps its shape.

Torch-free, like :mod:`vcdl.config`, which imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from vcdl.merge.builtin.diloco import DilocoSettings
from vcdl.merge.builtin.diloco_async import DilocoAsyncSettings
from vcdl.merge.interface import RuleSettings
from vcdl.merge.rules import RULES

if TYPE_CHECKING:
    RuleName = str
else:
    # The registry's names as the choices: pydantic validates them and the
    # form's JSON schema offers them (an enum), with no list written twice.
    RuleName = Literal[tuple(RULES)]

__all__ = ["MergeSection", "SharedMergeSettings"]


class SharedMergeSettings(RuleSettings):
    """The keys of the merge section that every rule reads (α, its schedule, staleness...)."""

    rule: RuleName = Field("vc_asgd", description=" ".join(rule.summary for rule in RULES.values()))
    alpha: float = Field(0.5, ge=0, le=1, description="VC-ASGD alpha (weight of the head).")
    schedule: Literal["constant", "linear", "cosine", "list"] = Field(
        "constant", description="How alpha changes with the epoch."
    )
    alpha_end: float | None = Field(
        None, ge=0, le=1, description="Final alpha for linear/cosine schedules."
    )
    alphas: list[float] | None = Field(
        None, description="Alpha per epoch for the 'list' schedule (last value repeats)."
    )
    staleness: Literal["plain", "raise", "reject"] = Field(
        "plain",
        description="plain: ignore staleness; raise: alpha_eff = 1-(1-alpha)/(1+s)^p; "
        "reject: drop results staler than max_staleness.",
    )
    staleness_power: float = Field(1.0, ge=0, le=100, description="p in the 'raise' policy.")
    staleness_grace: int = Field(
        0,
        ge=0,
        description="raise: staleness up to this is not damped (s' = max(0, s - grace)); "
        "with N workers nearly every result is N-1 stale.",
    )
    max_staleness: int | None = Field(None, ge=0, description="Reject results staler than this.")
    max_update_norm: float | None = Field(
        None,
        gt=0,
        le=1e12,
        description="Reject results whose L2 distance from their base exceeds this.",
    )
    result_precision: Literal["full", "bf16_delta", "int8_delta"] = Field(
        "full",
        description="How workers store their results: full (as trained), bf16_delta (the change "
        "from the base version in bfloat16: half the bytes of float32) or int8_delta (the "
        "change quantized per row with a float32 scale: about a quarter). The driver adds the "
        "change back to the base version before merging.",
    )
    fold: int = Field(
        1,
        ge=1,
        le=64,
        description="Results that wait together (of one epoch) are merged in one pass that "
        "writes only the last version: up to this many. The weights, alphas and staleness are "
        "those of merging them one at a time; the versions between are recorded in the ledger "
        "as never stored (pruned). 1 writes every version. Pays where merges bind (many "
        "workers, big models): a version write costs about what reading a result does.",
    )

    @model_validator(mode="after")
    def _check_schedule(self) -> SharedMergeSettings:
        if self.schedule in ("linear", "cosine") and self.alpha_end is None:
            raise ValueError(f"merge.alpha_end is required for the {self.schedule} schedule")
        if self.schedule == "list" and not self.alphas:
            raise ValueError("merge.alphas must list at least one alpha for the list schedule")
        for a in self.alphas or []:
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"merge.alphas: {a} is outside [0, 1]")
        if self.staleness == "reject" and self.max_staleness is None:
            raise ValueError("merge.max_staleness is required for the reject staleness policy")
        return self


# The rules' own settings come first among the bases: pydantic orders the
# fields from the last base to the first, so the shared keys lead (the order of
# `unknown key (allowed: ...)` and of a recorded config) and each rule's follow.
# A rule that owns keys adds its RuleSettings here (a test checks every one is).
# No docstring: a model's docstring becomes its description in the form's
# schema, and the merge section has never had one.
class MergeSection(DilocoAsyncSettings, DilocoSettings, SharedMergeSettings):
    # Here, not among the shared keys: added since, it comes last in a recorded config.
    mergers: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes that merge one result together, each its own range of the "
        "head's chunks (forked by the driver on its machine); the version is published once "
        "every range is written and checksummed. The same bytes as 1, bit for bit. 1 merges "
        "in the driver's process. Pays where one merge is CPU-bound (int8_delta results).",
    )
