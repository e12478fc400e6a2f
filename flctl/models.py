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


def conv_net(in_channels: int, n_classes: int, width: int = 16) -> nn.Sequential:
    """Three conv-BatchNorm-ReLU blocks (``width``, 2x, 4x channels; max-pool after the first two) and a linear head
    on the global average: a CPU-sized stand-in for ResNet-18 on 28x28 images (28 -> 14 -> 7). BatchNorm keeps it
    stable at the ResNet's SGD step size (0.1), so the task's paper defaults fit both models."""
    def block(a: int, b: int) -> list[nn.Module]:
        return [nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU()]

    return nn.Sequential(
        *block(in_channels, width), nn.MaxPool2d(2),
        *block(width, 2 * width), nn.MaxPool2d(2),
        *block(2 * width, 4 * width),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4 * width, n_classes),
    )


def resnet18(num_outputs: int, small_inputs: bool = True, width: int = 64, in_channels: int = 3) -> nn.Module:
    """torchvision's ResNet-18 with a ``num_outputs`` head.

    ``small_inputs`` swaps the ImageNet stem (7x7 stride-2 conv + max-pool) for the CIFAR one (3x3 stride-1
    conv, no pool), as in the paper's CIFAR-10 experiments; ``in_channels`` = 1 for grayscale images. ``width`` < 64
    gives a narrower copy (same depth) for CPU tests and benchmarks; the head always matches ``num_outputs`` (the
    reference code's 1000-way head on CIFAR is exactly the slip this guards against).
    """
    from torchvision.models.resnet import BasicBlock, ResNet

    class _Narrow(ResNet):
        def __init__(self) -> None:
            super().__init__(BasicBlock, [2, 2, 2, 2], num_classes=num_outputs)
            if width != 64:  # rebuild the stages at the requested width
                self.inplanes = width
                self.conv1 = nn.Conv2d(in_channels, width, 7, 2, 3, bias=False)
                self.bn1 = nn.BatchNorm2d(width)
                self.layer1 = self._make_layer(BasicBlock, width, 2)
                self.layer2 = self._make_layer(BasicBlock, 2 * width, 2, stride=2)
                self.layer3 = self._make_layer(BasicBlock, 4 * width, 2, stride=2)
                self.layer4 = self._make_layer(BasicBlock, 8 * width, 2, stride=2)
                self.fc = nn.Linear(8 * width, num_outputs)
                for m in self.modules():  # the same initialization torchvision gives the full-width net
                    if isinstance(m, nn.Conv2d):
                        nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                    elif isinstance(m, nn.BatchNorm2d):
                        nn.init.ones_(m.weight)
                        nn.init.zeros_(m.bias)

    model = _Narrow()
    if small_inputs:
        model.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
    return model
