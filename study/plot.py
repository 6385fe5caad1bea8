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
        layers = run.layer_keys("max_logit")
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


HEAD_KEY = re.compile(r"max_logit/layer_(\d+)/head_(\d+)$")
SNAPSHOTS = 4


def head_logits(run: Run, step: int) -> list[list[float]]:
    """The (layer x head) max attention logits logged at ``step`` (NaN where one is missing)."""
    record = next(r for r in run.records if r.get("step") == step and any(HEAD_KEY.match(k) for k in r))
    cells = {tuple(map(int, m.groups())): record[k] for k in record if (m := HEAD_KEY.match(k))}
    layers, heads = (1 + max(cell[i] for cell in cells) for i in (0, 1))
    return [[cells.get((layer, head), math.nan) for head in range(heads)] for layer in range(layers)]


def plot_head_logits(runs: list[Run], path: Path) -> bool:
    """Layer x head heatmaps of the max attention logit at SNAPSHOTS steps, for the best-lr runs with
    the largest final logits: which heads run away, and when."""
    panels = [seeds[0] for seeds in best_lr(runs).values() if seeds[0].keys("max_logit/layer_00/head_")]
    if not panels:
        return False
    peak = lambda run: max((run.final(k) or 0.0) for k in run.layer_keys("max_logit"))  # noqa: E731
    panels = sorted(panels, key=peak, reverse=True)[:MAX_PANELS // 2]
    grids = []
    for run in panels:
        steps = sorted({r["step"] for r in run.records if "step" in r and any(HEAD_KEY.match(k) for k in r)})
        picked = sorted({steps[round(i * (len(steps) - 1) / max(SNAPSHOTS - 1, 1))] for i in range(SNAPSHOTS)})
        grids.append([(step, head_logits(run, step)) for step in picked])
    top = max(v for row in grids for _, grid in row for line in grid for v in line if math.isfinite(v))
    fig, axes = plt.subplots(len(panels), SNAPSHOTS, figsize=(2.6 * SNAPSHOTS + 1, 2.4 * len(panels)), squeeze=False,
                             layout="constrained")
    for r, (run, row, ax_row) in enumerate(zip(panels, grids, axes)):
        for c, (ax, (step, grid)) in enumerate(zip(ax_row, row)):
            image = ax.imshow(grid, aspect="auto", cmap="magma", vmin=0, vmax=top)
            ax.set_title(f"{run.label}, batch {run.batch_size}, step {step}", fontsize=7)
            ax.set_xticks(range(len(grid[0])))
            ax.set_yticks(range(len(grid)))
            ax.tick_params(labelsize=6)
            if c == 0:
                ax.set_ylabel("layer")
            if r == len(panels) - 1:
                ax.set_xlabel("head")
        for ax in ax_row[len(row):]:
            ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.8, label="max attention logit")
    fig.suptitle("Max attention logit per layer and head over training")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_attention_entropy(runs: list[Run], path: Path) -> bool:
    """Per layer, the lowest head entropy over steps: entropy collapse shows before instability."""
    panels = [seeds[0] for seeds in best_lr(runs).values() if seeds[0].layer_keys("attn_entropy")][:MAX_PANELS]
    if not panels:
        return False
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.4 * rows), squeeze=False, sharey=True)
    for ax, run in zip(axes.flat, panels):
        layers = run.layer_keys("attn_entropy")
        cmap = plt.get_cmap("viridis", max(len(layers), 2))
        for i, key in enumerate(layers):
            ax.plot(*run.series(key), color=cmap(i), linewidth=1, label=key.removeprefix("attn_entropy/"))
        ax.set(title=f"{run.label}, batch {run.batch_size}, lr {run.lr:g}", xlabel="step",
               ylabel="min attention entropy over heads (nats)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper right", fontsize=6, ncol=max(1, len(names) // 12))
    fig.suptitle("Attention entropy per layer (the lowest head)")
    _save(fig, path)
    return True


def plot_noise_scale(runs: list[Run], path: Path) -> bool:
    """The live gradient noise scale B_simple over steps against each run's batch (in tokens): a
    batch far above B_simple buys little per token."""
    lines = [seeds[0] for seeds in best_lr(runs).values() if seeds[0].series("noise_scale/b_simple")[0]]
    if not lines:
        return False
    colour = colours(f"{r.label}, batch {r.batch_size}" for r in lines)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in lines:
        name = f"{run.label}, batch {run.batch_size}"
        ax.plot(*run.series("noise_scale/b_simple"), color=colour[name], label=name)
        ax.axhline(run.final("noise_scale/batch_tokens"), color=colour[name], linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="tokens", title="Gradient noise scale B_simple (solid) and the batch (dashed)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)
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
    for name, draw in (("merit_diagnostics", plot_merit_diagnostics), ("max_logit_heads", plot_head_logits),
                       ("attn_entropy", plot_attention_entropy), ("noise_scale", plot_noise_scale)):
        if draw(runs, out / f"{name}.png"):  # each only where the runs logged its keys
            written.append(out / f"{name}.png")
    return written
