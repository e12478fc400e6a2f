"""The samples with the largest final multipliers, as images or a table (paper Fig. 4)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.method_info import method_info
from flctl.report.data import final_records
from flctl.report.plots.common import _figure, group_runs, load_extras, wrap
from flctl.status import Status

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from flctl.db import RunRecord


def _top_multipliers(runs: list[RunRecord], records_root: Path, k: int) -> Figure:
    run = next((r for r in runs if method_info(r.method).has_multipliers and r.status == Status.COMPLETED), None)
    if run is None:
        raise ConfigError("the top-multipliers plot needs a completed fl or rfl run; select one with --task or "
                          "--sweep (e.g. `flctl run digits -m fl`)")
    table = final_records(records_root, [run], ["sample_id", "loss", "multiplier", "prediction", "target"],
                          split="train")
    lam = table["multiplier"].to_numpy(zero_copy_only=False).astype(np.float64)
    if np.isnan(lam).all():
        raise ConfigError(f"run {run.id} recorded no multipliers")
    order = np.argsort(-np.nan_to_num(lam, nan=-np.inf), kind="stable")[:k]
    top = {c: table[c].to_numpy(zero_copy_only=False)[order] for c in table.column_names}
    label = group_runs([run])[0].label
    title = f"{run.task}: top-{len(order)} final multipliers, {label} (run {run.id[:8]}, train split)"
    images = _extras_images(run, top)
    if images is None:
        return _top_table(top, title + "\n(the run's extras hold no training images: a table instead)")
    return _top_images(top, images, title)


# The extras keys a task writes so that this figure can show its samples (docs/design.md): the images themselves,
# indexed by sample id, or their file names by sample id and the folder that holds them.
IMAGES_KEY = "train_images"
FILE_KEYS = ("train_names", "folder")


def _extras_images(run: RunRecord, top: dict[str, np.ndarray]) -> np.ndarray | None:
    """The top samples' images from the run's extras; None when the task saved none."""
    ids = top["sample_id"].astype(int)
    extras = load_extras(run, (IMAGES_KEY,))
    if extras is not None:
        images = extras[IMAGES_KEY]
        if ids.max() >= len(images):
            raise ConfigError(f"run {run.id}: its extras hold {len(images)} training images but its records "
                              f"name sample {ids.max()}")
        return images[ids]
    files = load_extras(run, FILE_KEYS)
    if files is None:
        return None
    from PIL import Image

    folder = Path(str(files["folder"]))
    try:
        return np.stack([np.asarray(Image.open(folder / str(n)).convert("RGB").resize((64, 64)))
                         for n in files["train_names"][ids]])
    except OSError as exc:
        raise ConfigError(f"cannot read the images of run {run.id} from {folder}: {exc}") from None


def _value(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.2g}"


def _top_images(top: dict[str, np.ndarray], images: np.ndarray, title: str) -> Figure:
    n = len(images)
    cols = min(n, max(4, math.ceil(math.sqrt(n))))
    rows = math.ceil(n / cols)
    fig = _figure(1.75 * cols, 1.95 * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for i, ax in enumerate(axes):
        ax.axis("off")
        if i >= n:
            continue
        ax.imshow(images[i], cmap="gray_r", interpolation="nearest")
        wrong = int(top["prediction"][i]) != int(top["target"][i]) and float(top["target"][i]).is_integer()
        ax.set_title(f"#{int(top['sample_id'][i])}  y={_value(top['target'][i])}  ŷ={_value(top['prediction'][i])}\n"
                     f"loss={top['loss'][i]:.2g}  λ={top['multiplier'][i]:.2g}", fontsize=7,
                     color="tab:red" if wrong else "black")
    labels = all(float(t).is_integer() for t in top["target"])        # class labels, not regression targets
    fig.suptitle(wrap(title + ("\n(red title: misclassified)" if labels else ""), fig.get_figwidth() - 0.2, 9),
                 fontsize=9)
    return fig


def _top_table(top: dict[str, np.ndarray], title: str) -> Figure:
    n = len(top["sample_id"])
    title = wrap(title, 6.2, 9)
    fig = _figure(6.4, 0.45 + 0.17 * (title.count("\n") + 1) + 0.22 * (n + 1))
    ax = fig.subplots()
    ax.axis("off")
    header = ["rank", "sample id", "target", "prediction", "loss", "multiplier λ"]
    body = [[str(i + 1), str(int(top["sample_id"][i]))] + [f"{top[c][i]:.4g}" for c in
                                                            ("target", "prediction", "loss", "multiplier")]
            for i in range(n)]
    from matplotlib.transforms import Bbox

    table = ax.table(cellText=body, colLabels=header, bbox=Bbox.from_bounds(0, 0, 1, 1), cellLoc="right",
                     colLoc="right")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    for (row, _), cell in table.get_celld().items():
        cell.set_edgecolor("0.85")
        if row == 0:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("0.93")
    # A figure title, wrapped to the figure's width: an axes title over the table ran past both edges.
    fig.suptitle(title, fontsize=9)
    return fig
