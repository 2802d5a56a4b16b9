"""Models: factories found by import path or built-in name, and the built-in models.

:mod:`.factory` (resolve and call a factory with the data set's hints),
:mod:`.classifiers` (``mlp``, ``cnn1d``, ``cnn2d``, ``resnet``), :mod:`.gpt`
(a small decoder-only transformer), :mod:`.synthetic` (a model whose
training is a sleep, for measuring a fleet).
"""

from __future__ import annotations

from vcdl.models.classifiers import cnn1d, cnn2d, mlp, resnet
from vcdl.models.factory import BUILTIN_MODELS, build_model, resolve_factory
from vcdl.models.gpt import gpt

__all__ = [
    "BUILTIN_MODELS",
    "build_model",
    "cnn1d",
    "cnn2d",
    "gpt",
    "mlp",
    "resnet",
    "resolve_factory",
]
