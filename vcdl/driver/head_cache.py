"""The head's weights kept by the process that merges, across a run's epochs.

The driver merges every result of a run, so re-reading the version it has
just written would double the store traffic of the hot path; this module
owns that cache (:class:`HeadCache`, with a spare state to merge into and,
for rules that read a result's base, the last few versions) and the
per-run caches a driver process keeps from one epoch to the next.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from vcdl.config import RunConfig
from vcdl.ledger import Version
from vcdl.merge.elementwise import output_problem
from vcdl.merge.rules import Applied, MergeRule, rule_of
from vcdl.runtime import RunRef
from vcdl.types import StateDict

# Versions kept in memory for the bases of rules that read them (delta, diloco): with W workers a
# result is usually at most W - 1 versions stale; older bases are read back.
BASES_KEPT = 4
# ... but no more than this many bytes of them, and at least one: a big model's
# driver then holds the head, the buffers of the next version and one base (3x
# the model), and older bases are streamed from the store.
BASES_BUDGET = 512 << 20


class HeadCache:
    """The newest head's weights, kept by the process that merges, plus one spare state.

    The driver merges every result of a run, so re-reading the version it has
    just written would double the store traffic of the hot path.

    Double buffering: a merge written into fresh memory allocates (and
    page-faults) a whole state; a flat 98 MiB blend into fresh memory was 3x
    slower than into a preallocated buffer here. So when a new head
    displaces a state the cache owns, that state becomes the *spare*, and
    :meth:`merge` writes the next version into its tensors. The cache owns
    the states it loaded and the ones :meth:`merge` produced; a state handed
    to :meth:`put` by a caller is owned only with ``owned=True``, and is
    otherwise never written to. A state returned by :meth:`get` stays
    unchanged until ``keep + 2`` more versions have been put (it is then
    recycled); copy it to keep it longer. Costs one extra state of memory
    (the spare) between merges; the peak during a merge (head, result,
    output) is unchanged.

    ``keep``: how many displaced heads to hold as well, for rules that read
    a result's base (delta, diloco): with a few workers nearly every
    base is one of the last versions, so they are in memory rather than
    read back from the store (``keep`` more states of memory).
    """

    def __init__(self, keep: int = 0) -> None:
        self.number: int | None = None
        self.state: StateDict | None = None
        self._owned = False
        self._spare: StateDict | None = None
        self.keep = keep
        self._recent: OrderedDict[int, tuple[StateDict, bool]] = OrderedDict()
        self._rule_state: tuple[int, StateDict] | None = None

    def get(self, version: Version, load: Callable[[str], StateDict]) -> StateDict:
        if self.number == version.number and self.state is not None:
            return self.state
        state = load(version.uri)
        self.put(version.number, state, owned=True)
        return state

    def base(self, version: Version, load: Callable[[str], StateDict]) -> StateDict:
        """The weights of ``version`` (a result's base): the head, a kept one, or loaded."""
        if self.number == version.number and self.state is not None:
            return self.state
        kept = self._recent.get(version.number)
        return kept[0] if kept is not None else load(version.uri)

    def cached(self, number: int) -> StateDict | None:
        """The weights of version ``number`` if this cache holds them (head or a kept one)."""
        if self.number == number and self.state is not None:
            return self.state
        kept = self._recent.get(number)
        return kept[0] if kept is not None else None

    def take_spare(self, rule: MergeRule, head: StateDict) -> StateDict | None:
        """Buffers with ``head``'s layout for ``rule`` to merge into, or None (it allocates).

        Hand them back with :meth:`give_back` if the merge is rejected; after a
        merge they are the new head's tensors (``put(..., owned=True)``).
        """
        if not rule.writes_out:
            return None
        spare, self._spare = self._spare, None
        if spare is not None and output_problem(spare, head) is not None:
            return None  # another architecture, or it overlaps the head: allocate
        return spare

    def give_back(self, spare: StateDict | None) -> None:
        """Spare buffers :meth:`take_spare` gave, unused (a rejected merge)."""
        if spare is not None:
            self._spare = spare

    def put(self, number: int, state: StateDict, owned: bool = False) -> None:
        """Make ``state`` the cached head; ``owned`` lets the cache recycle it later."""
        old, old_owned, old_number = self.state, self._owned, self.number
        self.number, self.state, self._owned = number, state, owned
        if old is None or old is state or old_number is None:
            return
        if self.keep > 0:
            self._recent[old_number] = (old, old_owned)
            self._recent.pop(number, None)
            if len(self._recent) <= self._kept(state):
                return
            _, (old, old_owned) = self._recent.popitem(last=False)
        if old_owned:
            self._spare = old

    def _kept(self, state: StateDict) -> int:
        """How many displaced heads to hold: ``keep``, within :data:`BASES_BUDGET`."""
        size = sum(t.numel() * t.element_size() for t in state.values())
        return max(1, min(self.keep, BASES_BUDGET // max(1, size)))

    def merge(
        self,
        rule: MergeRule,
        head: StateDict,
        result: StateDict,
        alpha: float,
        base: StateDict | None = None,
        state: StateDict | None = None,
    ) -> Applied | str:
        """Validate ``result`` and merge it by ``rule`` (:meth:`MergeRule.apply`).

        Returns the new weights (and the rule's new state), written into the
        spare state's tensors when the rule writes into buffers and they fit
        (put it with ``owned=True`` so it is recycled in turn), or the reason
        to reject the result.
        """
        spare, self._spare = (self._spare, None) if rule.writes_out else (None, self._spare)
        inputs = (result,) if base is None else (result, base)
        if spare is not None and output_problem(spare, head, *inputs) is not None:
            spare = None  # another architecture, or it overlaps an input: allocate
        merged = rule.apply(head, result, alpha, base=base, state=state, out=spare)
        if isinstance(merged, str) and spare is not None:
            self._spare = spare  # rejected: the buffers are still ours to reuse
        return merged

    def rule_state(
        self, head: Version, load: Callable[[Version], StateDict | None]
    ) -> StateDict | None:
        """The merge rule's state after the merge that made ``head`` (kept, or loaded)."""
        if self._rule_state is not None and self._rule_state[0] == head.number:
            return self._rule_state[1]
        state = load(head)
        self._rule_state = None if state is None else (head.number, state)
        return state

    def put_rule_state(self, number: int, state: StateDict | None) -> None:
        """Keep the rule's state after the merge that made version ``number``."""
        self._rule_state = None if state is None else (number, state)


def _kept_bases(cfg: RunConfig) -> int:
    return BASES_KEPT if rule_of(cfg).reads_base else 0


def head_cache(cfg: RunConfig) -> HeadCache:
    """The cache a run's merger needs: with recent bases kept for rules that read them."""
    return HeadCache(keep=_kept_bases(cfg))


# The driver's caches, one per run it drives, kept across the run's epochs.
_RUN_CACHES: dict[tuple[str, str, str], HeadCache] = {}


def run_head_cache(ref: RunRef, cfg: RunConfig) -> HeadCache:
    """This process's cache for the run, kept from one epoch to the next.

    Each epoch would otherwise start by reading the head back from the store
    (and, for the ``delta`` rule, the bases) and allocate a fresh spare. A
    cached version is safe to reuse: a run's versions are never rewritten,
    and the key names the ledger and the store as well as the run.
    """
    key = _run_key(ref)
    cache = _RUN_CACHES.get(key)
    if cache is None or cache.keep != _kept_bases(cfg):
        cache = _RUN_CACHES[key] = head_cache(cfg)
    return cache


def forget_run_cache(ref: RunRef) -> None:
    """Drop the run's cache (its weights' memory); the driver calls it when the run ends."""
    _RUN_CACHES.pop(_run_key(ref), None)


def _run_key(ref: RunRef) -> tuple[str, str, str]:
    return (ref.ledger_url, ref.store_url, ref.run)
