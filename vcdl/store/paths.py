"""Where a run's groups live in the weight store.

Version groups carry the writer's attempt id so that two mergers racing for
the same number never write to the same group: the loser's group is an
orphan the ledger never names.
"""

from __future__ import annotations


# Store layout of a run. Version groups carry the writer's attempt id so that
# two mergers racing for the same number never write to the same group: the
# loser's group is an orphan the ledger never points to.
def version_path(run: str, number: int, tag: str) -> str:
    return f"runs/{run}/versions/{number:08d}-{tag}"


def versions_prefix(run: str) -> str:
    return f"runs/{run}/versions"


def result_path(run: str, epoch: int, shard: int, attempt_id: str) -> str:
    return f"runs/{run}/results/e{epoch:05d}-s{shard:05d}-{attempt_id}"


def checkpoint_path(run: str, epoch: int, shard: int, attempt_id: str, samples: int) -> str:
    """A checkpoint of an attempt's training, after ``samples``; one group per checkpoint.

    Never overwritten: a replacement reading the one the ledger names while
    its attempt writes the next one reads a complete group, or finds it
    deleted and starts over.
    """
    return f"{result_path(run, epoch, shard, attempt_id)}-ckpt{samples:010d}"


def results_prefix(run: str) -> str:
    return f"runs/{run}/results"


def rule_state_path(run: str, version_uri: str) -> str:
    """Where a merge rule's state after the merge that made a version lives.

    Named after the version's group, in a prefix of its own: only the head's
    is kept (a resumed run continues from it), the rest are orphans.
    """
    return f"{rule_state_prefix(run)}/{version_uri.rstrip('/').rsplit('/', 1)[-1]}"


def rule_state_prefix(run: str) -> str:
    return f"runs/{run}/rule-state"
