"""What a merge rule is: the interface every rule implements, and the settings it may own.

A rule says what it needs and does its arithmetic (pure functions of tensors,
:mod:`vcdl.merge.ops` and :mod:`vcdl.merge.delta`); the assimilator
(:mod:`vcdl.driver.assimilator`) does the I/O around it. Every rule:

* says which base its attempts start from and whether its merge reads the
  result's base version (``reads_base``) or pins every attempt of an epoch
  to the epoch's first version (``pins_base``);
* computes its α for one result (:meth:`MergeRule.alpha`): the run's α
  schedule and staleness policy, unless the rule defines its own;
* applies itself (:meth:`MergeRule.apply`), validating the result, and may
  keep persistent state (``keeps_state``: DiLoCo's outer momentum), which
  the assimilator stores in the weight store like weights, beside the version
  it belongs to, so a resumed run continues it;
* may change where a worker's attempt starts (:meth:`MergeRule.start`:
  EASGD's elastic pull of the worker's own variable towards the head);
* declares its line of ``merge.rule``'s description in the Prefect form
  (``summary``) and the keys of the ``merge`` section it alone reads
  (``settings_model``, a :class:`RuleSettings`), which
  :class:`vcdl.merge.settings.MergeSection` composes.

No torch at import: the run config imports every rule's declaration (its
name, summary and settings), and a ``vcdl`` command that only reads a config
must not pay for torch (nor import it before ``OMP_NUM_THREADS`` is set). A
rule imports its arithmetic inside the methods that use it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from pydantic import ConfigDict

from vcdl.config_checks import NumbersAreNumbers
from vcdl.merge.schedules import alpha_schedule

if TYPE_CHECKING:
    from vcdl.merge.settings import MergeSection
    from vcdl.types import StateDict

STEP_KEY = "__step__"
"""In a rule state: how many merges have updated it (an int64 scalar)."""


def rule_buffers(head: StateDict, state: StateDict | None) -> tuple[StateDict | None, int]:
    """A rule state's per-tensor buffers and its step count (:data:`STEP_KEY`).

    The buffers are None when there is no state, or when they are not exactly
    the head's floating tensors (another model's state: a changed run), so that
    the rule starts them afresh; the step count is the state's either way.
    """
    if state is None:
        return None, 0
    step = int(state[STEP_KEY]) if STEP_KEY in state else 0
    buffers = {k: v for k, v in state.items() if k != STEP_KEY}
    if set(buffers) != {k for k, t in head.items() if t.is_floating_point()}:
        return None, step
    return buffers, step


class RuleSettings(NumbersAreNumbers):
    """Keys of the ``merge`` section that one rule owns: their defaults, bounds and docs.

    :class:`~vcdl.merge.settings.MergeSection` inherits every rule's settings,
    so a user still writes them flat (``merge.outer_momentum = 0.9``) and a
    recorded config keeps its shape. The model config is every config
    section's (vcdl.config): unknown keys fail, values are frozen and finite.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Applied(NamedTuple):
    """A merge's new weights, and the rule's new state (None for rules without one)."""

    weights: StateDict
    state: StateDict | None = None


class MergeRule(ABC):
    """One way of folding a result into the head; see the module docstring."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """Its sentence of ``merge.rule``'s description (the Prefect form), starting with its name."""
    settings_model: ClassVar[type[RuleSettings] | None] = None
    """The ``merge`` keys only this rule reads; None: it reads only the shared ones."""
    reads_base: ClassVar[bool] = False
    pins_base: ClassVar[bool] = False
    keeps_state: ClassVar[bool] = False
    writes_out: ClassVar[bool] = True
    """It writes its new weights into the ``out`` buffers it is given."""
    worker_variable: ClassVar[bool] = False
    """A worker keeps its last result of the run, for :meth:`start`."""

    def __init__(self, settings: MergeSection, *, workers: int = 1) -> None:
        self.settings = settings
        self.workers = workers
        """The fleet's size (``cluster.workers``): a round of results is this many."""

    def alpha(self, epoch: int, epochs: int, staleness: int, merged_in_epoch: int) -> float | None:
        """The head's weight for one result; None: the staleness policy rejects it."""
        from vcdl.merge.staleness import staleness_alpha

        m = self.settings
        alpha = alpha_schedule(
            m.schedule, epoch, epochs, m.alpha, alpha_end=m.alpha_end, alphas=m.alphas
        )
        return staleness_alpha(
            alpha,
            staleness,
            m.staleness,
            power=m.staleness_power,
            max_staleness=m.max_staleness,
            grace=m.staleness_grace,
        )

    @abstractmethod
    def apply(
        self,
        head: StateDict,
        result: StateDict,
        alpha: float,
        *,
        base: StateDict | None = None,
        state: StateDict | None = None,
        out: StateDict | None = None,
    ) -> Applied | str:
        """The merged weights (and the rule's new state), or the reason to reject the result.

        ``base``: the result's base version's weights (rules that read it);
        ``state``: the rule's state after the previous merge (None at first);
        ``out``: buffers with the head's layout that may receive the new
        weights (they share no memory with any input).
        """

    def start(self, base: StateDict, own: StateDict | None, alpha: float) -> StateDict:
        """Where a worker's attempt starts, given the head it read and its own last result."""
        return base
