"""The study's figures (PNG) from runs (study/runs.py); scripts/plot.py is the CLI and its
docstring lists the figures.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from study.runs import Run, best_lr, mean_std  # noqa: E402

LAYER = re.compile(r"transformer\.h\.(\d+)\.")
MAX_PANELS = 12


def colours(labels) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {label: cycle[i % len(cycle)] for i, label in enumerate(sorted(set(labels)))}


def plot_val_loss(runs: list[Run], path: Path) -> None:
    runs = [run for seeds in best_lr(runs).values() for run in seeds]  # each point at its best lr
    colour = colours(r.label for r in runs)
    batches = sorted({r.batch_size for r in runs})
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 1))]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        steps, losses = run.series("val/loss")
        tokens = [s * run.tokens_per_step() for s in steps]
        ax.plot(tokens, losses, color=colour[run.label], linestyle=styles[batches.index(run.batch_size) % len(styles)],
                label=f"{run.label}, batch {run.batch_size}, lr {run.lr:g}, seed {run.seed}")
    ax.set(xlabel="training tokens", ylabel="validation loss", title="Validation loss (best lr per point)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    _save(fig, path)


def plot_max_logits(runs: list[Run], path: Path) -> None:
    panels = [seeds[0] for seeds in best_lr(runs).values()][:MAX_PANELS]  # as the report's table
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.4 * rows), squeeze=False, sharey=True)
    for ax, run in zip(axes.flat, panels):
        layers = run.keys("max_logit/layer_")
        cmap = plt.get_cmap("viridis", max(len(layers), 2))
        for i, key in enumerate(layers):
            steps, values = run.series(key)
            ax.plot(steps, values, color=cmap(i), linewidth=1, label=key.removeprefix("max_logit/"))
        ax.set_yscale("log")
        ax.set(title=f"{run.label}, batch {run.batch_size}, lr {run.lr:g}", xlabel="step", ylabel="max attention logit")
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper right", fontsize=6, ncol=max(1, len(names) // 12))
    fig.suptitle("Per-layer max attention logit (log scale)")
    _save(fig, path)


def plot_scaling(runs: list[Run], path: Path) -> None:
    best = best_lr(runs)
    colour = colours(label for label, _ in best)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for label in colour:
        points = sorted((batch, *mean_std([r.final("val/loss") for r in seeds]))
                        for (name, batch), seeds in best.items() if name == label)
        batches, means, stds = zip(*points)
        ax.errorbar(batches, means, yerr=stds, color=colour[label], marker="o", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="global batch (sequences)", ylabel="final validation loss",
           title="Final validation loss vs batch size (best lr per point; bars: std over seeds)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    _save(fig, path)


def per_layer(run: Run, stat: str) -> dict[int, tuple[list[int], list[float]]]:
    """``stat`` (a per-parameter diagnostic) averaged over each transformer layer's tensors."""
    layers: dict[int, dict[int, list[float]]] = {}
    for key in run.keys(f"{stat}/"):
        match = LAYER.search(key)
        if match:
            for step, value in zip(*run.series(key)):
                layers.setdefault(int(match.group(1)), {}).setdefault(step, []).append(value)
    return {layer: (sorted(by_step), [sum(v) / len(v) for _, v in sorted(by_step.items())])
            for layer, by_step in sorted(layers.items())}


def plot_merit_diagnostics(runs: list[Run], path: Path) -> bool:
    merit = [r for r in runs if r.config["optimizer"] == "merit" and r.keys("clip_fraction/")]
    if not merit:
        return False
    run = max(merit, key=lambda r: r.batch_size)
    fig, (clip_ax, spread_ax) = plt.subplots(1, 2, figsize=(11, 4))
    clip = per_layer(run, "clip_fraction")
    cmap = plt.get_cmap("viridis", max(len(clip), 2))
    for layer, (steps, values) in clip.items():
        clip_ax.plot(steps, values, color=cmap(layer), label=f"layer {layer}")
    low, high = per_layer(run, "trust_ratio_min"), per_layer(run, "trust_ratio_max")
    for layer in sorted(low.keys() & high.keys()):
        steps, lows = low[layer]
        spread = [h / lo if lo > 0 else math.nan for lo, h in zip(lows, high[layer][1])]
        spread_ax.plot(steps, spread, color=cmap(layer), label=f"layer {layer}")
    clip_ax.set(xlabel="step", ylabel="fraction of elements clipped", title="MERIT element-wise clip fraction")
    spread_ax.set(xlabel="step", ylabel="max / min trust ratio", title="MERIT trust-ratio spread")
    spread_ax.set_yscale("log")
    for ax in (clip_ax, spread_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"{run.name}: {run.label}, batch {run.batch_size}, lr {run.lr:g}")
    _save(fig, path)
    return True


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_all(runs: list[Run], out: Path) -> list[Path]:
    """Every figure of ``runs`` into the folder ``out``; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (("val_loss", plot_val_loss), ("max_logit", plot_max_logits), ("scaling", plot_scaling)):
        draw(runs, out / f"{name}.png")
        written.append(out / f"{name}.png")
    if plot_merit_diagnostics(runs, out / "merit_diagnostics.png"):
        written.append(out / "merit_diagnostics.png")
    return written
