"""The study's figures (PNG) from runs grouped into points (study/runs.py); scripts/plot.py is the
CLI and its docstring lists the figures. Every figure shows each point at its selected lr, its
seeds as a band around their mean (never as lines on top of each other), and names the points
and runs it shows; a log axis of logits is symmetric-log, so a logit <= 0 is drawn where it is.
"""
from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from study.runs import Run, Study, summary  # noqa: E402

LAYER = re.compile(r"transformer\.h\.(\d+)\.")
MAX_PANELS = 24
SYMLOG = dict(base=10, linthresh=1.0)  # linear within [-1, 1], logarithmic beyond


def colours(labels) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {label: cycle[i % len(cycle)] for i, label in enumerate(sorted(set(labels)))}


def seed_band(runs: list[Run], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps every seed logged ``key`` at, the mean, the lowest and the highest seed there)."""
    series = [dict(zip(*run.series(key))) for run in runs]
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    values = [[s[step] for s in series] for step in steps]
    return steps, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def _legend(ax, **kwargs) -> None:
    ax.legend(fontsize=7, frameon=False, **kwargs)


def _batch_panels(best: dict):
    """(figure, {batch: its axes}, {label: colour}): a panel per batch, a colour per point label
    (the same in every figure); ``_save_with_legend_below`` puts the legend under them."""
    batches = sorted({batch for _, batch in best})
    columns = min(4, len(batches))
    rows = math.ceil(len(batches) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.4 * columns, 3.6 * rows + 0.9), squeeze=False)
    for ax in list(axes.flat)[len(batches):]:
        ax.axis("off")
    return fig, dict(zip(batches, axes.flat)), colours(label for label, _ in best)


def _save_with_legend_below(fig, colour: dict, path: Path) -> None:
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    handles = [matplotlib.lines.Line2D([], [], color=c, label=label) for label, c in colour.items()]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_val_loss(study: Study, path: Path) -> None:
    best = study.best()
    fig, panels, colour = _batch_panels(best)
    for (label, batch), selection in best.items():
        ax = panels[batch]
        steps, mean, low, high = seed_band(selection.runs, study.select_on)
        tokens = [s * selection.runs[0].tokens_per_step() for s in steps]
        ax.plot(tokens, mean, color=colour[label], linewidth=1.2)
        ax.fill_between(tokens, low, high, color=colour[label], alpha=0.15, linewidth=0)
    for batch, ax in panels.items():
        lrs = ", ".join(f"{label} {s.lr:g}" for (label, b), s in best.items() if b == batch)
        ax.set(xlabel="training tokens", ylabel=study.select_on,
               title=f"batch {batch}\n" + textwrap.fill(f"lr: {lrs}", 60))
        ax.title.set_fontsize(7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{study.select_on} over training, each point at its best lr (band: lowest to highest seed)")
    _save_with_legend_below(fig, colour, path)


def plot_max_logits(study: Study, path: Path) -> None:
    panels = list(study.best().items())[:MAX_PANELS]
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.5 * rows), squeeze=False, sharey=True)
    for ax, ((label, batch), selection) in zip(axes.flat, panels):
        layers = selection.runs[0].layer_keys("max_logit")
        cmap = plt.get_cmap("viridis", max(len(layers), 2))
        for i, key in enumerate(layers):
            steps, mean, low, high = seed_band(selection.runs, key)
            ax.plot(steps, mean, color=cmap(i), linewidth=1, label=key.removeprefix("max_logit/"))
            ax.fill_between(steps, low, high, color=cmap(i), alpha=0.15, linewidth=0)
        ax.set_yscale("symlog", **SYMLOG)
        ax.set(title=f"{label}, batch {batch}, lr {selection.lr:g}", xlabel="step", ylabel="max attention logit")
        ax.title.set_fontsize(8)
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper right", fontsize=7, ncol=max(1, len(names) // 12), frameon=False)
    fig.suptitle("Max attention logit per layer (symmetric log scale; band: lowest to highest seed)")
    _save(fig, path)


def _by_batch(study: Study, value) -> dict[str, list[tuple[int, list[float], bool]]]:
    """Per row label: (batch, value(run) of each seed at the selected lr, whether that lr is on the
    grid's edge), batches ascending."""
    lines: dict[str, list] = {}
    for (label, batch), selection in study.best().items():
        lines.setdefault(label, []).append((batch, [value(r) for r in selection.runs], selection.on_edge))
    return lines


def _against_batch(ax, lines: dict, colour: dict) -> None:
    for label, points in lines.items():
        batches = [b for b, _, _ in points]
        stats = [summary(values) for _, values, _ in points]
        means = [s.mean for s in stats]
        ax.plot(batches, means, color=colour[label], marker="o", label=label)
        ax.fill_between(batches, [min(v) for _, v, _ in points], [max(v) for _, v, _ in points],
                        color=colour[label], alpha=0.15, linewidth=0)
        edges = [(b, m) for (b, _, edge), m in zip(points, means) if edge]
        if edges:
            ax.scatter(*zip(*edges), s=90, facecolors="none", edgecolors=colour[label], linewidths=1.2)
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3, which="both")


def plot_scaling(study: Study, path: Path) -> None:
    lines = _by_batch(study, lambda r: r.final(study.select_on))
    colour = colours(lines)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    _against_batch(ax, lines, colour)
    ax.set(xlabel="global batch (sequences)", ylabel=f"final {study.select_on}",
           title="Final loss against the batch at a fixed token budget\n(best lr per point; band: lowest to "
                 "highest seed; circled: the best lr is on its grid's edge)")
    ax.title.set_fontsize(9)
    _legend(ax)
    _save(fig, path)


def plot_peak_logit(study: Study, path: Path) -> None:
    """The peak max attention logit (the largest layer, over training) against the batch."""
    lines = _by_batch(study, lambda r: max((r.peak(k) for k in r.layer_keys("max_logit")), default=math.nan))
    colour = colours(lines)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    _against_batch(ax, lines, colour)
    ax.set_yscale("symlog", **SYMLOG)
    lowest = min(v for points in lines.values() for _, values, _ in points for v in values if math.isfinite(v))
    ax.set_ylim(bottom=min(0.0, lowest))  # (symlog's autoscale would reach below 0 for positive data)
    ax.set(xlabel="global batch (sequences)", ylabel="peak max attention logit (largest layer)",
           title="Peak max attention logit against the batch (best lr per point; band: lowest to highest seed)")
    ax.title.set_fontsize(9)
    _legend(ax)
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


def plot_merit_diagnostics(study: Study, path: Path) -> bool:
    """MERIT's clip fraction and trust-ratio spread per layer: plain MERIT (no ablation) at its
    selected lr, at the largest batch it was run at."""
    merit = [(key, s) for key, s in study.best().items()
             if s.runs[0].optimizer_label == "merit" and s.runs[0].keys("clip_fraction/")]
    if not merit:
        return False
    (label, batch), selection = max(merit, key=lambda item: item[0][1])
    run = selection.runs[0]
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
        _legend(ax)
    fig.suptitle(f"{label}, batch {batch}, lr {selection.lr:g}, seed {run.seed} ({run.name})")
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


def plot_head_logits(study: Study, path: Path) -> bool:
    """Layer x head heatmaps of the max attention logit at SNAPSHOTS steps, for the selected runs
    with the largest final logits: which heads run away, and when."""
    panels = [(label, batch, s.runs[0]) for (label, batch), s in study.best().items()
              if s.runs[0].keys("max_logit/layer_00/head_")]
    if not panels:
        return False
    peak = lambda run: max((run.final(k) or 0.0) for k in run.layer_keys("max_logit"))  # noqa: E731
    panels = sorted(panels, key=lambda p: peak(p[2]), reverse=True)[:MAX_PANELS // 2]
    grids = []
    for _, _, run in panels:
        steps = sorted({r["step"] for r in run.records if "step" in r and any(HEAD_KEY.match(k) for k in r)})
        picked = sorted({steps[round(i * (len(steps) - 1) / max(SNAPSHOTS - 1, 1))] for i in range(SNAPSHOTS)})
        grids.append([(step, head_logits(run, step)) for step in picked])
    top = max(v for row in grids for _, grid in row for line in grid for v in line if math.isfinite(v))
    fig, axes = plt.subplots(len(panels), SNAPSHOTS, figsize=(2.8 * SNAPSHOTS + 1, 2.5 * len(panels)), squeeze=False,
                             layout="constrained")
    norm = matplotlib.colors.SymLogNorm(linthresh=1.0, vmin=min(0.0, min(
        v for row in grids for _, grid in row for line in grid for v in line if math.isfinite(v))), vmax=top)
    for r, ((label, batch, run), row, ax_row) in enumerate(zip(panels, grids, axes)):
        for c, (ax, (step, grid)) in enumerate(zip(ax_row, row)):
            image = ax.imshow(grid, aspect="auto", cmap="magma", norm=norm)
            ax.set_title(f"{label}, batch {batch}, step {step}", fontsize=7)
            ax.set_xticks(range(len(grid[0])))
            ax.set_yticks(range(len(grid)))
            ax.tick_params(labelsize=6)
            if c == 0:
                ax.set_ylabel("layer")
            if r == len(panels) - 1:
                ax.set_xlabel("head")
        for ax in ax_row[len(row):]:
            ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.8, label="max attention logit (symmetric log)")
    fig.suptitle("Max attention logit per layer and head over training (one seed at the best lr)")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_attention_entropy(study: Study, path: Path) -> bool:
    """Per layer, the lowest head entropy over steps: entropy collapse shows before instability."""
    panels = [(key, s) for key, s in study.best().items() if s.runs[0].layer_keys("attn_entropy")][:MAX_PANELS]
    if not panels:
        return False
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.5 * rows), squeeze=False, sharey=True)
    for ax, ((label, batch), selection) in zip(axes.flat, panels):
        layers = selection.runs[0].layer_keys("attn_entropy")
        cmap = plt.get_cmap("viridis", max(len(layers), 2))
        for i, key in enumerate(layers):
            steps, mean, low, high = seed_band(selection.runs, key)
            ax.plot(steps, mean, color=cmap(i), linewidth=1, label=key.removeprefix("attn_entropy/"))
            ax.fill_between(steps, low, high, color=cmap(i), alpha=0.15, linewidth=0)
        ax.set(title=f"{label}, batch {batch}, lr {selection.lr:g}", xlabel="step",
               ylabel="min attention entropy over heads (nats)")
        ax.title.set_fontsize(8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper right", fontsize=7, ncol=max(1, len(names) // 12), frameon=False)
    fig.suptitle("Attention entropy per layer, the lowest head (band: lowest to highest seed)")
    _save(fig, path)
    return True


def plot_noise_scale(study: Study, path: Path) -> bool:
    """The gradient noise scale B_simple over training (tokens, the seeds at the selected lr) of
    every point, a panel per batch with that batch in tokens (dashed): a batch far above B_simple
    buys little per token, one far below takes more steps than it needs."""
    best = {key: s for key, s in study.best().items() if s.runs[0].series("noise_scale/b_simple")[0]}
    if not best:
        return False
    fig, panels, colour = _batch_panels(best)
    for (label, batch), selection in best.items():
        steps, mean, low, high = seed_band(selection.runs, "noise_scale/b_simple")
        tokens = [s * selection.runs[0].tokens_per_step() for s in steps]
        panels[batch].plot(tokens, mean, color=colour[label], linewidth=1.2)
        panels[batch].fill_between(tokens, low, high, color=colour[label], alpha=0.12, linewidth=0)
    for batch, ax in panels.items():
        batch_tokens = next(s.runs[0].final("noise_scale/batch_tokens") for (_, b), s in best.items() if b == batch)
        ax.axhline(batch_tokens, color="black", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.set(xlabel="training tokens", ylabel="B_simple (tokens)",
               title=f"batch {batch} = {batch_tokens:,.0f} tokens (dashed)")
        ax.title.set_fontsize(8)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("Gradient noise scale B_simple over training against the batch (band: lowest to highest seed)")
    _save_with_legend_below(fig, colour, path)
    return True


def _save(fig, path: Path) -> None:
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # (room for the suptitle)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_all(runs: list[Run], out: Path, select_on: str = "val/loss") -> list[Path]:
    """Every figure of ``runs`` into the folder ``out``; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    study = Study(runs, select_on)
    written = []
    for name, draw in (("val_loss", plot_val_loss), ("max_logit", plot_max_logits), ("scaling", plot_scaling),
                       ("peak_logit", plot_peak_logit)):
        draw(study, out / f"{name}.png")
        written.append(out / f"{name}.png")
    for name, draw in (("merit_diagnostics", plot_merit_diagnostics), ("max_logit_heads", plot_head_logits),
                       ("attn_entropy", plot_attention_entropy), ("noise_scale", plot_noise_scale)):
        if draw(study, out / f"{name}.png"):  # each only where the runs logged its keys
            written.append(out / f"{name}.png")
    return written
