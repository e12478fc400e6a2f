"""Models used by the tasks. Small and explicit; torchvision's where it has the model."""

from __future__ import annotations

from torch import nn


def mlp(sizes: list[int]) -> nn.Sequential:
    """Fully connected ReLU network, e.g. mlp([2, 70, 70, 2]) for two-moons (paper App. B)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def small_cnn(in_channels: int, n_classes: int, width: int = 32) -> nn.Sequential:
    """Two conv blocks and a linear head; for 8x8 digit images (no pooling below 2x2)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),                                    # 8x8 -> 4x4
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(2 * width, n_classes),
    )
