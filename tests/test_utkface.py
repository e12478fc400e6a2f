"""UTKFace on data written in its real on-disk format (a folder of AGE_GENDER_RACE_DATETIME.jpg files)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from flctl.cli import app
from flctl.errors import ConfigError
from flctl.tasks import get_task
from tests import warm
from tests.data_writers import write_utkface
from tests.helpers import files_under

runner = CliRunner()
OPTS = {"width": 8, "size": 32, "data_seed": 0, "split": "70-30"}


@pytest.fixture
def faces(tmp_path: Path) -> Path:
    return write_utkface(tmp_path / "data", n=40)


def test_loader_skips_malformed_names_and_documents_the_split_sizes(faces: Path) -> None:
    data = get_task("utkface").load(OPTS, str(faces))
    assert data.meta["skipped"] == 2 and data.meta["n_images"] == 40
    # floor(7*40/10) = 28 training-part images, ceil(28/4) = 7 kept, 40 - 28 = 12 test
    assert (len(data.train), len(data.test)) == (7, 12)
    assert data.train.x.shape == (7, 3, 32, 32) and data.train.x.dtype == torch.uint8
    assert data.train.y.dtype == torch.float32
    names = data.meta["train_names"] + data.meta["test_names"]
    assert len(set(names)) == 19 and all(n[0].isdigit() for n in names)
    assert data.meta["train_names"] == sorted(data.meta["train_names"])        # ids follow file order
    from flctl_tasks.utkface import split_sizes

    assert split_sizes(23708, 2167, "70-30") == (23708, 16595, 4149, 7113)
    # the authors' procedure on the real release's counts gives the paper's 4,438 training samples
    assert split_sizes(23708, 2167) == (22191, 17752, 4438, 4439)


def test_paper_code_split_keeps_30_percent_of_the_youngest(tmp_path: Path) -> None:
    # A histogram we choose: 20 faces aged 1-4, 30 older. floor(3 * 20 / 10) = 6 young kept: N' = 36;
    # floor(8 * 36 / 10) = 28 training-part images, ceil(28 / 4) = 7 kept, 36 - 28 = 8 test.
    ages = [1, 2, 3, 4] * 5 + list(range(5, 95, 3))
    folder = write_utkface(tmp_path / "faces", ages=ages)
    data = get_task("utkface").load({**OPTS, "split": "paper-code"}, str(folder))
    assert data.meta["n_used"] == 36 and (len(data.train), len(data.test)) == (7, 8)
    used = data.meta["train_names"] + data.meta["test_names"]
    assert sum(int(n.split("_")[0]) <= 4 for n in used) <= 6
    again = get_task("utkface").load({**OPTS, "split": "paper-code"}, str(folder))
    assert again.meta["train_names"] == data.meta["train_names"]               # seeded
    other = get_task("utkface").load({**OPTS, "split": "paper-code", "data_seed": 1}, str(folder))
    assert other.meta["train_names"] != data.meta["train_names"]


def test_split_is_seeded_and_ages_are_z_scored_with_training_statistics(faces: Path) -> None:
    task = get_task("utkface")
    a, b = task.load(OPTS, str(faces)), task.load(OPTS, str(faces))
    c = task.load({**OPTS, "data_seed": 1}, str(faces))
    assert a.meta["train_names"] == b.meta["train_names"] and a.meta["test_names"] == b.meta["test_names"]
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    assert a.meta["train_names"] != c.meta["train_names"]
    assert abs(a.train.y.mean().item()) < 1e-5 and a.train.y.std(unbiased=False).item() == pytest.approx(1, abs=1e-5)
    # targets decode back to the ages in the file names
    ages = torch.tensor([float(n.split("_")[0]) for n in a.meta["test_names"]])
    torch.testing.assert_close(a.test.y * a.meta["target_std"] + a.meta["target_mean"], ages)


def test_cache_is_reused_without_decoding(faces: Path, monkeypatch) -> None:
    import PIL.Image

    first = get_task("utkface").load(OPTS, str(faces))
    assert Path(first.meta["cache"]).parent == faces

    def boom(*args, **kwargs):
        raise AssertionError("decoded again")

    monkeypatch.setattr(PIL.Image, "open", boom)
    second = get_task("utkface").load(OPTS, str(faces))
    assert torch.equal(first.train.x, second.train.x) and torch.equal(first.test.x, second.test.x)
    with pytest.raises(ConfigError, match="is not a readable image"):     # another size is another cache
        get_task("utkface").load({**OPTS, "size": 16}, str(faces))


CHILD = """
import hashlib, sys
from flctl.tasks import get_task
d = get_task("utkface").load({"width": 8, "size": 32, "data_seed": 0, "split": "70-30"}, sys.argv[1])
h = hashlib.sha256(d.train.x.numpy().tobytes() + d.test.x.numpy().tobytes() + d.train.y.numpy().tobytes())
print(h.hexdigest(), "|".join(d.meta["train_names"]))
"""


def test_concurrent_cache_creation_is_safe(faces: Path) -> None:
    root = Path(__file__).parents[1]
    procs = [warm.Popen([sys.executable, "-c", CHILD, str(faces)], cwd=root, stdout=warm.PIPE, stderr=warm.PIPE)
             for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert len({o for o, _ in outs}) == 1
    assert not [p for p in faces.iterdir() if p.name.endswith(".tmp")]
    assert len(list(faces.glob(".flctl-utkface-*.npz"))) == 1
    here = get_task("utkface").load(OPTS, str(faces))
    assert "|".join(here.meta["train_names"]) == outs[0][0].split()[1]


def test_corrupt_image_is_a_clear_error(faces: Path) -> None:
    victim = sorted(faces.glob("*_*_*_*.jpg"))[3]
    victim.write_bytes(b"not a jpeg")
    with pytest.raises(ConfigError, match=f"{victim.name} is not a readable image"):
        get_task("utkface").load(OPTS, str(faces))


def test_a_folder_of_garbage_jpegs_is_rejected_before_anything_is_written(tmp_path: Path, results: Path) -> None:
    folder = tmp_path / "garbage"
    folder.mkdir()
    for i in range(6):
        (folder / f"{20 + i}_0_1_2017010402{i:07d}.jpg").write_bytes(b"not a jpeg")
    res = runner.invoke(app, ["run", "utkface", "--data-dir", str(folder), "-o", "width=8", "--epochs", "1"])
    assert res.exit_code == 2 and "is not a readable image" in res.stderr, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and files_under(results) == []


def test_model_has_one_output_and_an_imagenet_stem(faces: Path) -> None:
    task = get_task("utkface")
    data = task.load(OPTS, str(faces))
    model = task.build_model(OPTS, data)
    resnet = model[1]
    assert resnet.fc.out_features == 1 and resnet.conv1.kernel_size == (7, 7) and resnet.conv1.stride == (2, 2)
    assert model(data.train.x[:2]).shape == (2, 1)
    x = data.train.x
    out = task.augment.apply(x, task.augment.draw(len(x), torch.Generator().manual_seed(0), x.device))
    assert all(torch.equal(out[i], x[i]) or torch.equal(out[i], x[i].flip(2)) for i in range(len(x)))


def test_flctl_run_utkface_rfl(faces: Path, results: Path) -> None:
    res = runner.invoke(app, ["run", "utkface", "--method", "rfl", "--eps", "0", "--alpha", "1e-3",
                              "--data-dir", str(faces), "-o", "width=8", "-o", "size=32", "--epochs", "2",
                              "--batch-size", "8"])
    assert res.exit_code == 0, res.output
    [row] = json.loads(runner.invoke(app, ["runs", "--json"]).stdout)
    assert row["status"] == "completed" and row["config"]["options"] == {"width": 8, "size": 32, "data_seed": 0, "split": "paper-code"}


@pytest.mark.parametrize("args,needle", [
    (lambda d: ["--data-dir", str(d / "nowhere")], "no UTKFace folder"),
    (lambda d: ["--data-dir", str(d.parent)], "has no valid images"),
    (lambda d: [], "pass --data-dir"),
])
def test_missing_data_is_rejected_before_anything_is_written(faces: Path, results: Path, args, needle) -> None:
    res = runner.invoke(app, ["run", "utkface", *args(faces), "--epochs", "1"])
    assert res.exit_code == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert files_under(results) == []


def test_p_min_is_rejected_for_regression(faces: Path, results: Path) -> None:
    res = runner.invoke(app, ["run", "utkface", "--method", "fl", "--p-min", "0.6", "--data-dir", str(faces)])
    assert res.exit_code == 2
    assert files_under(results) == []


def test_top_multipliers_shows_the_faces_by_file_name(tmp_path: Path, results: Path) -> None:
    from flctl.db import Store
    from flctl.report.data import select_runs
    from flctl.report.plots import _extras_images, plot

    data = write_utkface(tmp_path / "faces", n=40)
    res = CliRunner().invoke(app, ["run", "utkface", "-m", "rfl", "--eps", "0", "--alpha", "1e-3", "--data-dir",
                                   str(data), "-o", "width=8", "-o", "size=32", "--epochs", "1", "--batch-size", "4"])
    assert res.exit_code == 0, res.output
    runs = select_runs(Store.open(f"sqlite:///{results / 'flctl.db'}"), task="utkface")
    top = {"sample_id": np.array([0, 3]), "target": np.zeros(2), "prediction": np.zeros(2)}
    faces = _extras_images(runs[0], top)
    assert faces.shape == (2, 64, 64, 3) and faces.dtype == np.uint8
    paths = plot("top-multipliers", runs, results / "records", tmp_path / "top", k=4)
    assert all(p.stat().st_size > 0 for p in paths)


def test_group_labels_come_from_the_file_names(tmp_path: Path) -> None:
    folder = write_utkface(tmp_path / "faces", n=12)
    data = get_task("utkface").load(OPTS, str(folder))
    names = data.meta["train_names"] + data.meta["test_names"]
    gender = np.concatenate([data.meta["groups"]["gender"][s] for s in ("train", "test")])
    race = np.concatenate([data.meta["groups"]["race"][s] for s in ("train", "test")])
    for name, g, r in zip(names, gender, race):
        fields = name.split("_")
        assert g == ("male", "female")[int(fields[1])]
        assert r == ("unknown" if len(fields) < 4 else ("White", "Black", "Asian", "Indian", "Others")[int(fields[2])])
    from flctl_tasks.utkface import _group_labels

    odd = _group_labels(["39_1_20170116174525125.jpg.chip.jpg", "20_7_9_20170109142408075.jpg"])
    assert odd["gender"].tolist() == ["female", "unknown"] and odd["race"].tolist() == ["unknown", "unknown"]


def test_groups_table_by_race_and_worst_group_summary(tmp_path: Path, results: Path) -> None:
    from flctl.metrics import worst_group_mean
    from flctl.report.data import final_records

    folder = write_utkface(tmp_path / "faces", n=60)
    res = runner.invoke(app, ["sweep", "utkface", "-m", "erm,fl", "--eps", "0.5", "--seeds", "2", "--epochs", "1",
                              "--batch-size", "16", "--data-dir", str(folder), "-o", "width=8", "-o", "size=32",
                              "-o", "split=70-30", "--executor", "debug"])
    assert res.exit_code == 0, res.output
    runs = json.loads(runner.invoke(app, ["runs", "--json"]).stdout)
    out = runner.invoke(app, ["report", "--table", "groups", "--by", "race", "--format", "csv",
                              "--columns", "test.avg_loss,test.max_loss"])
    assert out.exit_code == 0, out.output
    rows = [line.split(",") for line in out.stdout.strip().splitlines()]
    header, body = rows[0], rows[1:]
    assert header[:2] == ["Group", "Method"] and "test.avg_loss" in header
    col = header.index("test.avg_loss")

    # By hand: each run's test losses of a race, averaged over the two seeds; the worst group per run, averaged.
    per_run: dict[str, dict[str, float]] = {}
    for r in runs:
        rec = final_records(results / "records", [r["id"]], ["sample_id", "loss"], split="test")
        with np.load(r["artifacts"]["extras"]) as extras:
            race = extras["test_group_race"][rec["sample_id"].to_numpy()]
        loss = rec["loss"].to_numpy()
        per_run[r["id"]] = {g: float(loss[race == g].mean()) for g in np.unique(race)}
        with np.load(r["artifacts"]["extras"]) as extras:
            labels = [extras[f"test_group_{a}"][rec["sample_id"].to_numpy()] for a in ("gender", "race")]
        assert r["metrics"]["test.worst_group_avg_loss"] == pytest.approx(worst_group_mean(loss, labels))
    for method, label in (("erm", "ERM"), ("fl", "FL")):
        mine = [per_run[r["id"]] for r in runs if r["method"] == method]
        for group in sorted({g for d in mine for g in d}):
            [row] = [b for b in body if b[0] == group and b[1] == label]
            assert float(row[col]) == pytest.approx(np.mean([d[group] for d in mine if group in d]))
        [worst] = [b for b in body if b[0] == "worst group" and b[1] == label]
        assert float(worst[col]) == pytest.approx(np.mean([max(d.values()) for d in mine]))
