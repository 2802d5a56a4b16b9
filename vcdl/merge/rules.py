"""Merge rules by name, chosen by ``merge.rule``: the registry, the only place that decides.

Each rule is a module of :mod:`vcdl.merge.builtin` implementing
:class:`~vcdl.merge.interface.MergeRule` (what a rule says it needs, its α,
its arithmetic, its persistent state, where a worker starts); :data:`RULES`
names them, and the run config takes its ``merge.rule`` choices, their
descriptions in the Prefect form and each rule's own keys from here
(:mod:`vcdl.merge.settings`).

The rules, with α the weight of the head (docs/design.md §1):

``vc_asgd``
    ``W ← α·W + (1 − α)·W_c`` (:mod:`vcdl.merge.builtin.vc_asgd`).
``delta``
    The result's own change from its base (:mod:`vcdl.merge.builtin.delta`).
``average``
    The plain mean of an epoch's results, the synchronous baseline
    (:mod:`vcdl.merge.builtin.average`).
``easgd``
    Elastic averaging, asynchronous form (:mod:`vcdl.merge.builtin.easgd`).
``diloco``
    The DiLoCo outer step per result, with outer momentum kept as the rule's
    state (:mod:`vcdl.merge.builtin.diloco`).
``diloco_async``
    The asynchronous outer step with delayed Nesterov momentum: the
    momentum steps once every N results (:mod:`vcdl.merge.builtin.diloco_async`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcdl.errors import ConfigError
from vcdl.merge.builtin.average import Average
from vcdl.merge.builtin.delta import Delta
from vcdl.merge.builtin.diloco import Diloco
from vcdl.merge.builtin.diloco_async import DilocoAsync
from vcdl.merge.builtin.easgd import Easgd
from vcdl.merge.builtin.vc_asgd import VcAsgd
from vcdl.merge.interface import STEP_KEY, Applied, MergeRule, RuleSettings

if TYPE_CHECKING:
    from vcdl.config import RunConfig
    from vcdl.merge.settings import MergeSection

__all__ = ["RULES", "STEP_KEY", "Applied", "MergeRule", "RuleSettings", "merge_rule", "rule_of"]

RULES: dict[str, type[MergeRule]] = {
    r.name: r for r in (VcAsgd, Delta, Average, Easgd, Diloco, DilocoAsync)
}
"""Every rule by its ``merge.rule`` name, in the order the config's choices list them."""


def merge_rule(settings: MergeSection, *, workers: int = 1) -> MergeRule:
    """The rule ``merge`` settings select, for a fleet of ``workers``.

    A rule that steps once per round of results counts on ``workers``
    (``diloco_async``'s default delay); a run's rule is :func:`rule_of`'s.
    """
    try:
        return RULES[settings.rule](settings, workers=workers)
    except KeyError:
        raise ConfigError(
            f"unknown merge.rule {settings.rule!r}; one of {', '.join(sorted(RULES))}"
        ) from None


def rule_of(cfg: RunConfig) -> MergeRule:
    """A run's merge rule: its ``merge`` settings, for its ``cluster.workers``."""
    return merge_rule(cfg.merge, workers=cfg.cluster.workers)
