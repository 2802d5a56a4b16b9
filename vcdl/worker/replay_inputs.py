"""What a replay needs of an attempt besides its config and its ledger row, as the worker
records it (``attempt.replay_inputs``, ledger migration 0011; read by :mod:`vcdl.replay`)."""

from __future__ import annotations

import torch

from vcdl.config import RunConfig
from vcdl.worker.loop import resolve_device


def replay_inputs(
    cfg: RunConfig,
    *,
    seed: int,
    start_samples: int,
    optimizer_from: object,
    variable_from: str | None,
    variable_alpha: float | None,
) -> dict[str, object]:
    """What re-training an attempt needs besides the run's config and the ledger's row
    (``attempt.replay_inputs``, read by :mod:`vcdl.replay`).

    ``start_samples``: the samples of the checkpoint it resumed (the row's
    ``resumed_from`` names whose); ``optimizer_from``: the attempt whose final
    optimizer state it continued (``train.optimizer_state = "worker"``);
    ``variable_from``: the attempt whose result was its EASGD variable, pulled
    with ``variable_alpha``. The device, autocast and threads say whether a
    CPU replay can be bit for bit.
    """
    device = resolve_device(cfg.train.device)
    return {
        "format": 1,
        "seed": seed,
        "start_samples": start_samples,
        "optimizer_from": optimizer_from if isinstance(optimizer_from, str) else None,
        "variable_from": variable_from,
        "variable_alpha": variable_alpha,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "amp": bool(cfg.train.amp and device.type == "cuda"),
        "threads": cfg.train.threads,
        "torch": torch.__version__,
        "precision": cfg.merge.result_precision,
    }
