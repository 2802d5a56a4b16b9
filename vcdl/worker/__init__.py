"""The worker side: one attempt of one subtask, as a Dask worker runs it.

:mod:`.runtime` (a worker process's state in one object, and the Dask
plugin that creates and closes it), :mod:`.readahead` (read ahead, then a
training slot and memory, around each attempt), :mod:`.attempt` (claim,
read, train, write, record), :mod:`.loop` (the training loop and
evaluation), :mod:`.checkpoints`, :mod:`.slots`, :mod:`.admission` (start an
attempt only while it fits in memory), :mod:`.preemption` (notices),
:mod:`.cloud_notice` (notices from a cloud's metadata service),
:mod:`.shard_data` (an attempt's rows and fresh model), :mod:`.baseread`
(where an attempt's base comes from), :mod:`.basecache` (base weights read
in the background, a pinned one kept),
:mod:`.allocator` (glibc thresholds), :mod:`.speed` (emulated compute
speeds), :mod:`.replay_inputs` (what a replay needs of an attempt, recorded
before it trains).
"""
