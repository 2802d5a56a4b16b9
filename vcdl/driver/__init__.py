"""The driver side: what the flow process decides and merges.

The epoch's decisions, pure: :mod:`.epoch_events` (facts, events,
instructions, the policy), :mod:`.epoch_state` (the state machine, the
attempt budget included), :mod:`.epoch_attempts` (what is read off a
subtask's attempts: free attempts, settling after the barrier),
:mod:`.epoch_loop` (the epochs in order, each
waiting at its gate for the previous barrier), :mod:`.dispatch` (where an
attempt's time went), :mod:`.throughput` (each worker's measured throughput and
an epoch's plan sized by it, ``cluster.sizing``).
Merging: :mod:`.merge_plan` (the decision, pure: staleness, α, paths, attributes),
:mod:`.assimilator` (one result into the head), :mod:`.streamed`
(a batch of tensors at a time), :mod:`.stages` (the reader and writer
threads its stages overlap in), :mod:`.fold` (waiting results in one
version write, ``merge.fold``), :mod:`.sharded` (one merge by K forked
merger processes, ``merge.mergers``), :mod:`.merger` (one merger's range)
and :mod:`.merge_ranges` (the ranges of the head's chunks, pure),
:mod:`.head_cache`. The run:
:mod:`.runs` (create, resume, evaluate, export), :mod:`.lease` (one driver
at a time), :mod:`.retention` and :mod:`.gc` (which weights stay, and
applying it), :mod:`.retrain` (the retrain flow's decisions).
"""
