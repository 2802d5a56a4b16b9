"""Runs: create or resume one, evaluate a version, export weights.

This module owns the life of a run outside the epoch loop. Creating a run
validates everything first (data set, model factory) and only then writes
v0 and the ledger rows, so bad input leaves the ledger untouched. Resuming
checks that the new config does not change what the run *is* (data, model,
training and merge settings) and may extend the number of epochs.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vcdl.config import RunConfig
from vcdl.data import (
    DatasetInfo,
    make_digits,
    make_mnist1d,
    make_pytext,
    open_dataset,
    read_arrays,
)
from vcdl.errors import ConfigError, DataError, VersionPruned
from vcdl.ledger import Evaluation, Run
from vcdl.ledger.models import FOLDED_CHECKSUM
from vcdl.models import build_model
from vcdl.objectives import objective_for
from vcdl.runtime import RunRef
from vcdl.store import WeightStore
from vcdl.store.paths import (
    group_generation,
    results_prefix,
    rule_state_prefix,
    version_path,
    versions_prefix,
)
from vcdl.types import StateDict
from vcdl.views.prices import run_prices
from vcdl.worker.loop import evaluate, snapshot

# Sections that define what a run computes: a resumed run must keep them.
_IDENTITY_SECTIONS = ("data", "model", "train", "merge")


def ensure_dataset(store: WeightStore, cfg: RunConfig) -> DatasetInfo:
    """Open the run's data set, generating the built-in ones on first use."""
    name = cfg.data.name
    try:
        return open_dataset(store, name)
    except DataError:
        if name == "digits":
            return make_digits(store, name=name)
        if name == "mnist1d":
            return make_mnist1d(store, name=name, samples=cfg.data.samples or 40_000)
        if name == "pytext":
            return make_pytext(store, name=name)
        raise


def check_sizes(cfg: RunConfig, info: DatasetInfo) -> None:
    """Shards and batch fit the training rows, or one line saying what to change.

    Shards larger than the rows leave some shards empty (every attempt of
    one fails); a batch larger than a shard makes every step train on the
    whole shard, so ``train.batch_size`` would silently mean nothing: both
    are refused, not clamped, before anything is written.
    """
    rows, shards, batch = info.n_train, cfg.data.shards, cfg.train.batch_size
    if shards > rows:
        raise ConfigError(
            f"data.shards is {shards} but data set {cfg.data.name!r} has "
            f"{rows} training rows: set data.shards to at most {rows}"
        )
    per_shard = rows // shards  # the smallest shard's rows (shards differ by at most one)
    if batch > per_shard:
        fix = f"set train.batch_size to at most {per_shard}"
        if rows // batch >= 1:
            fix += f" or data.shards to at most {rows // batch}"
        raise ConfigError(
            f"train.batch_size is {batch} but the {shards} shard(s) of data set "
            f"{cfg.data.name!r} hold {per_shard} training rows each ({rows} rows / {shards}): "
            f"every step would train on a whole shard, not a batch of {batch}; {fix}"
        )


def new_model(cfg: RunConfig, info: DatasetInfo) -> nn.Module:
    """The run's model, initialized from the run's seed."""
    torch.manual_seed(cfg.run.seed)
    return build_model(
        cfg.model.factory, cfg.model.kwargs, hints=info.factory_hints(cfg.data.fields.get("x", "x"))
    )


def _differences(old: RunConfig, new: RunConfig) -> list[str]:
    out = []
    a, b = old.model_dump(), new.model_dump()
    for section in _IDENTITY_SECTIONS:
        for key in sorted(set(a[section]) | set(b[section])):
            if section == "data" and key == "eval_batch_size":
                continue
            if a[section].get(key) != b[section].get(key):
                out.append(f"{section}.{key}: {a[section].get(key)!r} -> {b[section].get(key)!r}")
    if old.run.seed != new.run.seed:
        out.append(f"run.seed: {old.run.seed} -> {new.run.seed}")
    return out


def prepare_run(
    cfg: RunConfig,
    init_state: StateDict | None = None,
    parent: tuple[str, int] | None = None,
) -> tuple[RunRef, Run, bool]:
    """Create the run described by ``cfg``, or find it to resume.

    Returns the reference, the ledger row and whether it was resumed. A new
    run's v0 is a fresh initialization, or ``init_state`` (a warm start: it
    must fit the run's model exactly) with ``parent`` = (run, version) it
    came from recorded in the ledger. v0's attributes record the data set's
    fingerprint (``data_fingerprint``), which the retrain flow compares.
    """
    ref = RunRef.from_config(cfg)
    store = ref.store()
    info = ensure_dataset(store, cfg)
    check_sizes(cfg, info)  # a form's config comes here without the CLI's preflight
    model = new_model(cfg, info)  # fails here, before any ledger write, on a bad factory
    run_prices(cfg.cost)  # and here on an instance type without a price
    ledger = ref.ledger()
    existing = ledger.find_run(ref.run)
    if existing is not None:
        stored = RunConfig.model_validate_json(existing.config)
        diff = _differences(stored, cfg)
        if diff:
            raise ConfigError(
                f"run '{ref.run}' exists with different settings ({'; '.join(diff)}); "
                "resume it with its own config or start a new run with --run NEW_NAME"
            )
        if stored != cfg:
            existing = ledger.update_run(ref.run, config=cfg.model_dump_json())
        return ref, existing, True
    state = snapshot(model)
    attrs: dict[str, Any] = {"run": ref.run, "number": 0, "data_fingerprint": info.fingerprint}
    if init_state is not None:
        _check_fits(state, init_state)
        state = init_state
    if parent is not None:
        attrs |= {"parent_run": parent[0], "parent_version": parent[1]}
    path = version_path(ref.run, 0, "init" if parent is None else "warm")
    store.write_state(path, state, attrs=attrs)
    run = ledger.create_run(
        ref.run,
        cfg.model_dump_json(),
        path,
        store.checksum(path),
        parent_run=parent[0] if parent else None,
        parent_version=parent[1] if parent else None,
    )
    return ref, run, False


def _check_fits(model_state: StateDict, init_state: StateDict) -> None:
    """A warm start's weights must match the run's model key for key, shape for shape."""
    if set(model_state) != set(init_state):
        raise ConfigError(
            "warm start: the parent's tensors do not match the model "
            f"(missing {sorted(set(model_state) - set(init_state))[:5]}, "
            f"unexpected {sorted(set(init_state) - set(model_state))[:5]})"
        )
    for k, t in model_state.items():
        if init_state[k].shape != t.shape or init_state[k].dtype != t.dtype:
            raise ConfigError(
                f"warm start: tensor {k} is {tuple(init_state[k].shape)} "
                f"{init_state[k].dtype} in the parent but {tuple(t.shape)} {t.dtype} "
                "in the model (a different data set shape or model config?)"
            )


def clean_orphans(ref: RunRef) -> list[str]:
    """Delete groups the ledger does not name; returns their names.

    Version groups left by a crash or a lost CAS, result and checkpoint
    groups of workers killed between writing one and recording it, and merge
    rule states of versions other than the head (only the head's is read
    again; a crash between the merge and deleting the previous one leaves
    it). Called by
    a resuming driver before it submits anything: a worker of the dead
    driver still running elsewhere may record a result this just deleted,
    which the merge then rejects as unreadable and the driver reissues.

    Never deleted, because a live driver may be writing them right now
    (this driver may itself be one paused past its lease, vcdl/ledger/fence.py):
    version and rule-state groups of a later lease generation than
    ``ref.lease``, and the result and checkpoint groups of attempts the
    ledger has as running: such a group is not named in the ledger until
    its writer is done.
    """
    store, ledger = ref.store(), ref.ledger()
    attempts = ledger.attempts(ref.run)
    named = {
        versions_prefix(ref.run): {v.uri.rsplit("/", 1)[-1] for v in ledger.versions(ref.run)},
        results_prefix(ref.run): {
            uri.rsplit("/", 1)[-1]
            for a in attempts
            for uri in (a.result_uri, a.checkpoint_uri)
            if uri
        },
        rule_state_prefix(ref.run): {ledger.head(ref.run).uri.rsplit("/", 1)[-1]},
    }
    running = tuple(a.id for a in attempts if a.state == "running")

    def in_use(prefix: str, name: str) -> bool:
        if prefix == results_prefix(ref.run):
            # e<epoch>-s<shard>-<attempt id>[-ckpt<samples>]
            return any(f"-{a}" in name for a in running)
        return ref.lease is not None and group_generation(name) > ref.lease

    removed = []
    for prefix, known in named.items():
        for name in store.list(prefix):
            if name not in known and not in_use(prefix, name):
                store.delete(f"{prefix}/{name}")
                removed.append(name)
    return removed


def load_version(ref: RunRef, number: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
    """A version's weights (default: the head), verified against the checksums the ledger
    recorded when it was made (:class:`~vcdl.errors.ChecksumMismatch` if rewritten since)."""
    ledger = ref.ledger()
    row = ledger.head(ref.run) if number is None else ledger.get_version(ref.run, number)
    if row.pruned_at is not None:
        kept = [v.number for v in ledger.versions(ref.run) if v.pruned_at is None]
        shown = ", ".join(f"v{n}" for n in kept[-10:])
        if row.checksum == FOLDED_CHECKSUM:
            raise VersionPruned(
                f"version {row.number} of run {ref.run!r} was folded into a later version "
                "(merge.fold: results that waited together were merged in one pass): its "
                f"lineage is in the ledger, its weights were never stored; kept versions "
                f"include {shown}"
            )
        raise VersionPruned(
            f"version {row.number} of run {ref.run!r} was pruned by the retention policy "
            f"(store.keep) at {row.pruned_at:%Y-%m-%d %H:%M:%S} UTC: its lineage stays in the "
            f"ledger, its weights are gone; kept versions include {shown}"
        )
    return row.number, ref.store().read_state(row.uri, expect=row.checksum)


def evaluate_version(
    ref: RunRef,
    cfg: RunConfig,
    number: int | None = None,
    epoch: int | None = None,
    split: str = "test",
    dataset: str | None = None,
) -> Evaluation:
    """Evaluate a version on a split of a data set by the run's objective; record it."""
    store = ref.store()
    name = dataset or cfg.data.name
    info = open_dataset(store, name)
    objective = objective_for(cfg.train, cfg.data.fields)
    objective.check(info.fields)
    number, state = load_version(ref, number)
    arrays = read_arrays(store, name, split, fields=objective.fields or None)
    model = new_model(cfg, info)
    metrics = evaluate(model, state, arrays, objective, cfg.data.eval_batch_size, cfg.train.device)
    return ref.ledger().record_evaluation(
        ref.run,
        number,
        epoch,
        split if dataset is None else f"{name}:{split}",
        metrics.get("accuracy"),
        metrics["loss"],
        len(next(iter(arrays.values()))),
        metrics=metrics,
    )


def export_version(
    ref: RunRef, out: str | Path, number: int | None = None, *, force: bool = False
) -> tuple[int, Path]:
    """Write a version as ``.safetensors`` or a plain ``.pt`` state dict.

    Written to a temporary file beside ``out`` and renamed over it, so a
    failed export leaves no partial file; an existing ``out`` is replaced
    only with ``force``.
    """
    out = Path(out)
    if out.suffix not in (".safetensors", ".pt"):
        raise ConfigError(f"cannot export to {out}: use a .safetensors or .pt file name")
    if out.is_dir():
        raise ConfigError(f"cannot export to {out}: it is a directory; name a file in it")
    if out.exists() and not force:
        raise ConfigError(f"{out} exists: pass --force to replace it, or name another file")
    number, state = load_version(ref, number)
    tensors = {k: v.contiguous() for k, v in state.items()}
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".safetensors":
            from safetensors.torch import save_file

            meta: dict[str, Any] = {"run": ref.run, "version": str(number), "format": "pt"}
            save_file(tensors, str(tmp), metadata=meta)
        else:
            # A plain dict of tensors: loads with torch.load(weights_only=True).
            torch.save(tensors, tmp)
        os.replace(tmp, out)
    except (OSError, RuntimeError) as exc:
        # RuntimeError: torch.save's own words for a file it cannot open.
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"cannot export to {out}: {detail}") from None
    finally:
        # Under a file (out = some_file/m.pt) even the clean-up cannot look there.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return number, out
