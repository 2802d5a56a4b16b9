"""Objectives: what a job's loss is, and how it is evaluated; chosen by ``train.objective``.

The worker's training loop and the driver's evaluation are the same for
every job; the objective says which arrays of the data set a batch needs,
how the stored arrays become the model's input (dtypes are cast here, when a
batch is formed: uint8 images stay uint8 in the store and in memory until
then), the loss, and the metrics of an evaluation:

``classification`` (the default)
    fields ``x`` and ``y`` (integer labels); cross-entropy; metrics ``loss``
    and ``accuracy``.
``regression``
    fields ``x`` and ``y`` (numbers, one or more per row); mean squared
    error; metrics ``loss`` (the MSE) and ``rmse``.
``causal_lm``
    field ``tokens`` (token ids, ``context + 1`` per row); next-token
    cross-entropy over every position; metrics ``loss`` (nats per token),
    ``perplexity`` and ``token_accuracy``.
an import path ``"package.module:function"``
    the user's ``function(model, batch) -> loss`` (a scalar tensor), where
    ``batch`` maps every field of the data set to a tensor in its stored dtype
    on the model's device; ``train.metrics`` may name a
    ``metrics(model, batch) -> dict[str, float]`` of per-batch means, averaged
    over the evaluation split weighted by rows.

An evaluation reports ``loss`` for every job; ``accuracy`` only where it
exists. :attr:`Objective.headline` is the metric ``vcdl status`` shows first
and ``retrain --version best`` ranks by.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from vcdl.config import TrainSection
from vcdl.errors import ConfigError, DataError
from vcdl.usercode import check_allowed, import_callable

Batch = dict[str, torch.Tensor]

BUILTIN_OBJECTIVES = ("classification", "regression", "causal_lm")


class Objective(ABC):
    """A job's loss and evaluation metrics (see the module docstring)."""

    name: ClassVar[str]
    fields: tuple[str, ...] = ()
    """The data set's arrays a batch needs, under the data set's names (empty: all of them)."""
    inputs: tuple[str, ...] = ()
    """The objective's own names for them (``fields`` unless ``[data] fields`` renames)."""
    headline: ClassVar[str] = "loss"
    higher_is_better: ClassVar[bool] = False

    def __init__(self) -> None:
        self.inputs = self.fields

    def bind(self, names: Mapping[str, str]) -> Objective:
        """Read the inputs under the data set's own names (``[data] fields``: input -> field).

        Raises :class:`ConfigError` naming an input this objective does not read.
        """
        unknown = sorted(set(names) - set(self.inputs))
        if unknown:
            reads = ", ".join(self.inputs) or "every field under its own name"
            raise ConfigError(
                f"data.fields maps {', '.join(unknown)}, which objective {self.name!r} does "
                f"not read (it reads {reads})"
            )
        self.fields = tuple(names.get(f, f) for f in self.inputs)
        return self

    def check(self, fields: Iterable[str]) -> None:
        """Raise :class:`DataError` if a data set with ``fields`` cannot serve this objective."""
        have = set(fields)
        missing = [f for f in self.fields if f not in have]
        if missing:
            own = [i for i, f in zip(self.inputs, self.fields, strict=True) if f in missing]
            example = ", ".join(f'{i} = "<field>"' for i in own)
            raise DataError(
                f"objective {self.name!r} needs the field(s) {', '.join(missing)}; the data set "
                f"has {', '.join(sorted(have))}: name yours in [data] fields = {{ {example} }}"
            )

    def own_names(self, batch: Batch) -> Batch:
        """A batch keyed by the data set's names, keyed by this objective's inputs instead."""
        if self.fields == self.inputs:
            return batch
        return {i: batch[f] for i, f in zip(self.inputs, self.fields, strict=True)}

    def prepare(self, batch: Batch) -> Batch:
        """The stored arrays of a batch, cast for the model (default: as stored)."""
        return batch

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The mean loss over the batch (a scalar tensor that backpropagates)."""

    def measure(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        """Sums over the batch for an evaluation (on the device; no host sync per batch).

        Every objective sums ``loss`` and the weight ``n`` it is averaged by;
        :meth:`finish` turns the totals into metrics.
        """
        n = next(iter(batch.values())).shape[0]
        return {"loss": self.loss(model, batch).detach() * n, "n": torch.tensor(float(n))}

    def finish(self, totals: Mapping[str, float]) -> dict[str, float]:
        """The evaluation's metrics from the summed :meth:`measure` of every batch."""
        n = totals["n"] or 1.0
        return {k: v / n for k, v in totals.items() if k != "n"}


class Classification(Objective):
    name = "classification"
    fields = ("x", "y")
    headline = "accuracy"
    higher_is_better = True

    def prepare(self, batch: Batch) -> Batch:
        batch = self.own_names(batch)
        return {"x": batch["x"].float(), "y": batch["y"].long()}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]), batch["y"])

    def measure(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        out = model(batch["x"])
        y = batch["y"]
        return {
            "loss": F.cross_entropy(out, y, reduction="sum").detach(),
            "accuracy": (out.argmax(dim=1) == y).sum().float(),
            "n": torch.tensor(float(len(y))),
        }


class Regression(Objective):
    name = "regression"
    fields = ("x", "y")

    def prepare(self, batch: Batch) -> Batch:
        batch = self.own_names(batch)
        return {"x": batch["x"].float(), "y": batch["y"].float()}

    def _pair(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        out, y = model(batch["x"]), batch["y"]
        if out.shape != y.shape and out.numel() == y.numel():
            out = out.reshape(y.shape)  # (n, 1) against (n,): one target per row
        return out, y

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.mse_loss(*self._pair(model, batch))

    def finish(self, totals: Mapping[str, float]) -> dict[str, float]:
        metrics = super().finish(totals)
        metrics["rmse"] = math.sqrt(max(0.0, metrics["loss"]))
        return metrics


class CausalLM(Objective):
    name = "causal_lm"
    fields = ("tokens",)

    def prepare(self, batch: Batch) -> Batch:
        return {"tokens": self.own_names(batch)["tokens"].long()}

    def _logits(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = batch["tokens"]
        logits = model(tokens[:, :-1])
        return logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(*self._logits(model, batch))

    def measure(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        logits, targets = self._logits(model, batch)
        return {
            "loss": F.cross_entropy(logits, targets, reduction="sum").detach(),
            "token_accuracy": (logits.argmax(dim=1) == targets).sum().float(),
            "n": torch.tensor(float(targets.numel())),
        }

    def finish(self, totals: Mapping[str, float]) -> dict[str, float]:
        metrics = super().finish(totals)
        # exp of a diverged loss overflows: report inf, not an error.
        metrics["perplexity"] = math.exp(min(metrics["loss"], 700.0))
        return metrics


class Custom(Objective):
    """The user's loss (and metrics) functions, named by import path."""

    name = "custom"

    def __init__(
        self,
        spec: str,
        loss_fn: Callable[[nn.Module, Batch], torch.Tensor],
        metrics_fn: Callable[[nn.Module, Batch], Mapping[str, float]] | None,
    ) -> None:
        super().__init__()
        self.spec, self.loss_fn, self.metrics_fn = spec, loss_fn, metrics_fn

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        value = self.loss_fn(model, batch)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise TypeError(
                f"objective {self.spec!r} returned {type(value).__name__}, not a scalar loss tensor"
            )
        return value.reshape(())

    def measure(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        totals = super().measure(model, batch)
        if self.metrics_fn is not None:
            n = totals["n"]
            for k, v in dict(self.metrics_fn(model, batch)).items():
                if k not in ("loss", "n"):
                    totals[k] = torch.as_tensor(float(v)) * n
        return totals


_BUILTINS: dict[str, type[Objective]] = {o.name: o for o in (Classification, Regression, CausalLM)}


def objective_for(train: TrainSection, fields: Mapping[str, str] | None = None) -> Objective:
    """The objective a run's ``train`` settings name (built-in, or import paths).

    ``fields``: ``[data] fields``, a built-in's inputs under the data set's names.
    """
    spec = train.objective
    if spec in _BUILTINS:
        if train.metrics is not None:
            raise ConfigError(
                f"train.metrics is for an objective given by import path, not {spec!r}"
            )
        return _BUILTINS[spec]().bind(fields or {})
    if fields:
        raise ConfigError(
            f"data.fields names a built-in objective's inputs; objective {spec!r} reads every "
            "field of the data set under its own name: leave data.fields out"
        )
    if train.metrics is not None:  # both allowed before either is imported
        check_allowed(train.metrics, what="metrics", builtins={}, error=ConfigError)
    loss_fn = import_callable(spec, what="objective", builtins={}, error=ConfigError)
    metrics_fn = (
        import_callable(train.metrics, what="metrics", builtins={}, error=ConfigError)
        if train.metrics is not None
        else None
    )
    return Custom(spec, loss_fn, metrics_fn)


def to_batch(arrays: Mapping[str, Any], device: torch.device | None = None) -> Batch:
    """Stored arrays (numpy) as tensors, in their dtypes, on ``device``.

    To a GPU through pinned (page-locked) host memory, asynchronously: the
    copy overlaps whatever the host does next, and the first kernel that
    reads the tensor waits for it on the device, not the host.
    """
    import numpy as np

    out = {}
    for name, a in arrays.items():
        t = torch.from_numpy(np.ascontiguousarray(a))
        if device is not None and device.type == "cuda":
            t = t.pin_memory().to(device, non_blocking=True)
        elif device is not None and device.type != "cpu":
            t = t.to(device)
        out[name] = t
    return out
