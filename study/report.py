"""The study's markdown tables from runs (study/runs.py); scripts/report.py is the CLI and its
docstring lists the tables.
"""
from __future__ import annotations

import itertools
import math

from study.runs import Run, best_lr, group, mean_std


def _pm(values: list[float], digits: int = 3) -> str:
    mean, std = mean_std(values)
    if math.isnan(mean):
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def loss_table(best: dict) -> str:
    batches = sorted({batch for _, batch in best})
    labels = sorted({label for label, _ in best})
    rows = []
    for label in labels:
        row = [label]
        for batch in batches:
            seeds = best.get((label, batch))
            row.append("-" if seeds is None else
                       f"{_pm([r.final('val/loss') for r in seeds])} (lr {seeds[0].lr:g}, {len(seeds)} seeds)")
        rows.append(row)
    return table(["optimizer", *(f"batch {b}" for b in batches)], rows)


def overlap_note(best: dict) -> str:
    overlapping, single = [], False
    for batch in sorted({b for _, b in best}):
        at_batch = {label: seeds for (label, b), seeds in best.items() if b == batch}
        for (a, runs_a), (b, runs_b) in itertools.combinations(sorted(at_batch.items()), 2):
            (mean_a, std_a), (mean_b, std_b) = (mean_std([r.final("val/loss") for r in s]) for s in (runs_a, runs_b))
            single |= min(len(runs_a), len(runs_b)) < 2
            if abs(mean_a - mean_b) <= std_a + std_b:
                overlapping.append(f"{a} and {b} at batch {batch} ({mean_a:.3f} vs {mean_b:.3f})")
    notes = []
    if overlapping:
        notes.append("Within the seed spread (mean ± std intervals overlap; not significant with these seeds): "
                     + "; ".join(overlapping) + ".")
    if single:
        notes.append("Points with a single seed have no spread: their differences cannot be judged.")
    return "\n\n".join(notes) or "Every pair of optimizers at the same batch is separated by more than its seed spread."


def grid_table(runs: list[Run]) -> str:
    rows = []
    for (label, batch, lr), seeds in group(runs, "label", "batch_size", "lr").items():
        done = [r for r in seeds if r.finished]
        loss = _pm([r.final("val/loss") for r in done]) if done else "did not finish"
        rows.append([label, str(batch), f"{lr:g}", loss, f"{len(done)} of {len(seeds)}"])
    return table(["optimizer", "batch", "lr", "final val loss", "seeds finished"], rows)


def unfinished_note(runs: list[Run]) -> str | None:
    unfinished = [r for r in runs if not r.finished]
    if not unfinished:
        return None
    return ("Did not finish (diverged, e.g. stopped by nonfinite='stop', or interrupted; left out of every "
            "other table): " + ", ".join(f"{r.label} lr {r.lr:g} seed {r.seed} (last logged step {r.last_step} "
                                           f"of {r.total_steps})" for r in unfinished) + ".")


def max_logit_table(best: dict) -> str:
    layers = sorted({k for seeds in best.values() for r in seeds for k in r.layer_keys("max_logit")})
    rows = []
    for (label, batch), seeds in sorted(best.items()):
        row = [label, str(batch)]
        for key in layers:
            peaks = [max(r.series(key)[1], default=math.nan) for r in seeds]
            finals = [r.final(key) for r in seeds]
            row.append(f"{mean_std(peaks)[0]:.1f} / {mean_std(finals)[0]:.1f}")
        rows.append(row)
    return table(["optimizer", "batch", *(k.removeprefix("max_logit/") for k in layers)], rows)


def target_table(best: dict, target: float) -> str:
    rows = []
    for (label, batch), seeds in sorted(best.items()):
        steps = [r.first_step_below("val/loss", target) for r in seeds]
        reached = [s for s in steps if s is not None]
        if not reached:
            rows.append([label, str(batch), "not reached", "-"])
            continue
        mean_steps = sum(reached) / len(reached)
        note = "" if len(reached) == len(steps) else f" ({len(reached)} of {len(steps)} seeds)"
        rows.append([label, str(batch), f"{mean_steps:.0f}{note}", f"{mean_steps * seeds[0].tokens_per_step():,.0f}"])
    return table(["optimizer", "batch", "steps", "tokens"], rows)


def zero_shot_table(best: dict) -> str | None:
    keys = sorted({k for seeds in best.values() for r in seeds for k in r.keys("zero_shot/")})
    if not keys:
        return None
    rows = [[label, str(batch), *(_pm([r.final(k) for r in seeds]) for k in keys)]
            for (label, batch), seeds in sorted(best.items())]
    return table(["optimizer", "batch", *(k.removeprefix("zero_shot/") for k in keys)], rows)


def hessian_table(best: dict) -> str | None:
    rows = [[label, str(batch), _pm([r.hessian["top_eigenvalue"] for r in seeds if r.hessian], 2),
             _pm([r.hessian["trace"] for r in seeds if r.hessian], 1)]
            for (label, batch), seeds in sorted(best.items()) if any(r.hessian for r in seeds)]
    return table(["optimizer", "batch", "top eigenvalue", "trace"], rows) if rows else None


def report(runs: list[Run], target: float | None) -> str:
    best = best_lr(runs)
    if not best:
        return f"# Study report: {len(runs)} runs\n\nNo run finished.\n\n{unfinished_note(runs)}\n"
    if target is None:
        target = max(mean_std([r.final("val/loss") for r in seeds])[0] for seeds in best.values())
    sections = [f"# Study report: {len(runs)} runs", "## Final validation loss (best lr per point)",
                loss_table(best), overlap_note(best), "## Final validation loss over the lr grid", grid_table(runs),
                *filter(None, [unfinished_note(runs)]),
                "## Max attention logit per layer (peak / final)", max_logit_table(best),
                f"## Steps and tokens to validation loss {target:.3f}", target_table(best, target)]
    for title, body in (("## Zero-shot", zero_shot_table(best)), ("## Hessian", hessian_table(best))):
        if body:
            sections += [title, body]
    return "\n\n".join(sections) + "\n"
