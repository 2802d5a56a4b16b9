"""The driver side: what the flow process decides and merges.

:mod:`.assimilator` (one result into the head), :mod:`.head_cache`,
:mod:`.budget` (attempt budget), :mod:`.runs` (create, resume, evaluate,
export), :mod:`.retrain` (the retrain flow's decisions).
"""
