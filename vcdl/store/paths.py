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


def version_tag(attempt_id: str, lease: int | None) -> str:
    """The tag of a version group merged from ``attempt_id`` by a driver of lease ``lease``.

    The lease generation in the name keeps two drivers of one run apart even
    when both merge the same attempt as the same number (one of them paused
    past its lease): each writes its own group, and a sweep of orphans by one
    never deletes a group of a later generation (:func:`group_generation`).
    """
    return attempt_id[:12] if lease is None else f"{attempt_id[:12]}-g{lease}"


def group_generation(name: str) -> int:
    """The lease generation a version (or rule-state) group's name carries; 0 for none."""
    _, sep, gen = name.rpartition("-g")
    return int(gen) if sep and gen.isdigit() else 0


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
