"""``vcdl replay``: a run re-executed from its ledger on this machine's CPU, version by version.

- :mod:`.plan`: the replay's plan from the ledger's rows, pure (which merges,
  which trainings each needs, in order); :class:`~.plan.NotReplayable` says why not
- :mod:`.retrain`: one attempt trained again as its worker trained it, stopped
  where it stopped, with deterministic algorithms
- :mod:`.replayer`: what a replay and a what-if share: the versions re-made,
  the trainings done, one attempt re-trained after those it continues, one
  recorded merge re-made
- :mod:`.runner`: the replay carried out: re-train, re-merge in the ledger's
  order, compare each version with the ledger's checksum and the stored bytes
- :mod:`.text`: the report as lines for the terminal
- :mod:`.change`: a what-if's change (a rejection; another α or rule from a
  version on) judged before anything is written, pure
- :mod:`.whatif`: the run re-executed with one change, into a new run
- :mod:`.diff`: where two runs part (pure) and both heads' test metrics

What a replay guarantees and what it cannot: docs/replay.md.
"""
