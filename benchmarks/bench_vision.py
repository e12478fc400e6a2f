"""Vision input pipeline and method overhead: flctl's on-device pipeline vs a standard torchvision DataLoader.

Both train the same CIFAR ResNet-18 (reduced --width on CPU) on CIFAR-shaped uint8 data, side by side in one
process, for --steps steps each, interleaved over --rounds:
  flctl     : data as one uint8 tensor on the device, x[ids] + batched crop_flip, Normalize in the model
  dataloader: torchvision.datasets-style per-sample PIL images, transforms RandomCrop(32, 4) +
              RandomHorizontalFlip + ToTensor + Normalize, torch.utils.data.DataLoader(shuffle, --workers)
Also FL, RFL and CSERM step time as a ratio of ERM's on the flctl pipeline. Prints medians and ratios.

    python benchmarks/bench_vision.py                 # CPU, width 8, 2048 images
    python benchmarks/bench_vision.py --device cuda --width 64 --images 50000 --steps 100
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from flctl.data import Normalize, batches, crop_flip, crop_flip_params, epoch_order
from flctl.methods import get_method
from flctl.models import resnet18
from flctl.step import train_step
from flctl.tasks import Task

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
TASK = Task(name="bench", kind="classification", description="", defaults={}, load=lambda *a: None)


def model_for(width: int, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(Normalize(MEAN, STD), resnet18(10, width=width)).to(device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def flctl_steps(x, y, model, method, opt, steps, batch, device, state) -> float:
    gen = torch.Generator(device=device).manual_seed(state["epoch"])
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        ids = next(state["it"], None)
        if ids is None:
            state["epoch"] += 1
            state["it"] = iter(batches(epoch_order(len(x), 0, state["epoch"]).to(device), batch))
            ids = next(state["it"])
        xb = crop_flip(x[ids], crop_flip_params(len(ids), gen, x.device))
        train_step(TASK, model, method, opt, xb, y[ids], ids)
    sync(device)
    return (time.perf_counter() - t) / steps


def loader_steps(loader_state, model, opt, steps, device) -> float:
    method = get_method("erm")(1)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        try:
            xb, yb = next(loader_state["it"])
        except StopIteration:
            loader_state["it"] = iter(loader_state["loader"])
            xb, yb = next(loader_state["it"])
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        train_step(TASK, model, method, opt, xb, yb, torch.arange(len(yb), device=device))
    sync(device)
    return (time.perf_counter() - t) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", metavar="PATH", help="also write the medians and ratios as JSON")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from PIL import Image
    from torch.utils.data import DataLoader
    from torchvision import transforms

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.images, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, args.images)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(args.device)
    y = torch.from_numpy(labels).to(args.device)

    class PilDataset(torch.utils.data.Dataset):   # what torchvision.datasets.CIFAR10 does per sample
        tf = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(), transforms.Normalize(MEAN, STD)])

        def __len__(self):
            return len(images)

        def __getitem__(self, i):
            return self.tf(Image.fromarray(images[i])), int(labels[i])

    loader = DataLoader(PilDataset(), batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        drop_last=True, persistent_workers=args.workers > 0)
    plain = torch.nn.Sequential(*list(model_for(args.width, args.device))[1:])   # the loader normalizes itself
    runs = {}
    for name in ("erm", "fl", "rfl", "cserm"):
        model = model_for(args.width, args.device)
        runs[name] = (model, get_method(name)(len(x), eps=0.5, alpha=1.0, dual_lr=1e-4, device=args.device),
                      torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True),
                      {"epoch": 0, "it": iter(())})
    loader_state = {"loader": loader, "it": iter(loader)}
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9, foreach=True)
    times: dict[str, list[float]] = {k: [] for k in (*runs, "dataloader")}
    for r in range(args.rounds + 1):                                  # round 0 warms up
        for name, (model, method, opt, state) in runs.items():
            t = flctl_steps(x, y, model, method, opt, args.steps, args.batch, args.device, state)
            if r:
                times[name].append(t)
        t = loader_steps(loader_state, plain, plain_opt, args.steps, args.device)
        if r:
            times["dataloader"].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"device {args.device}, ResNet-18 width {args.width}, batch {args.batch}, {args.images} images, "
          f"{args.rounds} rounds x {args.steps} steps (median s/step)")
    print(f"  input pipeline: flctl on-device ERM {med['erm'] * 1e3:.1f} ms/step, torchvision DataLoader "
          f"({args.workers} workers) {med['dataloader'] * 1e3:.1f} ms/step -> speed-up x{med['dataloader'] / med['erm']:.2f}")
    ratio = {}
    for name in ("fl", "rfl", "cserm"):
        ratio[name] = statistics.median([e / m for e, m in zip(times["erm"], times[name])])
        print(f"  {name.upper():5s} steps/s as a ratio of ERM's: {ratio[name]:.3f}")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"args": vars(args), "median_s_per_step": med,
                                               "steps_per_s_ratio_to_erm": ratio, "times": times}, indent=1))


if __name__ == "__main__":
    main()
