"""``average``: the synchronous baseline (local SGD).

Every attempt of an epoch starts from the epoch's first version and the k-th
result of the epoch gets α = k/(k+1): the head ends as the plain mean.
"""

from __future__ import annotations

from vcdl.merge.builtin.vc_asgd import VcAsgd


class Average(VcAsgd):
    name = "average"
    summary = (
        "average: every shard of an epoch starts from the epoch's first version and the "
        "epoch's results are averaged (synchronous baseline)."
    )
    pins_base = True

    def alpha(self, epoch: int, epochs: int, staleness: int, merged_in_epoch: int) -> float | None:
        # The k-th result of an epoch (0-based) gets k/(k+1): a running mean, so
        # after all S shards the head is their plain average (every shard
        # started from the same version).
        return merged_in_epoch / (merged_in_epoch + 1)
