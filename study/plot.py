"""The study's figures (PNG) from runs grouped into points (study/runs.py); scripts/plot.py is the
CLI and its docstring lists the figures. Every figure shows each point at its lr selected on the
study's ``select_on``, its seeds as a band around their mean (never as lines on top of each other),
and names the points and runs it shows; the loss figures draw ``report_on``, the numbers of the
report's tables (study/report.py). A log axis of logits is symmetric-log, so a logit <= 0 is drawn
where it is. Each ``plot_*`` returns its figure (None where the runs did not log its keys), which
``draw_all`` saves.
"""
from __future__ import annotations

import io
import math
import re
import textwrap
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.colors  # noqa: E402
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from PIL import Image  # noqa: E402

from atomic import atomic_write  # noqa: E402
from study import cbs  # noqa: E402
from study.report import peak_logit, ramps_of, reaches_one_sequence, selected_finals  # noqa: E402
from study.runs import Run, Selection, Study, summary  # noqa: E402

LAYER = re.compile(r"transformer\.h\.(\d+)\.")
MAX_PANELS = 24
SYMLOG = dict(base=10, linthresh=1.0)  # linear within [-1, 1], logarithmic beyond
# At 100 dpi the font sizes below read well (and the largest figures, a panel per point, stay
# near 1,300 pixels wide).
DPI = 100
# viridis runs from dark purple to a pale yellow that a thin line on white hides: the layers take
# its part up to this fraction (a mid green), dark to light with depth.
LAYER_MAP, LAYER_MAP_END = "viridis", 0.75


def point_colours(study: Study) -> dict[str, tuple]:
    """A colour per point label of ``study``, the same in every figure: tab10's, each strong on white
    (past ten labels they repeat)."""
    labels = sorted({label for label, _ in study.best()})
    palette = matplotlib.colormaps["tab10"].colors
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def layer_colours(layers: int) -> list[tuple]:
    """A colour per layer, layer 0 the darkest: the same layer the same colour in every per-layer figure."""
    cmap = matplotlib.colormaps[LAYER_MAP]
    return [cmap(LAYER_MAP_END * i / max(layers - 1, 1)) for i in range(layers)]


def seed_band(runs: list[Run], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps every seed logged ``key`` at, the mean, the lowest and the highest seed there)."""
    return band([run.series(key) for run in runs])


def band(seeds: list[tuple[list[int], list[float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """(the steps every seed's (steps, values) has, the mean, the lowest and the highest seed there)."""
    series = [dict(zip(*s)) for s in seeds]
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    values = [[s[step] for s in series] for step in steps]
    return steps, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def _band(ax, x, mean, low, high, colour, label: str) -> None:
    """A point's (or a layer's) mean line and its seeds' band."""
    ax.plot(x, mean, color=colour, linewidth=1.5, label=label)
    ax.fill_between(x, low, high, color=colour, alpha=0.15, linewidth=0)


def _legend(ax) -> None:
    ax.legend(fontsize=9, frameon=False)


def _figure_legend(fig: Figure, colour: dict, where: str, title: str | None = None) -> None:
    """One legend of ``colour``'s lines for every panel, outside them (``where``: "upper" or "lower"),
    under ``title`` if given (above the panels, a title of its own would overlap it)."""
    handles = [matplotlib.lines.Line2D([], [], color=c, linewidth=3, label=label) for label, c in colour.items()]
    fig.legend(handles=handles, loc=f"outside {where} center", ncol=min(len(handles), 6), fontsize=11,
               title=title, title_fontsize=13, frameon=False)


def _fit(fig: Figure, title: str) -> str:
    """``title`` wrapped to the figure's width (about ten characters an inch at a title's size): a
    figure of one or two panels is narrower than its title."""
    return textwrap.fill(title, int(10 * fig.get_figwidth()))


def _panels(count: int, columns: int, width: float, height: float, **kwargs):
    """(figure, its first ``count`` axes): a grid of ``columns`` panels a row, the rest blank."""
    columns = min(columns, count)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False,
                             layout="constrained", **kwargs)
    for ax in list(axes.flat)[count:]:
        ax.axis("off")
    return fig, list(axes.flat)[:count]


def _batch_panels(best: dict) -> tuple[Figure, dict]:
    """(figure, {batch: its axes}): a panel per batch of ``best``'s points."""
    batches = sorted({batch for _, batch in best})
    fig, axes = _panels(len(batches), 4, 4.4, 3.8)
    return fig, dict(zip(batches, axes))


def _over_tokens(ax, selection: Selection, series: Callable[[Run], tuple], colour, label: str) -> None:
    """A point's ``series(run)`` (steps, values) against its training tokens, its seeds' band."""
    steps, mean, low, high = band([series(run) for run in selection.runs])
    _band(ax, [selection.runs[0].tokens_at(s) for s in steps], mean, low, high, colour, label)


def plot_loss(study: Study, report_on: str) -> Figure:
    """``report_on`` over training tokens, a panel per batch, a colour per point."""
    best = study.best()
    fig, panels = _batch_panels(best)
    colour = point_colours(study)
    for (label, batch), selection in best.items():
        _over_tokens(panels[batch], selection, lambda run: run.series(report_on), colour[label], label)
    for batch, ax in panels.items():
        lrs = ", ".join(f"{label} {s.lr:g}" for (label, b), s in best.items() if b == batch)
        ax.set(xlabel="training tokens", ylabel=report_on, title=f"batch {batch}\n" + textwrap.fill(f"lr: {lrs}", 55))
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
    fig.suptitle(_fit(fig, f"{report_on} over training, each point at its lr selected on {study.select_on} "
                           f"(band: lowest to highest seed)"))
    _figure_legend(fig, colour, "lower")
    return fig


def largest_layer_series(run: Run, stat: str) -> tuple[list[int], list[float]]:
    """(steps, the largest layer's ``stat`` at each) of the steps that logged every layer's."""
    steps, _, _, largest = band([run.series(key) for key in run.layer_keys(stat)])
    return steps, largest


def plot_seq_len_warmup(study: Study, report_on: str) -> Figure | None:
    """Against the training tokens (the axis on which a sequence-length warmup's runs and the others
    train alike), a row per batch: ``report_on``, the max attention logit (the largest layer) and the
    largest element of the optimizer's second moment (the warmup paper's signal of a spike), a
    colour per point at its selected lr; None without a warmup."""
    if not any(r.config.get("seq_len_warmup_start") for r in study.runs):
        return None
    best = study.best()
    batches = sorted({batch for _, batch in best})
    fig, axes = _panels(3 * len(batches), 3, 4.6, 3.6)
    colour = point_colours(study)
    signals = ((lambda run: run.series(report_on), report_on, "linear"),
               (lambda run: largest_layer_series(run, "max_logit"), "max attention logit (largest layer)", "symlog"),
               (lambda run: run.series("second_moment/max"), "largest element of v (second moment)", "log"))
    for row, batch in enumerate(batches):
        for (series, ylabel, scale), ax in zip(signals, axes[3 * row:3 * row + 3]):
            for (label, b), selection in best.items():
                if b == batch and series(selection.runs[0])[0]:
                    _over_tokens(ax, selection, series, colour[label], label)
            ax.set_yscale(scale, **(SYMLOG if scale == "symlog" else {}))
            ax.set(xlabel="training tokens", ylabel=ylabel, title=f"batch {batch}")
            ax.grid(alpha=0.3, which="both")
    fig.suptitle(_fit(fig, f"{report_on}, the max attention logit and Adam's second moment over the tokens trained, "
                           f"each point at its lr selected on {study.select_on} (band: lowest to highest seed)"))
    _figure_legend(fig, colour, "lower")
    return fig


def _layer_panels(study: Study, stat: str, ylabel: str, title: str, symlog: bool = False) -> Figure | None:
    """A panel per point that logged ``stat`` per layer (``stat/layer_NN``), a line per layer."""
    panels = [(key, s) for key, s in study.best().items() if s.runs[0].layer_keys(stat)][:MAX_PANELS]
    if not panels:
        return None
    layer = lambda key: int(key.removeprefix(f"{stat}/layer_"))  # noqa: E731
    colour = layer_colours(1 + max(layer(key) for _, s in panels for key in s.runs[0].layer_keys(stat)))
    fig, axes = _panels(len(panels), 3, 4.4, 3.2, sharey=True)
    for ax, ((label, batch), selection) in zip(axes, panels):
        for key in selection.runs[0].layer_keys(stat):
            _band(ax, *seed_band(selection.runs, key), colour[layer(key)], f"layer {layer(key)}")
        if symlog:
            ax.set_yscale("symlog", **SYMLOG)
        ax.set(title=f"{label}, batch {batch}, lr {selection.lr:g}", xlabel="step", ylabel=ylabel)
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3, which="both")
    _figure_legend(fig, {f"layer {i}": c for i, c in enumerate(colour)}, "upper", _fit(fig, title))
    return fig


def plot_max_logits(study: Study) -> Figure | None:
    """The per-layer maximum attention logit over steps (the paper's figure)."""
    return _layer_panels(study, "max_logit", "max attention logit",
                         "Max attention logit per layer (symmetric log scale; band: lowest to highest seed)",
                         symlog=True)


def _by_batch(study: Study, values: Callable[[Selection], list[float]]) -> dict[str, list[tuple[int, list, bool]]]:
    """Per point label: (batch, ``values`` of the seeds at its selected lr, whether that lr is on the
    grid's edge), batches ascending."""
    lines: dict[str, list] = {}
    for (label, batch), selection in study.best().items():
        lines.setdefault(label, []).append((batch, values(selection), selection.on_edge))
    return lines


def _against_batch(ax, lines: dict, colour: dict) -> None:
    for label, points in lines.items():
        batches = [b for b, _, _ in points]
        means = [summary(values).mean for _, values, _ in points]
        ax.plot(batches, means, color=colour[label], marker="o", label=label)
        ax.fill_between(batches, [min(v) for _, v, _ in points], [max(v) for _, v, _ in points],
                        color=colour[label], alpha=0.15, linewidth=0)
        edges = [(b, m) for (b, _, edge), m in zip(points, means) if edge]
        if edges:
            ax.scatter(*zip(*edges), s=90, facecolors="none", edgecolors=colour[label], linewidths=1.2)
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3, which="both")


def plot_scaling(study: Study, report_on: str) -> Figure:
    """The final ``report_on`` against the batch at the fixed token budget: the loss table's means
    (study/report.py), a line per point."""
    lines = _by_batch(study, lambda selection: selected_finals(selection, report_on))
    fig, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
    _against_batch(ax, lines, point_colours(study))
    ax.set(xlabel="global batch (sequences)", ylabel=f"final {report_on}",
           title=f"Final {report_on} against the batch at a fixed token budget\n(each point at its lr selected on "
                 f"{study.select_on}; band: lowest to highest seed;\ncircled: that lr is on its grid's edge)")
    ax.title.set_fontsize(10)
    _legend(ax)
    return fig


def plot_peak_logit(study: Study) -> Figure | None:
    """The peak max attention logit (the largest layer, over training) against the batch."""
    lines = _by_batch(study, lambda selection: [peak_logit(r) for r in selection.runs])
    finite = [v for points in lines.values() for _, values, _ in points for v in values if math.isfinite(v)]
    if not finite:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
    _against_batch(ax, lines, point_colours(study))
    ax.set_yscale("symlog", **SYMLOG)
    ax.set_ylim(bottom=min(0.0, min(finite)))  # (symlog's autoscale would reach below 0 for positive data)
    ax.set(xlabel="global batch (sequences)", ylabel="peak max attention logit (largest layer)",
           title=f"Peak max attention logit against the batch\n(each point at its lr selected on {study.select_on}; "
                 f"band: lowest to highest seed)")
    ax.title.set_fontsize(10)
    _legend(ax)
    return fig


def plot_small_batch(study: Study, report_on: str) -> Figure | None:
    """The final ``report_on`` against the batch at the fixed token budget, a panel per optimizer
    (its points: AdamW with fixed betas and with beta2 by half-life, ...), each point at its
    selected lr with its seeds' range as error bars (lowest to highest seed), on one loss axis, and
    AdamW's points thin and grey in the other panels (the small-batch section of the report: Marek
    et al. 2025's axis, down to one sequence)."""
    lines = _by_batch(study, lambda selection: selected_finals(selection, report_on))
    optimizer = {label: s.runs[0].config["optimizer"] for (label, _), s in study.best().items()}
    optimizers = sorted(set(optimizer.values()), key=lambda name: (name != "adamw", name))
    if not optimizers:
        return None
    colour = point_colours(study)
    fig, axes = _panels(len(optimizers), 3, 4.4, 3.6, sharey=True)
    for ax, name in zip(axes, optimizers):
        for label, points in lines.items():
            batches = [b for b, _, _ in points]
            means = [summary(values).mean for _, values, _ in points]
            if optimizer[label] != name:
                if optimizer[label] == "adamw":
                    ax.plot(batches, means, color="grey", linewidth=0.8, alpha=0.6)
                continue
            low = [m - min(v) for m, (_, v, _) in zip(means, points)]
            high = [max(v) - m for m, (_, v, _) in zip(means, points)]
            ax.errorbar(batches, means, yerr=[low, high], color=colour[label], marker="o", capsize=3, label=label)
            edges = [(b, m) for (b, _, edge), m in zip(points, means) if edge]
            if edges:
                ax.scatter(*zip(*edges), s=90, facecolors="none", edgecolors=colour[label], linewidths=1.2)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())  # 1, 2, 4, ... 512
        ax.set(title=name, xlabel="global batch (sequences)", ylabel=f"final {report_on}")
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3, which="both")
        _legend(ax)
    fig.suptitle(_fit(fig, f"Final {report_on} against the batch at a fixed token budget, by optimizer (each point at "
                           f"its lr selected on {study.select_on}; bars: lowest to highest seed; circled: that lr is "
                           f"on its grid's edge; grey: AdamW's points)"))
    return fig


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


def plot_merit_diagnostics(study: Study) -> Figure | None:
    """MERIT's clip fraction and trust-ratio spread per layer: plain MERIT (no ablation) at its
    selected lr, at the largest batch it was run at."""
    merit = [(key, s) for key, s in study.best().items()
             if s.runs[0].optimizer_label == "merit" and s.runs[0].keys("clip_fraction/")]
    if not merit:
        return None
    (label, batch), selection = max(merit, key=lambda item: item[0][1])
    run = selection.runs[0]
    fig, (clip_ax, spread_ax) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    clip = per_layer(run, "clip_fraction")
    low, high = per_layer(run, "trust_ratio_min"), per_layer(run, "trust_ratio_max")
    colour = layer_colours(1 + max(clip.keys() | low.keys()))
    for layer, (steps, values) in clip.items():
        clip_ax.plot(steps, values, color=colour[layer], linewidth=1.5, label=f"layer {layer}")
    for layer in sorted(low.keys() & high.keys()):
        steps, lows = low[layer]
        spread = [h / lo if lo > 0 else math.nan for lo, h in zip(lows, high[layer][1])]
        spread_ax.plot(steps, spread, color=colour[layer], linewidth=1.5, label=f"layer {layer}")
    clip_ax.set(xlabel="step", ylabel="fraction of elements clipped", title="MERIT element-wise clip fraction")
    spread_ax.set(xlabel="step", ylabel="max / min trust ratio", title="MERIT trust-ratio spread")
    spread_ax.set_yscale("log")
    for ax in (clip_ax, spread_ax):
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.suptitle(f"{label}, batch {batch}, lr {selection.lr:g}, seed {run.seed} ({run.name})")
    return fig


HEAD_KEY = re.compile(r"max_logit/layer_(\d+)/head_(\d+)$")
SNAPSHOTS = 4


def head_logits(run: Run, step: int) -> list[list[float]]:
    """The (layer x head) max attention logits logged at ``step`` (NaN where one is missing)."""
    record = next(r for r in run.records if r.get("step") == step and any(HEAD_KEY.match(k) for k in r))
    cells = {tuple(map(int, m.groups())): record[k] for k in record if (m := HEAD_KEY.match(k))}
    layers, heads = (1 + max(cell[i] for cell in cells) for i in (0, 1))
    return [[cells.get((layer, head), math.nan) for head in range(heads)] for layer in range(layers)]


def plot_head_logits(study: Study) -> Figure | None:
    """Layer x head heatmaps of the max attention logit at SNAPSHOTS steps, for the selected runs
    with the largest final logits: which heads run away, and when."""
    panels = [(label, batch, s.runs[0]) for (label, batch), s in study.best().items()
              if s.runs[0].keys("max_logit/layer_00/head_")]
    if not panels:
        return None
    peak = lambda run: max((run.final(k) or 0.0) for k in run.layer_keys("max_logit"))  # noqa: E731
    panels = sorted(panels, key=lambda p: peak(p[2]), reverse=True)[:MAX_PANELS // 2]
    grids = []
    for _, _, run in panels:
        steps = sorted({r["step"] for r in run.records if "step" in r and any(HEAD_KEY.match(k) for k in r)})
        picked = sorted({steps[round(i * (len(steps) - 1) / max(SNAPSHOTS - 1, 1))] for i in range(SNAPSHOTS)})
        grids.append([(step, head_logits(run, step)) for step in picked])
    cells = [v for row in grids for _, grid in row for line in grid for v in line if math.isfinite(v)]
    fig, axes = plt.subplots(len(panels), SNAPSHOTS, figsize=(2.8 * SNAPSHOTS + 1, 2.5 * len(panels)), squeeze=False,
                             layout="constrained")
    norm = matplotlib.colors.SymLogNorm(linthresh=1.0, vmin=min(0.0, min(cells)), vmax=max(cells))
    for r, ((label, batch, run), row, ax_row) in enumerate(zip(panels, grids, axes)):
        for c, (ax, (step, grid)) in enumerate(zip(ax_row, row)):
            image = ax.imshow(grid, aspect="auto", cmap="magma", norm=norm)
            ax.set_title(f"{label}, batch {batch}, step {step}", fontsize=9)
            ax.set_xticks(range(len(grid[0])))
            ax.set_yticks(range(len(grid)))
            ax.tick_params(labelsize=8)
            if c == 0:
                ax.set_ylabel("layer")
            if r == len(panels) - 1:
                ax.set_xlabel("head")
        for ax in ax_row[len(row):]:
            ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.6, aspect=40, label="max attention logit (symmetric log)")
    fig.suptitle(f"Max attention logit per layer and head over training (one seed at the lr selected on "
                 f"{study.select_on})")
    return fig


def plot_attention_entropy(study: Study) -> Figure | None:
    """Per layer, the lowest head entropy over steps: entropy collapse shows before instability."""
    return _layer_panels(study, "attn_entropy", "min attention entropy over heads (nats)",
                         "Attention entropy per layer, the lowest head (band: lowest to highest seed)")


def plot_noise_scale(study: Study) -> Figure | None:
    """The gradient noise scale B_simple over training (tokens, the seeds at the selected lr) of
    every point, a panel per batch with that batch in tokens (dashed): a batch far above B_simple
    buys little per token, one far below takes more steps than it needs."""
    best = {key: s for key, s in study.best().items() if s.runs[0].series("noise_scale/b_simple")[0]}
    if not best:
        return None
    fig, panels = _batch_panels(best)
    colour = point_colours(study)
    for (label, batch), selection in best.items():
        steps, mean, low, high = seed_band(selection.runs, "noise_scale/b_simple")
        tokens = [selection.runs[0].tokens_at(s) for s in steps]
        _band(panels[batch], tokens, mean, low, high, colour[label], label)
    for batch, ax in panels.items():
        batch_tokens = next(s.runs[0].final("noise_scale/batch_tokens") for (_, b), s in best.items() if b == batch)
        ax.axhline(batch_tokens, color="black", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.set(xlabel="training tokens", ylabel="B_simple (tokens)",
               title=f"batch {batch} = {batch_tokens:,.0f} tokens (dashed)")
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(_fit(fig, "Gradient noise scale B_simple over training against the batch (band: lowest to highest "
                           "seed)"))
    _figure_legend(fig, {label: colour[label] for label in sorted({label for label, _ in best})}, "lower")
    return fig


def plot_cbs_branches(runs: list[Run], branches: list[Run], ema: float) -> Figure | None:
    """A panel per branched checkpoint: each multiplier's smoothed training loss (the mean over its
    seeds, as the rule reads it) against the tokens since the checkpoint."""
    panels: dict[tuple, dict[float, list[list[float]]]] = {}
    for branch in branches:
        parent, step, k, _ = cbs.branch_of(branch)
        losses = cbs.branch_losses(branch)
        if losses:
            panels.setdefault((parent, step), {}).setdefault(k, []).append(cbs.smoothed_series(losses, ema))
    if not panels:
        return None
    labels = {run.folder: f"{run.optimizer_label} ({run.name})" for run in runs}
    fig, axes = _panels(len(panels), len({step for _, step in panels}), 4.0, 3.4)
    for ax, ((parent, step), curves) in zip(axes, sorted(panels.items())):
        ks = sorted(curves)
        colours = plt.get_cmap("plasma")([0.85 * i / max(1, len(ks) - 1) for i in range(len(ks))])
        for k, colour in zip(ks, colours):
            series = curves[k]
            mean = [sum(values) / len(values) for values in zip(*series)]
            fraction = [(i + 1) / len(mean) for i in range(len(mean))]  # every branch trains the same tokens
            ax.plot(fraction, mean, color=colour, label=f"k={k:g} ({len(series)} seed{'s' * (len(series) > 1)})")
        ax.set_title(f"{labels.get(parent, parent.name)}, step {step}", fontsize=9)
        ax.set_xlabel("branch tokens (fraction)")
        ax.set_ylabel(f"train loss, EMA {ema:g}")
        _legend(ax)
    fig.suptitle(_fit(fig, "Branches: each multiplier's smoothed training loss from the checkpoint (mean over seeds)"))
    return fig


def plot_cbs(runs: list[Run], branches: list[Run], epsilon: float, ema: float) -> Figure | None:
    """The critical batch over training (B* = k* x B by the paper's rule) with the live B_simple
    beside it, one line per run, a panel per optimizer."""
    measured = cbs.measured_runs([*runs, *branches], epsilon, ema)
    by_folder = {run.folder: run for run in runs}
    optimizers = sorted({by_folder[f].optimizer_label for f, m in measured.items() if m and f in by_folder})
    if not optimizers:
        return None
    fig, axes = _panels(len(optimizers), 3, 4.8, 3.8, sharey=True)
    for ax, optimizer in zip(axes, optimizers):
        folders = [f for f, m in measured.items() if m and f in by_folder and by_folder[f].optimizer_label == optimizer]
        colours = plt.get_cmap("tab10")(range(len(folders)))
        for folder, colour in zip(folders, colours):
            ms = measured[folder]
            ax.plot([m.tokens for m in ms], [m.k_epsilon * m.batch for m in ms], "o-", color=colour,
                    label=f"{folder.name}: B*")
            from_one = [(m.tokens, m.k_epsilon_from_one * m.batch) for m in ms if m.k_epsilon_from_one is not None]
            if from_one:
                ax.plot(*zip(*from_one), "^-.", color=colour, alpha=0.6, label=f"{folder.name}: B* over k >= 1")
            simple = [(m.tokens, m.b_simple) for m in ms if m.b_simple]
            if simple:
                ax.plot(*zip(*simple), "s--", color=colour, alpha=0.6, label=f"{folder.name}: B_simple")
            ax.plot([m.tokens for m in ms], [m.batch for m in ms], ":", color=colour, alpha=0.5)
        ax.set_yscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter())  # 200k, 1M
        ax.set_title(optimizer, fontsize=10)
        ax.set_xlabel("tokens")
        ax.set_ylabel("batch (sequences)")
        _legend(ax)
    fig.suptitle(_fit(fig, f"The critical batch by branching (B*: L_k <= L_j + {epsilon:g} for every smaller j, "
                           f"EMA {ema:g}; dash-dotted: over k >= 1 only) and the live noise scale B_simple; dotted: "
                           f"the run's batch"))
    return fig


def plot_ramps(runs: list[Run], report_on: str) -> Figure | None:
    """A panel per batch ramp (study/report.py's ramps_of): ``report_on`` against the optimizer steps
    for the ramp and each of its controls (the seeds' mean and band), the constant small batch's
    final loss dashed: where each arm's curve crosses it is the equal-loss table's step."""
    ramps = ramps_of(runs)
    if not ramps:
        return None
    fig, axes = _panels(len(ramps), 3, 4.8, 3.8)
    palette = matplotlib.colormaps["tab10"].colors
    for ax, ramp in zip(axes, ramps):
        shown = []
        for i, (name, arm) in enumerate(ramp.arms.items()):
            steps, mean, low, high = seed_band(arm, report_on)
            _band(ax, steps, mean, low, high, palette[i % len(palette)],
                  f"{name} ({len(arm)} seed{'s' * (len(arm) > 1)})")
            shown += [value for step, *band in zip(steps, low, high) if step > 0 for value in band]
        if shown:  # (from the first evaluation on: the loss at initialisation, twice the rest, flattens them)
            ax.set_ylim(min(shown) - 0.02, max(shown) + 0.02)
        if "constant small" in ramp.arms:
            ax.axhline(summary([r.final(report_on) for r in ramp.arms["constant small"]]).mean, color="black",
                       linestyle="--", linewidth=1)
        ax.set_title(f"{ramp.label}: " + " -> ".join(str(batch) for _, batch in ramp.phases), fontsize=10)
        ax.set_xlabel("optimizer steps")
        ax.set_ylabel(report_on)
        _legend(ax)
    fig.suptitle(_fit(fig, f"Batch ramps against constant batches: {report_on} against the steps (band: lowest to "
                           f"highest seed; dashed: the constant small batch's final loss)"))
    return fig


# The figures of the critical batch and the ramps that follow it (scripts/cbs_study.py keeps them beside
# its archive).
CBS_FIGURES = ("cbs_branches", "cbs", "ramps")


def draw_all(runs: list[Run], out: Path, select_on: str = "val/loss", report_on: str | None = None,
             branches: list[Run] = (), epsilon: float = 0.01, ema: float = 0.5,
             only: tuple[str, ...] | None = None, small_batch: bool | None = None) -> list[Path]:
    """Every figure of ``runs`` (or those named in ``only``) into the folder ``out`` (each point's
    lr chosen on ``select_on``, the loss figures drawn on ``report_on``, default the same: the
    report's rule; with the ``branches`` of some of them, the critical batch's figures by
    ``epsilon`` and ``ema``; and the small-batch section's figure where ``small_batch`` says so, by
    default where the runs reach a batch of one sequence, as the report's section); the files written."""
    report_on = report_on or select_on
    study = Study(runs, select_on)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    figures = {"val_loss": lambda: plot_loss(study, report_on), "max_logit": lambda: plot_max_logits(study),
               "scaling": lambda: plot_scaling(study, report_on), "peak_logit": lambda: plot_peak_logit(study),
               "merit_diagnostics": lambda: plot_merit_diagnostics(study),
               "max_logit_heads": lambda: plot_head_logits(study),
               "attn_entropy": lambda: plot_attention_entropy(study), "noise_scale": lambda: plot_noise_scale(study),
               "cbs_branches": lambda: plot_cbs_branches(runs, branches, ema),
               "cbs": lambda: plot_cbs(runs, branches, epsilon, ema), "ramps": lambda: plot_ramps(runs, report_on),
               "seq_len_warmup": lambda: plot_seq_len_warmup(study, report_on),
               **({"small_batch": lambda: plot_small_batch(study, report_on)}
                  if (reaches_one_sequence(runs) if small_batch is None else small_batch) else {})}
    for name, figure in figures.items():  # one at a time: a figure is closed before the next is drawn
        if only is not None and name not in only:
            continue
        fig = figure()
        if fig is not None:  # (None: the runs did not log its keys)
            _save(fig, out / f"{name}.png")
            written.append(out / f"{name}.png")
    return written


def _save(fig: Figure, path: Path) -> None:
    """``fig`` as a PNG of 256 colours at most, written atomically, and closed. An adaptive palette
    looks the same as full colour here (lines, text and the bands' blends of them) at a third of the
    bytes."""
    drawn, packed = io.BytesIO(), io.BytesIO()
    fig.savefig(drawn, format="png", dpi=DPI)
    plt.close(fig)
    Image.open(drawn).convert("RGB").quantize(256).save(packed, format="png", optimize=True)
    with atomic_write(path, "wb") as f:
        f.write(packed.getvalue())
