"""GPU proof: paper-scale timings of the CUDA paths, written as one JSON file per section.

Each section trains through flctl's own ``train()`` (the loop `flctl run` uses) on data written in the dataset's
real on-disk format, so the loaders, the on-device pipelines and the checkpoints are all in the timings.

    python benchmarks/bench_gpu.py cifar --out DIR         # epoch time per method, 50k/10k CIFAR-format batches
    python benchmarks/bench_gpu.py share --k 1,2,4          # K processes training on one GPU: aggregate images/s
    python benchmarks/bench_gpu.py profile                  # torch.profiler summary of FL steps
    python benchmarks/bench_gpu.py precision                # bf16 autocast vs fp32, two-moons and digits, 3 seeds
    python benchmarks/bench_gpu.py dpo                      # orca-dpo: tiny on CUDA, a saved LM in 4-bit NF4
    python benchmarks/bench_gpu.py utkface                  # 4,438 training JPEGs at the default 64 px

``--small`` shrinks every size so the whole file runs on a CPU in a couple of minutes (a check of this script,
not a measurement). Epoch times are medians of the epochs after the first (which pays cuDNN's and the
allocator's warm-up); an epoch that evaluates is timed separately and its extra cost reported as ``eval_s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))          # the tests' writers of the real on-disk formats

from flctl.config import resolve  # noqa: E402
from flctl.tasks import get_task  # noqa: E402
from flctl.train import EpochStats, train  # noqa: E402
from tests.fixtures import orca_rows, write_cifar10, write_orca_dpo  # noqa: E402

METHODS = ("erm", "fl", "rfl", "cserm")


class Stop(Exception):
    """Raised from the epoch callback once enough epochs are timed."""


def config(task: str, method: str, device: str, **overrides):
    cfg = resolve(get_task(task), method, overrides)
    return dataclasses.replace(cfg, device=device)


def timed_epochs(cfg, work: Path, epochs: int) -> dict:
    """Train ``cfg`` for ``epochs`` epochs (of its full schedule) and time each one from the callback."""
    marks: list[tuple[float, bool]] = []
    start = time.perf_counter()

    def on_epoch(stats: EpochStats) -> None:
        if cfg.device.startswith("cuda"):
            torch.cuda.synchronize()
        marks.append((time.perf_counter(), stats.metrics is not None))
        if len(marks) >= epochs:
            raise Stop

    if cfg.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    status = "timed"
    try:
        status = train(cfg, work / "records", work / cfg.run_id, on_epoch=on_epoch).status
    except Stop:
        pass
    if len(marks) < 3:
        return {"status": status, "epochs_done": len(marks)}
    times = [b - a for (a, _), (b, _) in zip([(start, False)] + marks[:-1], marks)]
    plain = [t for t, (_, ev) in zip(times[1:], marks[1:]) if not ev]
    with_eval = [t for t, (_, ev) in zip(times[1:], marks[1:]) if ev]
    epoch_s = statistics.median(plain)
    return {"status": status, "epoch_s": epoch_s, "epoch_times_s": [round(t, 4) for t in times],
            "first_epoch_s": times[0],          # includes data loading, model build, warm-up
            "eval_s": (statistics.median(with_eval) - epoch_s) if with_eval else None,
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if cfg.device.startswith("cuda") else None,
            # what stays allocated between steps: weights, optimizer state, multipliers, the data on the device
            "resident_mem_gb": torch.cuda.memory_allocated() / 2**30 if cfg.device.startswith("cuda") else None}


def extrapolate(t: dict, cfg) -> float:
    """Whole-run seconds: first epoch + the remaining epochs + one eval per eval_every (and the final one)."""
    evals = len({e for e in range(cfg.eval_every, cfg.epochs + 1, cfg.eval_every)} | {cfg.epochs})
    return t["first_epoch_s"] + (cfg.epochs - 1) * t["epoch_s"] + evals * (t["eval_s"] or 0.0)


# ------------------------------------------------------------------------------------------------ sections

def cifar(args) -> dict:
    per_batch = 200 if args.small else 10_000           # 5 x 10,000 train + 10,000 test, as the real batches
    data = write_cifar10(args.work / "cifar", per_batch=per_batch)
    out = {"images_train": 5 * per_batch, "images_test": per_batch, "precision": args.precision, "methods": {}}
    width = 8 if args.small else 64
    for m in args.methods.split(","):
        # eval every 5 epochs so that epoch 5 of the 6 timed ones shows the evaluation's cost
        # CSERM steps at lr/10 (the paper's primal table); at the full lr it diverges on random labels
        lr = {"lr": get_task("cifar10").defaults["lr"] / 10} if m == "cserm" else {}
        cfg = config("cifar10", m, args.device, data_dir=str(data), eval_every=5, options={"width": width},
                     precision=args.precision, **lr)
        t = timed_epochs(cfg, args.work / "runs", 6)
        full = config("cifar10", m, args.device, data_dir=str(data), options={"width": width})   # paper schedule
        out["methods"][m] = t
        if "epoch_s" not in t:
            print(f"cifar10 {m}: {t}", flush=True)
            continue
        t["images_per_s"] = 5 * per_batch / t["epoch_s"]
        t["paper_run_min"] = extrapolate(t, full) / 60
        print(f"cifar10 {m}: {t['epoch_s']:.2f} s/epoch, {t['images_per_s']:.0f} img/s, eval {t['eval_s']}, "
              f"200 epochs ~ {t['paper_run_min']:.1f} min", flush=True)
    if "epoch_s" in out["methods"].get("erm", {}):
        erm = out["methods"]["erm"]["epoch_s"]
        out["epoch_time_ratio_to_erm"] = {m: t["epoch_s"] / erm for m, t in out["methods"].items() if "epoch_s" in t}
    return out


def cifar_fl_step_setup(args, n: int):
    """What the step-level sections train: n random CIFAR-sized images on the device, the task's ResNet-18
    (channels-last on CUDA), FL's multipliers, the paper's SGD, and an augmentation generator."""
    from flctl.methods import get_method
    from flctl_tasks.cifar10 import build_model

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g).to(args.device)
    y = torch.randint(0, 10, (n,), generator=g).to(args.device)
    torch.manual_seed(0)
    model = build_model({"width": 8 if args.small else 64}, None).to(args.device)
    if args.device.startswith("cuda"):
        model = model.to(memory_format=torch.channels_last)
    method = get_method("fl")(n, eps=0.51, alpha=1.0, dual_lr=1e-4, device=args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, foreach=True)
    return get_task("cifar10"), x, y, model, method, opt, torch.Generator(device=args.device).manual_seed(0)


def share_worker(args) -> None:
    """One of K processes: warm up, wait for the common start, count images trained in --seconds."""
    from flctl.data import batches, crop_flip, crop_flip_params, epoch_order
    from flctl.train import train_step

    n = 2048 if args.small else 50_000
    task, x, y, model, method, opt, aug = cifar_fl_step_setup(args, n)

    def stream():
        epoch = 0
        while True:
            yield from batches(epoch_order(n, 0, epoch).to(args.device), 128)
            epoch += 1

    it = stream()

    def step() -> int:
        ids = next(it)
        train_step(task, model, method, opt, crop_flip(x[ids], crop_flip_params(len(ids), aug, x.device)), y[ids], ids)
        return len(ids)

    for _ in range(20):
        step()
    torch.cuda.synchronize() if args.device.startswith("cuda") else None
    while time.time() < args.start_at:
        time.sleep(0.005)
    t0, images = time.perf_counter(), 0
    while time.perf_counter() - t0 < args.seconds:
        images += step()
    torch.cuda.synchronize() if args.device.startswith("cuda") else None
    print(json.dumps({"images": images, "seconds": time.perf_counter() - t0}))


def share(args) -> dict:
    out = {}
    for k in [int(v) for v in args.k.split(",")]:
        start_at = time.time() + (20 if not args.small else 8)   # every worker's warm-up is done by then
        cmd = [sys.executable, __file__, "share-worker", "--device", args.device, "--seconds", str(args.seconds),
               "--start-at", str(start_at)] + (["--small"] if args.small else [])
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(k)]
        results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        total = sum(r["images"] / r["seconds"] for r in results)
        out[str(k)] = {"aggregate_images_per_s": total, "per_process": [r["images"] / r["seconds"] for r in results]}
        print(f"share K={k}: {total:.0f} img/s aggregate", flush=True)
    return out


def profile(args) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from flctl.data import crop_flip, crop_flip_params
    from flctl.train import train_step

    n = 4096
    task, x, y, model, method, opt, gen = cifar_fl_step_setup(args, n)
    order = torch.randperm(n).to(args.device).split(128)

    def steps(k: int) -> None:
        for ids in order[:k]:
            train_step(task, model, method, opt, crop_flip(x[ids], crop_flip_params(len(ids), gen, x.device)), y[ids], ids)

    steps(10)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with torch_profile(activities=activities) as prof:
        steps(20)
        torch.cuda.synchronize() if args.device.startswith("cuda") else None
    sort = "cuda_time_total" if args.device.startswith("cuda") else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=20)
    (args.out / "profile.txt").write_text(table)
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events) if args.device.startswith("cuda") else None
    t0 = time.perf_counter()
    steps(20)
    torch.cuda.synchronize() if args.device.startswith("cuda") else None
    wall_us = (time.perf_counter() - t0) * 1e6
    print(table, flush=True)
    bench = {}
    if args.device.startswith("cuda"):     # cuDNN's autotuner (shapes are fixed within an epoch)
        for flag in (False, True, False, True):
            torch.backends.cudnn.benchmark = flag
            steps(10)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            steps(30)
            torch.cuda.synchronize()
            bench.setdefault(str(flag), []).append((time.perf_counter() - t0) / 30 * 1e3)
        torch.backends.cudnn.benchmark = False
        print(f"cudnn.benchmark ms/step: {bench}", flush=True)
    return {"steps": 20, "wall_ms_per_step": wall_us / 20 / 1e3, "cudnn_benchmark_ms_per_step": bench,
            "gpu_busy_ms_per_step": None if device_us is None else device_us / 20 / 1e3,
            "kernels_per_step": sum(e.count for e in events if e.device_type.name == "CUDA") / 20
            if args.device.startswith("cuda") else None}


def precision(args) -> dict:
    import pyarrow.parquet as pq

    out: dict = {}
    seeds = (0, 1, 2)
    for task, method in (("two-moons", "fl"), ("digits", "fl")):
        for prec in ("auto", "fp32"):
            rows = []
            for seed in seeds:
                over = {"epochs": 20} if args.small else {}
                cfg = config(task, method, args.device, seed=seed, precision=prec, **over)
                t0 = time.perf_counter()
                res = train(cfg, args.work / "prec" / "records", args.work / "prec" / cfg.run_id)
                files = sorted((args.work / "prec" / "records" / f"run_id={cfg.run_id}").glob("epoch=*.parquet"))
                schema = pq.read_schema(files[-1])
                rows.append({"seed": seed, "seconds": time.perf_counter() - t0, "status": res.status,
                             **{k: res.metrics[k] for k in ("train.avg_loss", "train.max_loss", "train.accuracy",
                                                            "test.accuracy", "test.avg_loss", "train.violation_rate")},
                             "record_types": {f: str(schema.field(f).type) for f in ("loss", "multiplier")}})
            summary = {}
            for k in ("train.avg_loss", "train.max_loss", "train.accuracy", "test.accuracy", "test.avg_loss",
                      "train.violation_rate"):
                vals = [r[k] for r in rows]
                summary[k] = {"mean": statistics.mean(vals), "std": statistics.stdev(vals)}
            out[f"{task}/{method}/{'bf16' if prec == 'auto' else 'fp32'}"] = {"summary": summary, "runs": rows}
            print(f"{task} {method} {prec}: " + ", ".join(f"{k} {v['mean']:.4f}±{v['std']:.4f}"
                                                          for k, v in summary.items()), flush=True)
    return out


def dpo(args) -> dict:
    from flctl_tasks import orca_dpo

    out: dict = {}
    rows = orca_rows(16) * (4 if args.small else 32)            # repeated pairs: 11 kept per 16 rows
    for i, r in enumerate(rows):
        r["input"] = f"{r['input']} (question {i})"
    data = write_orca_dpo(args.work / "orca", rows=rows)
    opts = {k: v for k, v in get_task("orca-dpo").options.items()}
    tiny = {**opts, "model": "tiny"}
    folder = args.work / "lm"
    if not folder.exists():   # a small Llama with random weights, saved as a local model folder
        from transformers import LlamaConfig, LlamaForCausalLM

        tok = orca_dpo.load_tokenizer(tiny)
        lm_cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256 if args.small else 1024,
                             intermediate_size=512 if args.small else 2816, num_hidden_layers=2 if args.small else 8,
                             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                             tie_word_embeddings=False)
        torch.manual_seed(0)
        LlamaForCausalLM(lm_cfg).save_pretrained(folder)
        tok.save_pretrained(folder)
    for name, model in (("tiny", "tiny"), ("saved-4bit" if args.device.startswith("cuda") else "saved", str(folder))):
        for m in METHODS:
            cfg = config("orca-dpo", m, args.device, data_dir=str(data), epochs=20, warmup_steps=0, lr=1e-4,
                         eval_every=3, options={"model": model})
            t = timed_epochs(cfg, args.work / "dpo", 4)
            if "epoch_s" not in t:
                out[f"{name}/{m}"] = t
                continue
            n_train = t["n_train"] = len(orca_dpo.load(cfg.opts, cfg.data_dir).train)
            t["pairs_per_s"] = n_train / t["epoch_s"]
            if t["peak_mem_gb"] is not None:   # activations of one micro-batch, per pair
                t["activation_mem_mb_per_pair"] = (t["peak_mem_gb"] - t["resident_mem_gb"]) * 1024 / cfg.micro_batch
            out[f"{name}/{m}"] = t
            print(f"orca-dpo {name} {m}: {t['pairs_per_s']:.1f} pairs/s, peak {t['peak_mem_gb']} GB", flush=True)
    return out


def _write_faces(folder: Path, n: int, size: int, start: int, stop: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(start)
    yy, xx = np.mgrid[0:size, 0:size]
    for i in range(start, stop):
        age, gender, race = int(rng.integers(1, 100)), int(rng.integers(0, 2)), int(rng.integers(0, 5))
        base = rng.integers(0, 256, 3)
        img = (base[None, None, :] + 0.5 * (xx + yy)[:, :, None] * rng.uniform(0.2, 1, 3)) % 256
        Image.fromarray(img.astype(np.uint8)).save(folder / f"{age}_{gender}_{race}_2017{i:013d}.jpg.chip.jpg",
                                                   quality=90)


def utkface(args) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    # n_train = ceil(floor(0.7 N) / 4): N = 25,360 gives the paper's 4,438 training images (7,608 test).
    n = 400 if args.small else 25_360
    folder = args.work / "utkface"
    if not folder.exists():
        folder.mkdir(parents=True)
        t0 = time.perf_counter()
        parts = np.linspace(0, n, 17).astype(int)
        with ProcessPoolExecutor(16) as pool:
            list(pool.map(_write_faces, [folder] * 16, [n] * 16, [200] * 16, parts[:-1], parts[1:]))
        print(f"wrote {n} 200x200 JPEGs in {time.perf_counter() - t0:.1f} s", flush=True)
    from flctl_tasks import utkface as utk

    t0 = time.perf_counter()
    # The text's 70/30 reading at 64 px: N = 25,360 random-age faces give 4,438 training images, as measured before
    # the authors' split became the default.
    opts = {"split": "70-30", "size": 64}
    data = utk.load({**get_task("utkface").options, **opts}, str(folder))
    decode_s = time.perf_counter() - t0
    out = {"images": n, "n_train": len(data.train), "n_test": len(data.test), "decode_and_cache_s": decode_s,
           "methods": {}}
    for m in ("erm", "rfl"):
        cfg = config("utkface", m, args.device, data_dir=str(folder), eval_every=3,
                     options={**opts, "width": 8} if args.small else opts)
        t = timed_epochs(cfg, args.work / "utk", 5)
        out["methods"][m] = t
        if "epoch_s" not in t:
            continue
        full = config("utkface", m, args.device, data_dir=str(folder), options=opts)
        t["paper_run_min"] = extrapolate(t, full) / 60
        print(f"utkface {m}: {t['epoch_s']:.2f} s/epoch, 150 epochs ~ {t['paper_run_min']:.1f} min", flush=True)
    return out


SECTIONS = {"cifar": cifar, "share": share, "profile": profile, "precision": precision, "dpo": dpo,
            "utkface": utkface}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="+", choices=[*SECTIONS, "share-worker"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("gpu-bench"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/flctl-gpu-bench"))
    ap.add_argument("--small", action="store_true", help="tiny sizes: checks this script, measures nothing")
    ap.add_argument("--precision", default="auto", help="cifar: auto (bf16 autocast on CUDA) or fp32")
    ap.add_argument("--methods", default=",".join(METHODS), help="cifar: methods to time")
    ap.add_argument("--k", default="1,2,4", help="share: processes on the GPU at once")
    ap.add_argument("--seconds", type=float, default=20.0, help="share: timed seconds per process")
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sections == ["share-worker"]:
        share_worker(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    env = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    for name in args.sections:
        t0 = time.perf_counter()
        try:
            result = {"ok": True, **SECTIONS[name](args)}
        except Exception as exc:   # one broken section must not cost the others' numbers
            import traceback

            traceback.print_exc()
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        result["section_s"] = time.perf_counter() - t0
        (args.out / f"{name}.json").write_text(json.dumps({"env": env, **result}, indent=1, default=str))
        print(f"== {name} done in {result['section_s']:.0f} s (ok={result['ok']})", flush=True)


if __name__ == "__main__":
    main()
