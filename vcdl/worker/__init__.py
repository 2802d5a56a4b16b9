"""The worker side: one attempt of one subtask, as a Dask worker runs it.

:mod:`.attempt` (claim, read, train, write, record), :mod:`.loop` (the
training loop and evaluation), :mod:`.checkpoints`, :mod:`.slots`,
:mod:`.admission` (start an attempt only while it fits in memory),
:mod:`.preemption` (notices), :mod:`.allocator` (glibc thresholds).
"""
