"""Shared type aliases."""

from __future__ import annotations

import torch

StateDict = dict[str, torch.Tensor]
"""A model's parameters and buffers by name, as ``Module.state_dict()`` returns."""
