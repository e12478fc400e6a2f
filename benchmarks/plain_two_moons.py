"""The two-moons FL run of `flctl run two-moons --method fl` written as a plain torch script: the reference that
bench_sweep.py times a flctl process against (same data, model, optimizer, update rule, schedule and evals; no
database, records or checkpoints).

    python benchmarks/plain_two_moons.py [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import make_moons
from torch import nn


def train(seed: int) -> tuple[float, float]:
    """Train; returns the epochs loop's wall seconds and the final max training loss."""
    x, y = (torch.tensor(a) for a in make_moons(n_samples=1000, noise=0.1, random_state=0))
    xt, yt = (torch.tensor(a) for a in make_moons(n_samples=1000, noise=0.1, random_state=1))
    x, xt = x.float(), xt.float()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 70), nn.ReLU(), nn.Linear(70, 70), nn.ReLU(), nn.Linear(70, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.0)
    lam = torch.zeros(1000)
    eps, dual_lr, gen = 0.1, 1e-2, torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for epoch in range(250):
        for ids in torch.randperm(1000, generator=gen).split(512):
            losses = F.cross_entropy(model(x[ids]), y[ids], reduction="none")
            lam[ids] = (lam[ids] + dual_lr * (losses.detach() - eps)).clamp_min(0)   # dual step first
            opt.zero_grad()
            (lam[ids] * losses).sum().backward()
            opt.step()
        if (epoch + 1) % 25 == 0:
            with torch.no_grad():
                model.eval()
                train_loss = F.cross_entropy(model(x), y, reduction="none")
                F.cross_entropy(model(xt), yt, reduction="none")                # the test eval, as flctl's
                model.train()
    return time.perf_counter() - start, float(train_loss.max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    seconds, max_loss = train(args.seed)
    print(f"loop {seconds:.2f} s, final train max loss {max_loss:.4f}")


if __name__ == "__main__":
    main()
