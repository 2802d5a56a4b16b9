"""The built-in classifiers: ``mlp``, ``cnn1d``, ``cnn2d``, ``resnet``.

All take ``input_shape`` and ``num_classes`` (from the data set, see
:func:`vcdl.models.factory.build_model`):

- :func:`mlp`: flatten + fully connected layers.
- :func:`cnn1d`: for MNIST-1D, after the reference ``ConvBase`` in
  https://github.com/greydanus/mnist1d (Greydanus & Kobak 2020).
- :func:`cnn2d`: a small conv net for 32x32 images (upsampled digits).
- :func:`resnet`: CIFAR-style ResNet-(6n+2) with BatchNorm (He et al. 2016,
  https://arxiv.org/abs/1512.03385, section 4.2), whose buffers exercise the
  buffer merge rules.

Construction draws only from torch's global RNG, so ``torch.manual_seed``
before building gives identical initial weights everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from vcdl.errors import ModelError

# --------------------------------------------------------------------------
# Built-ins
# --------------------------------------------------------------------------


def _shape(input_shape: Sequence[int], factory: str) -> tuple[int, ...]:
    shape = tuple(int(d) for d in input_shape)
    if not shape or any(d < 1 for d in shape):
        raise ModelError(f"{factory}: input_shape must be positive sizes, got {input_shape!r}")
    return shape


def _classes(num_classes: int, factory: str) -> int:
    if int(num_classes) < 1:
        raise ModelError(f"{factory}: num_classes must be >= 1, got {num_classes}")
    return int(num_classes)


def mlp(
    input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (256, 256)
) -> nn.Module:
    """Flatten, then ``Linear-ReLU`` per entry of ``hidden``, then a linear classifier."""
    shape, classes = _shape(input_shape, "mlp"), _classes(num_classes, "mlp")
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(shape)
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def _conv_out(length: int, kernel: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - kernel) // stride + 1


class CNN1d(nn.Module):
    """Three strided 1-D convolutions and a linear head, as mnist1d's ``ConvBase``.

    Accepts ``(N, L)`` or ``(N, 1, L)``.
    """

    def __init__(self, length: int, num_classes: int, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, width, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        out = _conv_out(_conv_out(_conv_out(length, 5, 2, 1), 3, 2, 1), 3, 2, 1)
        self.linear = nn.Linear(width * out, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], 1, x.shape[-1])
        h = self.conv1(h).relu()
        h = self.conv2(h).relu()
        h = self.conv3(h).relu()
        return self.linear(h.flatten(1))


def cnn1d(input_shape: Sequence[int] = (40,), num_classes: int = 10, width: int = 64) -> nn.Module:
    """MNIST-1D conv net; ``input_shape`` is ``(L,)`` or ``(1, L)`` with L >= 3."""
    shape, classes = _shape(input_shape, "cnn1d"), _classes(num_classes, "cnn1d")
    if len(shape) == 2 and shape[0] == 1:
        shape = shape[1:]
    # L >= 3 keeps every conv output at least one step long.
    if len(shape) != 1 or shape[0] < 3:
        raise ModelError(f"cnn1d: input_shape must be (L,) or (1, L) with L >= 3, got {shape}")
    return CNN1d(shape[0], classes, int(width))


def cnn2d(
    input_shape: Sequence[int] = (1, 32, 32), num_classes: int = 10, width: int = 32
) -> nn.Module:
    """Three ``conv3x3-ReLU-maxpool2`` stages (width, 2·width, 2·width), then a linear head.

    ``input_shape`` is ``(C, H, W)`` with H, W >= 8.
    """
    shape, classes = _shape(input_shape, "cnn2d"), _classes(num_classes, "cnn2d")
    if len(shape) != 3 or min(shape[1:]) < 8:
        raise ModelError(f"cnn2d: input_shape must be (C, H, W) with H, W >= 8, got {shape}")
    c, h, w = shape
    w1, w2 = int(width), 2 * int(width)
    return nn.Sequential(
        nn.Conv2d(c, w1, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(w1, w2, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(w2, w2, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(w2 * (h // 8) * (w // 8), classes),
    )


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            # Projection shortcut (option B): simpler than zero-padding and has
            # parameters of the same kinds as the rest of the net.
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn1(self.conv1(x)).relu()
        out = self.bn2(self.conv2(out))
        return (out + self.shortcut(x)).relu()


class ResNet(nn.Module):
    """CIFAR-style ResNet: stem, three stages of ``blocks`` blocks, global pool, linear."""

    def __init__(self, channels: int, num_classes: int, blocks: int, width: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        stages: list[nn.Module] = []
        c_in = width
        for i, c_out in enumerate((width, 2 * width, 4 * width)):
            for b in range(blocks):
                stride = 2 if i > 0 and b == 0 else 1
                stages.append(BasicBlock(c_in, c_out, stride))
                c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stages(self.stem(x))
        return self.fc(self.pool(h).flatten(1))


def resnet(
    input_shape: Sequence[int] = (3, 32, 32),
    num_classes: int = 10,
    depth: int = 8,
    width: int = 16,
) -> nn.Module:
    """ResNet-``depth`` (depth = 6n+2: n blocks per stage) with BatchNorm.

    ``input_shape`` is ``(C, H, W)``; any channel count, e.g. 1 for digits.
    """
    shape, classes = _shape(input_shape, "resnet"), _classes(num_classes, "resnet")
    if len(shape) != 3:
        raise ModelError(f"resnet: input_shape must be (C, H, W), got {shape}")
    if depth < 8 or (depth - 2) % 6:
        raise ModelError(f"resnet: depth must be 6n+2 with n >= 1 (8, 14, 20, ...), got {depth}")
    return ResNet(shape[0], classes, (depth - 2) // 6, int(width))
