"""orca-dpo: data filtering and split, the DPO loss, the reference, the four methods, records by pair id.

A two-layer Llama built from a config and a byte-level tokenizer stand in for the LLM (no download); the data are
JSONL/Parquet files in the columns of argilla/distilabel-intel-orca-dpo-pairs (tests/data_writers.py).
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from flctl import records
from flctl.cell import build_scheduler
from flctl.cli import app
from flctl.config import ConfigError
from flctl.losses import per_sample_loss
from flctl.methods import get_method
from flctl.step import train_step
from flctl.tasks import get_task
from flctl.train import train
from flctl_tasks import orca_dpo
from tests.data_writers import orca_rows, write_orca_dpo
from tests.helpers import config, files_under

# Found, not imported: every xdist worker collects every module, and importing peft (with bitsandbytes) and trl costs
# ~3 s of CPU; the tests import them through the task, in the one worker that runs them.
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("peft", "trl")),
                                reason="needs peft and trl (pip install -e '.[dev]')")

runner = CliRunner()
TASK = get_task("orca-dpo")
OPTS = {**TASK.options, "model": "tiny"}
KEPT = [0, 1, 2, 4, 6, 8, 10, 12, 13, 14, 15]    # rows the paper's filter keeps in orca_rows(16)


@pytest.fixture
def pairs(tmp_path: Path) -> Path:
    return write_orca_dpo(tmp_path / "data")


def test_filter_and_seeded_split(pairs: Path, tmp_path: Path) -> None:
    rows = orca_dpo._read_rows(str(pairs))
    keep, counts = orca_dpo.select_pairs(rows)
    assert keep.tolist() == KEPT
    assert counts == {"rows": 16, "ties": 2, "low_score": 2, "gsm8k": 1, "kept": 11}
    data = TASK.load(OPTS, str(pairs))
    train_ids, test_ids = data.meta["train_pair_id"], data.meta["test_pair_id"]
    assert (len(train_ids), len(test_ids)) == (8, 3)                       # floor(0.8 * 11), the rest
    assert sorted([*train_ids, *test_ids]) == KEPT and list(train_ids) == sorted(train_ids)
    again = TASK.load(OPTS, str(pairs))
    assert torch.equal(again.train.x, data.train.x) and np.array_equal(again.meta["test_pair_id"], test_ids)
    other = TASK.load({**OPTS, "data_seed": 1}, str(pairs))
    assert not np.array_equal(other.meta["train_pair_id"], train_ids)
    parquet = TASK.load(OPTS, str(write_orca_dpo(tmp_path / "pq", fmt="parquet")))
    assert torch.equal(parquet.train.x, data.train.x) and torch.equal(parquet.test.x, data.test.x)


def test_prompts_use_the_chat_template_and_completions_follow(pairs: Path) -> None:
    data = TASK.load(OPTS, str(pairs))
    tok = orca_dpo.load_tokenizer(OPTS)
    row = orca_rows()[int(data.meta["train_pair_id"][0])]
    messages = [{"role": "system", "content": row["system"]}, {"role": "user", "content": row["input"]}]
    expected_prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"]
    tokens, roles = data.train.x[0, 0, 0], data.train.x[0, 0, 1]
    assert tokens[roles == orca_dpo.PROMPT].tolist() == expected_prompt
    assert tok.decode(tokens[roles == orca_dpo.COMPLETION].tolist()) == row["chosen"] + "</s>"
    rejected = data.train.x[0, 1]
    assert tok.decode(rejected[0][rejected[1] == orca_dpo.COMPLETION].tolist()) == row["rejected"] + "</s>"
    assert torch.equal(rejected[0][rejected[1] == orca_dpo.PROMPT], tokens[roles == orca_dpo.PROMPT])


def test_dpo_loss_is_minus_log_sigmoid_of_the_beta_scaled_log_ratio_difference() -> None:
    beta = 0.1
    pi = torch.tensor([[-10.0, -12.0], [-3.0, -2.5], [-40.0, -41.0]])      # log pi(y+|x), log pi(y-|x)
    ref = torch.tensor([[-11.0, -11.0], [-3.0, -3.0], [-40.5, -40.0]])     # log ref(y+|x), log ref(y-|x)
    out, y = beta * (pi[:, 0] - pi[:, 1]), beta * (ref[:, 0] - ref[:, 1])
    got = per_sample_loss(TASK, out, y)
    for i in range(3):
        z = beta * ((pi[i, 0] - ref[i, 0]) - (pi[i, 1] - ref[i, 1])).item()
        assert got[i].item() == pytest.approx(-math.log(1 / (1 + math.exp(-z))), rel=1e-6)
    assert got[0].item() == pytest.approx(math.log(1 + math.exp(-0.2)), rel=1e-6)     # z = 0.1 * (1 - (-1))


def _naive_logps(lm, pair: torch.Tensor) -> list[float]:
    """log p of each answer's completion tokens, one unpadded sequence at a time."""
    out = []
    for side in range(2):
        tokens, roles = pair[side, 0], pair[side, 1]
        n = int((roles > 0).sum())
        tokens, roles = tokens[:n].long(), roles[:n]
        logp = torch.log_softmax(lm(input_ids=tokens[None]).logits[0].double(), -1)
        out.append(sum(logp[t - 1, tokens[t]].item() for t in range(1, n) if roles[t] == orca_dpo.COMPLETION))
    return out


def test_sequence_logps_and_reference_margins_match_a_per_sequence_computation(pairs: Path) -> None:
    torch.manual_seed(0)
    data = TASK.load(OPTS, str(pairs))
    model = TASK.build_model(OPTS, data).eval()
    # Give the adapter weights so that policy and reference differ.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    TASK.prepare(model, data, OPTS)
    with torch.no_grad():
        batched = model.sequence_logps(data.train.x[:4])
        for i in range(4):
            assert batched[i].tolist() == pytest.approx(_naive_logps(model.lm, data.train.x[i]), abs=2e-4)
        # The reference is the base model without the adapter: a fresh tiny Llama with the fixed base seed.
        base = orca_dpo._base_model(OPTS, torch.device("cpu")).eval()
        for i in range(4):
            c, r = _naive_logps(base, data.train.x[i])
            assert data.train.y[i].item() == pytest.approx(0.1 * (c - r), abs=2e-5)
        assert not torch.allclose(model(data.train.x[:4]), data.train.y[:4])


def test_every_pair_starts_at_log_2(pairs: Path) -> None:
    # LoRA's B starts at zero, so the policy is the reference and each margin difference is exactly 0.
    data = TASK.load(OPTS, str(pairs))
    model = TASK.build_model(OPTS, data)
    TASK.prepare(model, data, OPTS)
    with torch.no_grad():
        losses = per_sample_loss(TASK, model.eval()(data.train.x), data.train.y)
    np.testing.assert_allclose(losses.numpy(), math.log(2), rtol=1e-6)


def _one_sgd_step(pairs: Path, method: str, micro_batch: int = 0, **opts) -> dict[str, torch.Tensor]:
    """Adapter parameters after one plain-SGD step from the same initialization (same dropout draws)."""
    options = {**OPTS, **opts}
    eps, alpha, eta = 0.3, 2.0, 0.1
    data = TASK.load(options, str(pairs))
    torch.manual_seed(0)
    model = TASK.build_model(options, data)
    TASK.prepare(model, data, options)
    model.train()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in trainable.items()}
    optimizer = torch.optim.SGD(trainable.values(), lr=1.0)
    m = get_method(method)(len(data.train), eps=eps, alpha=alpha, dual_lr=eta)
    ids = torch.arange(len(data.train))
    torch.manual_seed(1)
    losses = train_step(TASK, model, m, optimizer, data.train.x, data.train.y, ids, micro_batch)
    # log 2 up to float noise: padding trimmed per (micro-)batch changes matmul shapes, hence rounding.
    np.testing.assert_allclose(losses.numpy(), math.log(2), rtol=1e-5)
    if m.multipliers is not None:    # dual step first: lambda = eta * (log 2 - eps), for every pair
        np.testing.assert_allclose(m.multipliers.numpy(), eta * (math.log(2) - eps), rtol=1e-5)
    return {n: trainable[n].detach() - before[n] for n in trainable}


def test_each_method_scales_the_erm_update_as_its_rule_says(pairs: Path) -> None:
    # At initialization every g_i = log 2 > eps, so with plain SGD each method's step is ERM's step times a
    # known factor: FL/RFL sum_i lambda_i grad g_i with lambda_i = eta (log 2 - eps) -> B eta (log 2 - eps);
    # CSERM alpha mean_i (g_i - eps) grad g_i -> alpha (log 2 - eps). A method that silently trained plain DPO
    # (the paper code's CSERM) would give factor 1.
    erm = _one_sgd_step(pairs, "erm")
    n, gap = 8, math.log(2) - 0.3
    factors = {"fl": n * 0.1 * gap, "rfl": n * 0.1 * gap, "cserm": 2.0 * gap}
    moved = [k for k, d in erm.items() if d.abs().max() > 0]
    assert moved and all("lora" in k for k in moved)      # only the adapter trains; the base stays frozen
    for method, factor in factors.items():
        assert abs(factor - 1) > 0.05
        delta = _one_sgd_step(pairs, method)
        for k in moved:
            torch.testing.assert_close(delta[k], factor * erm[k], rtol=2e-3, atol=1e-9)


@pytest.mark.parametrize("method", ["erm", "fl"])
def test_gradient_accumulation_gives_the_whole_batch_update(pairs: Path, method: str) -> None:
    whole = _one_sgd_step(pairs, method, lora_dropout=0.0)
    accumulated = _one_sgd_step(pairs, method, micro_batch=3, lora_dropout=0.0)    # chunks of 3, 3, 2
    for k, d in whole.items():
        torch.testing.assert_close(accumulated[k], d, rtol=1e-4, atol=1e-9)


def test_warmup_cosine_schedule_matches_transformers() -> None:
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    for scheduler, reference in (("cosine", get_cosine_schedule_with_warmup),
                                 ("constant", get_constant_schedule_with_warmup)):
        cfg = config("orca-dpo", "erm", epochs=4, batch_size=16, warmup_steps=5, scheduler=scheduler)
        ours_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=5e-6)
        theirs_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=5e-6)
        ours, per_step = build_scheduler(cfg, ours_opt, steps_per_epoch=6)
        kwargs = {"num_training_steps": 24} if scheduler == "cosine" else {}
        theirs = reference(theirs_opt, num_warmup_steps=5, **kwargs)
        assert per_step
        for _ in range(24):
            assert ours_opt.param_groups[0]["lr"] == pytest.approx(theirs_opt.param_groups[0]["lr"], abs=1e-15)
            ours.step()
            theirs.step()


def interrupted_and_resumed(cfg, tmp_path: Path, at_epoch: int):
    """Train ``cfg`` whole (in a/) and interrupted after ``at_epoch`` then resumed (in b/); returns (whole, resumed,
    the checkpoint the interruption left)."""
    class Stop(Exception):
        pass

    def stop(stats):
        if stats.epoch == at_epoch:
            raise Stop

    whole = train(cfg, tmp_path / "a" / "records", tmp_path / "a" / "run")
    with pytest.raises(Stop):
        train(cfg, tmp_path / "b" / "records", tmp_path / "b" / "run", on_epoch=stop, checkpoint_every=0.0)
    checkpoint = torch.load(tmp_path / "b" / "run" / "checkpoint.pt", weights_only=True)
    return whole, train(cfg, tmp_path / "b" / "records", tmp_path / "b" / "run"), checkpoint


def test_resume_equals_uninterrupted(pairs: Path, tmp_path: Path) -> None:
    cfg = config("orca-dpo", "rfl", epochs=4, eval_every=2, lr=1e-2, warmup_steps=3, batch_size=4, micro_batch=2,
                 data_dir=str(pairs), options={"model": "tiny"})
    whole, resumed, checkpoint = interrupted_and_resumed(cfg, tmp_path, at_epoch=3)
    assert all("lora" in k for k in checkpoint["model"])       # the frozen base is not checkpointed
    assert resumed.resumed_from == 3 and resumed.metrics == whole.metrics
    a = records.read(tmp_path / "a" / "records", [cfg.run_id])
    b = records.read(tmp_path / "b" / "records", [cfg.run_id])
    assert a.equals(b)


def test_flctl_run_rfl_writes_records_aligned_by_pair_id(pairs: Path, results: Path) -> None:
    # The command, then a run that moves the adapter enough for per-pair losses to differ.
    res = runner.invoke(app, ["run", "orca-dpo", "--method", "rfl", "--eps", "0.3", "--alpha", "1", "--model",
                              "tiny", "--data", str(pairs)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["run", "orca-dpo", "--method", "rfl", "--eps", "0.3", "--alpha", "1", "--model",
                              "tiny", "--data", str(pairs), "--lr", "3e-2", "--warmup-steps", "0", "--epochs", "6",
                              "--batch-size", "4", "-o", "lora_dropout=0"])
    assert res.exit_code == 0, res.output
    rows = json.loads(runner.invoke(app, ["runs", "--json"]).stdout)
    assert [r["status"] for r in rows] == ["completed", "completed"]
    row = min(rows, key=lambda r: r["config"]["epochs"])
    assert row["config"]["options"]["model"] == "tiny" and row["config"]["lr"] == 3e-2
    run_id, artifacts = row["id"], row["artifacts"]

    train_rec = records.read(results / "records", [run_id], split="train", epoch=6).sort_by("sample_id")
    extras = np.load(artifacts["extras"])
    pair_ids = [*extras["train_pair_id"], *extras["test_pair_id"]]
    assert sorted(pair_ids) == KEPT and len(extras["test_pair_id"]) == 3     # each kept pair in one split
    assert len(train_rec) == len(extras["train_pair_id"]) and train_rec["multiplier"].null_count == 0
    losses = train_rec["loss"].to_numpy()
    assert losses.std() > 1e-3                                  # trained: the pairs' losses differ
    report = runner.invoke(app, ["report", "--table", "llm", "--task", "orca-dpo", "--format", "csv",
                                 "--columns", "train.avg_loss,train.max_loss,test.avg_loss,test.max_loss"])
    assert report.exit_code == 0, report.output
    table_rows = list(csv.DictReader(io.StringIO(report.stdout)))
    assert [(r["Model"], r["Method"], r["ε"]) for r in table_rows] == [("tiny", "RFL", "0.30")] * 2
    assert any(float(r["train.max_loss"]) == pytest.approx(row["metrics"]["train.max_loss"]) and
               float(r["test.avg_loss"]) == pytest.approx(row["metrics"]["test.avg_loss"]) for r in table_rows)

    # Re-evaluate single pairs, looked up by pair id, with the saved adapter: same loss as the record.
    data = TASK.load({**OPTS, "lora_dropout": 0.0}, str(pairs))
    model = TASK.build_model({**OPTS, "lora_dropout": 0.0}, data)
    model.load_state_dict(torch.load(artifacts["model"]), strict=False)
    TASK.prepare(model, data, OPTS)
    rows_by_pair = {int(p): i for i, p in enumerate(data.meta["train_pair_id"])}
    with torch.no_grad():
        for pair_id, sample_id in zip(extras["train_pair_id"][::3], range(0, len(losses), 3)):
            i = rows_by_pair[int(pair_id)]
            g = per_sample_loss(TASK, model.eval()(data.train.x[i:i + 1]), data.train.y[i:i + 1]).item()
            assert g == pytest.approx(losses[sample_id], rel=1e-4)


@pytest.mark.parametrize("saved_dtype", [torch.float32, torch.bfloat16])
def test_a_local_model_folder_loads_through_auto_classes(pairs: Path, tmp_path: Path, saved_dtype) -> None:
    # Not 'tiny': a saved model + tokenizer folder goes through AutoTokenizer / AutoModelForCausalLM. Published
    # checkpoints are mostly bf16: on the CPU they must train in float32 all the same.
    tok = orca_dpo.load_tokenizer(OPTS)
    base = orca_dpo._base_model(OPTS, torch.device("cpu")).to(saved_dtype)
    folder = tmp_path / "my-model"
    base.save_pretrained(folder)
    tok.save_pretrained(folder)
    cfg = config("orca-dpo", "erm", epochs=1, data_dir=str(pairs), options={"model": str(folder)})
    TASK.check(cfg.opts, cfg.data_dir)
    result = train(cfg, tmp_path / "records", tmp_path / "run")
    assert result.status == "completed"
    assert result.metrics["train.avg_loss"] == pytest.approx(math.log(2), rel=1e-3)


def test_a_missing_llm_extra_is_one_line_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs the llm extra \(trl is missing\): pip install"):
        TASK.check(OPTS, None)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("make,args,needle", [
    (lambda d: _write_jsonl(d / "a.jsonl", [{k: v for k, v in r.items() if k != "chosen_score"}
                                            for r in orca_rows()]), [], "lacks column(s) chosen_score"),
    (lambda d: _write_jsonl(d / "b.jsonl", [{**r, "rejected": "  "} for r in orca_rows()]), [], "empty 'rejected'"),
    (lambda d: _write_jsonl(d / "c.jsonl", [{**r, "status": "tie"} for r in orca_rows()]), [], "keeps 0 of 16"),
    (lambda d: d / "missing.jsonl", [], "no such file"),
    (lambda d: write_orca_dpo(d), ["--model", "someone/not-a-cached-model"], "cannot load model"),
    (lambda d: write_orca_dpo(d), ["--p-min", "0.6"], "--p-min applies to classification"),
    (lambda d: write_orca_dpo(d), ["-o", "beta=0"], "beta must be > 0"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, results: Path, make, args, needle) -> None:
    data = make(tmp_path / "data")
    model = [] if "--model" in args else ["--model", "tiny"]
    res = runner.invoke(app, ["run", "orca-dpo", "--method", "rfl", *model, "--data", str(data), *args])
    assert res.exit_code == 2, res.output
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert files_under(results) == []


def test_no_data_and_no_hub_names_the_data_flag(results: Path) -> None:
    res = runner.invoke(app, ["run", "orca-dpo", "--model", "tiny"])
    assert res.exit_code == 2 and "pass --data FILE" in res.stderr
    assert files_under(results) == []


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError):
        orca_dpo.select_pairs(orca_dpo._read_rows(str(empty)))


# A 4-bit base needs bitsandbytes (pyproject's llm extra, on Linux); a machine's own torch image may lack it, as the
# H200's did (2026-11-26): skipped there, saying so, rather than failing in transformers' quantizer.
needs_bitsandbytes = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                                        reason="needs bitsandbytes for 4-bit NF4 bases (pip install -e '.[llm]')")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with CUDA_VISIBLE_DEVICES set)")
def test_cuda_bf16_path(pairs: Path, tmp_path: Path) -> None:
    # The tiny model on CUDA (bf16 autocast).
    cfg = config("orca-dpo", "rfl", epochs=2, data_dir=str(pairs), options={"model": "tiny"})
    cfg = dataclasses.replace(cfg, device="cuda")
    assert train(cfg, tmp_path / "r1", tmp_path / "run1").status == "completed"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with CUDA_VISIBLE_DEVICES set)")
@needs_bitsandbytes
def test_cuda_4bit_path(pairs: Path, tmp_path: Path) -> None:
    # A saved model folder, loaded in 4-bit NF4 by bitsandbytes.
    tok = orca_dpo.load_tokenizer(OPTS)
    folder = tmp_path / "m"
    orca_dpo._base_model(OPTS, torch.device("cpu")).save_pretrained(folder)
    tok.save_pretrained(folder)
    cfg4 = config("orca-dpo", "rfl", epochs=2, data_dir=str(pairs), options={"model": str(folder)})
    cfg4 = dataclasses.replace(cfg4, device="cuda")
    result = train(cfg4, tmp_path / "r2", tmp_path / "run2")
    assert result.status == "completed" and math.isfinite(result.metrics["train.avg_loss"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with CUDA_VISIBLE_DEVICES set)")
@needs_bitsandbytes
def test_cuda_4bit_adapter_only_checkpoint_resumes(pairs: Path, tmp_path: Path) -> None:
    # A saved model folder in 4-bit NF4: the checkpoint holds the LoRA adapter alone (no quantized base state),
    # and a run interrupted after epoch 2 and resumed ends where an uninterrupted one does. CUDA kernels are not
    # bitwise reproducible across runs, hence the tolerance.
    folder = tmp_path / "m"
    orca_dpo._base_model(OPTS, torch.device("cpu")).save_pretrained(folder)
    orca_dpo.load_tokenizer(OPTS).save_pretrained(folder)
    cfg = config("orca-dpo", "rfl", epochs=4, eval_every=2, lr=1e-3, warmup_steps=0, batch_size=4, micro_batch=2,
                 data_dir=str(pairs), options={"model": str(folder)})
    cfg = dataclasses.replace(cfg, device="cuda")
    _, resumed, checkpoint = interrupted_and_resumed(cfg, tmp_path, at_epoch=2)
    assert checkpoint["model"] and all("lora" in k for k in checkpoint["model"])
    assert resumed.resumed_from == 2 and resumed.status == "completed"
    order = [("epoch", "ascending"), ("split", "ascending"), ("sample_id", "ascending")]
    a = records.read(tmp_path / "a" / "records", [cfg.run_id]).sort_by(order)
    b = records.read(tmp_path / "b" / "records", [cfg.run_id]).sort_by(order)
    assert a.num_rows == b.num_rows > 0 and a.column("sample_id").equals(b.column("sample_id"))
    np.testing.assert_allclose(b.column("loss").to_numpy(), a.column("loss").to_numpy(), rtol=1e-3, atol=1e-4)
