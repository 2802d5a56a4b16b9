"""Read-only views of a run built from the ledger: status, audit, cost, artifacts.

:mod:`.status`, :mod:`.epochs` (the per-epoch projection), :mod:`.summary`
(its text), :mod:`.goodput`, :mod:`.audit`, :mod:`.cost` and
:mod:`.prices`, :mod:`.artifacts`, :mod:`.datasets` (a data set as
``vcdl data`` shows it), :mod:`.story` (everything that happened to a
subtask) and :mod:`.story_text` (its timeline), :mod:`.workers` (each worker's pace, losses
and staleness); while a run trains,
:mod:`.observe` (what its driver tells listeners) and :mod:`.live` (the
terminal's model).
"""
