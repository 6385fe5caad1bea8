"""The study's markdown tables from runs grouped into points (study/runs.py); scripts/report.py is
the CLI and its docstring lists the tables.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from study import cbs
from study.runs import BATCH_DECAY_KEYS, Run, Selection, Study, is_branch, paired, summary

# The optimizers every other is compared with, where the runs hold them: the paper's baseline, the
# paper's optimizer and the matrix-optimizer baseline.
REFERENCES = ("adamw", "merit", "muon")


def _mean(values: list[float | None], digits: int = 3) -> str:
    s = summary(values)
    if not s.n:
        return "-"
    if s.n == 1:
        return f"{s.mean:.{digits}f}"
    return f"{s.mean:.{digits}f} ± {s.std:.{digits}f} [±{s.ci95:.{digits}f}]"


def _difference(s) -> str:
    if not s.n:
        return "-"
    interval = f" [{s.mean - s.ci95:+.3f}, {s.mean + s.ci95:+.3f}]" if s.n > 1 else " (1 seed)"
    return f"{s.mean:+.3f}{interval}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def selected_finals(selection: Selection, key: str) -> list[float | None]:
    """The final ``key`` of each seed at the point's selected lr: what a table's cell and a figure's
    point (its mean) and band (its seeds) report."""
    return [r.final(key) for r in selection.runs]


def largest_layer(run: Run, stat: str, final: bool) -> float:
    """The largest layer's final (or peak) per-layer ``stat`` of the run (NaN if it logged none)."""
    values = [run.final(k) if final else run.peak(k) for k in run.layer_keys(stat)]
    return max((v for v in values if v is not None), default=math.nan)


def peak_logit(run: Run) -> float:
    """The largest per-layer max attention logit over the run (NaN if it logged none)."""
    return largest_layer(run, "max_logit", final=False)


def _lr(selection: Selection) -> str:
    return f"lr {selection.lr:g}{', on the grid edge' if selection.on_edge else ''}"


def batch_values(study: Study) -> dict[str, list[tuple[int, object]]]:
    """The schedule keys that vary with the batch alone, and each point's decays that do ("adamw's
    beta2", "adamw (beta2 by half-life)'s beta2"; not a point's whose decays are the same at every
    batch), with each batch's value."""
    values = {key: sorted({(r.batch_size, dict(r.point)[key]) for r in study.runs}) for key in study.with_batch}
    for optimizer, keys in sorted(study.with_batch_of.items()):
        runs = [r for r in study.runs if r.config["optimizer"] == optimizer]
        for label in sorted({study.label(r) for r in runs}):  # (AdamW with fixed betas and with beta2 by half-life)
            for key in keys:
                pairs = sorted({(r.batch_size, dict(r.point).get(key)) for r in runs if study.label(r) == label})
                if len({value for _, value in pairs}) > 1:
                    values[f"{label}'s {key.removeprefix('optimizer_options.')}"] = pairs
    return values


def optimizer_values(study: Study) -> dict[str, list[tuple[str, object]]]:
    """The keys that go with the optimizer (Schedule-Free's constant lr schedule), with each
    optimizer's value."""
    return {key: sorted({(r.config["optimizer"], dict(r.point)[key]) for r in study.runs})
            for key in study.with_optimizer}


def loss_table(study: Study, best: dict, report_on: str) -> str:
    """Rows: points without their batch; columns: batches. Each cell the selected lr's seeds."""
    batches = sorted({batch for _, batch in best})
    rows = []
    for label in sorted({label for label, _ in best}):
        row = [label]
        for batch in batches:
            selection = best.get((label, batch))
            row.append("-" if selection is None else
                       f"{_mean(selected_finals(selection, report_on))} ({_lr(selection)}, "
                       f"n={len(selection.runs)})")
        rows.append(row)
    return table(["point", *(f"batch {b}" for b in batches)], rows)


def reference_label(label: str, best: dict, optimizer: str) -> str | None:
    """The label of ``optimizer``'s point with the same other keys as ``label``'s."""
    run = next(selection.runs[0] for (name, _), selection in best.items() if name == label)
    rest = label.removeprefix(run.optimizer_label)
    reference = optimizer + rest
    return reference if any(name == reference for name, _ in best) and reference != label else None


def comparison_table(best: dict, report_on: str, optimizer: str) -> str | None:
    """Each point against ``optimizer`` at the same batch (paired by seed: the difference and its
    95% interval) and against ``optimizer`` at its smallest batch (the paper's Δ)."""
    rows = []
    for (label, batch), selection in best.items():
        reference = reference_label(label, best, optimizer)
        if reference is None:
            continue
        same = best.get((reference, batch))
        smallest = min(b for name, b in best if name == reference)
        base = summary(selected_finals(best[(reference, smallest)], report_on))
        mine = summary(selected_finals(selection, report_on))
        rows.append([label, str(batch),
                     _difference(paired(selection.runs, same.runs, report_on)) if same else "-",
                     f"{mine.mean - base.mean:+.3f} (batch {smallest})"])
    if not rows:
        return None
    return table(["point", "batch", f"Δ vs {optimizer}, same batch, paired by seed [95%]",
                  f"Δ vs {optimizer} at its smallest batch (means)"], rows)


def grid_table(study: Study) -> str:
    rows = []
    for (label, batch), by_lr in study.points().items():
        for lr, seeds in by_lr.items():
            done = [r for r in seeds if r.finished]
            loss = _mean([r.final(study.select_on) for r in done]) if done else "did not finish"
            peaks = [peak_logit(r) for r in seeds]
            finals = [largest_layer(r, "max_logit", final=True) for r in done]
            rows.append([label, str(batch), f"{lr:g}", loss, f"{len(done)} of {len(seeds)}",
                         f"{max(peaks):.3g}" if peaks else "-",
                         f"{summary(finals).mean:.3g}" if done else "-"])
    return table(["point", "batch", "lr", f"final {study.select_on}", "seeds finished",
                  "peak max logit (largest layer and seed)", "final max logit (largest layer, mean)"], rows)


def unfinished_note(study: Study) -> str | None:
    unfinished = [r for r in study.runs if not r.finished]
    if not unfinished:
        return None
    return ("Did not finish (diverged, e.g. stopped by nonfinite='stop', or interrupted; their lr is not selected "
            "for the point): " + ", ".join(f"{study.label(r)} batch {r.batch_size} lr {r.lr:g} seed {r.seed} "
                                           f"(last logged step {r.last_step} of {r.total_steps})"
                                           for r in unfinished) + ".")


def effective_batch_note(study: Study) -> str | None:
    """The runs whose steps averaged fewer sequences than their batch (replica groups that trained
    without some groups for some steps): their points compare at a smaller batch than they say."""
    short = [r for r in study.runs if r.effective_batch < r.batch_size]
    if not short:
        return None
    return ("Trained part of the way without some of their replica groups (the mean sequences their steps "
            "averaged, docs/scaling_out.md): " + ", ".join(f"{study.label(r)} batch {r.batch_size} lr {r.lr:g} seed "
                                                          f"{r.seed}: {r.effective_batch:.1f}" for r in short) + ".")


def replica_groups_note(study: Study) -> str | None:
    """Whether each run of replica groups (training/replicas.py: its groups' folders replica_<id>)
    ended with one model: the groups' final ``replicas/weights_sha256`` (the digest of their weights)."""
    runs: dict[Path, dict[int, str]] = {}
    for r in study.runs:
        digest = r.final("replicas/weights_sha256")
        if digest is not None and r.folder.name.startswith("replica_"):
            runs.setdefault(r.folder.parent, {})[int(r.folder.name.split("_")[1])] = digest
    if not runs:
        return None
    said = []
    for folder, digests in sorted(runs.items()):
        models = {}
        for group, digest in sorted(digests.items()):
            models.setdefault(digest, []).append(str(group))
        said.append(f"{folder.name} (groups {', '.join(sorted(map(str, digests)))}): " +
                    ("one model" if len(models) == 1 else
                     "DIFFERENT MODELS, groups " + " | ".join(", ".join(groups) for groups in models.values())))
    return "Replica groups' final weights (their digests, docs/scaling_out.md): " + "; ".join(said) + "."


def every_lr(study: Study, best: dict):
    """(label, batch, the lr's cell, its runs) for every point, batch and lr of its grid, the
    selected lr marked."""
    for (label, batch), by_lr in study.points().items():
        selected = best[(label, batch)].lr if (label, batch) in best else None
        for lr, seeds in by_lr.items():
            yield label, str(batch), f"{lr:g}" + (" (selected)" if lr == selected else ""), seeds


def peak_final(seeds: list[Run], value) -> str:
    """"peak / final" of ``value(run, final)`` (final False: its peak over training), means over the
    seeds (a diverged seed's peak included); "-" where no seed logged it."""
    peaks, finals = summary([value(r, False) for r in seeds]), summary([value(r, True) for r in seeds])
    return f"{peaks.mean:.3g} / {finals.mean:.3g}" if peaks.n else "-"


def logged(key: str):
    """``peak_final``'s value of the logged ``key``."""
    return lambda run, final: run.final(key) if final else run.peak(key)


def layer_max(stat: str):
    """``peak_final``'s value of the largest layer's ``stat``."""
    return lambda run, final: largest_layer(run, stat, final)


def max_logit_table(study: Study, best: dict) -> str:
    """Per point, batch and every lr of its grid (the selected one marked), each layer's max
    attention logit: its peak over training / its final value, means over the seeds (a diverged
    seed's peak included: the divergence is what this table is for)."""
    layers = sorted({k for r in study.runs for k in r.layer_keys("max_logit")})
    rows = [[label, batch, lr, *(peak_final(seeds, logged(key)) for key in layers)]
            for label, batch, lr, seeds in every_lr(study, best)]
    return table(["point", "batch", "lr", *(k.removeprefix("max_logit/") for k in layers)], rows)


def logit_cure_table(study: Study, best: dict) -> str | None:
    """Where some run soft-capped its logits or added z-loss: per point, batch and lr, the max
    attention logit (the largest layer) and the LM head's largest absolute logit, raw (the probe's
    q.k, what a cap acts on) and capped (what the softmax saw), peak / final, and the final log Z
    (what z-loss pulls to 0), means over seeds."""
    cures = ("attn_logit_softcap", "final_logit_softcap", "z_loss")
    if not any(r.config.get(key) for r in study.runs for key in cures):
        return None
    rows = []
    for label, batch, lr, seeds in every_lr(study, best):
        log_z = summary([r.final("output/log_z") for r in seeds])
        rows.append([label, batch, lr, peak_final(seeds, layer_max("max_logit")),
                     peak_final(seeds, layer_max("max_logit_capped")),
                     peak_final(seeds, logged("output/max_abs_logit")),
                     peak_final(seeds, logged("output/max_abs_logit_capped")), f"{log_z.mean:.3g}" if log_z.n else "-"])
    return table(["point", "batch", "lr", "max attention logit", "capped", "largest output logit (absolute)", "capped",
                  "final log Z"], rows)


def second_moment_table(study: Study, best: dict) -> str | None:
    """Where some run logged its optimizer's second moment (training/instruments.SecondMoment): per
    point, batch and lr, its largest element and its l2 norm beside the max attention logit (the
    largest layer), peak / final, means over seeds: the sequence-length warmup paper's signal of a
    spike beside the logit's."""
    if not any(r.keys("second_moment/") for r in study.runs):
        return None
    rows = [[label, batch, lr, peak_final(seeds, logged("second_moment/max")),
             peak_final(seeds, logged("second_moment/l2")), peak_final(seeds, layer_max("max_logit"))]
            for label, batch, lr, seeds in every_lr(study, best)]
    return table(["point", "batch", "lr", "largest element of v", "l2 norm of v", "max attention logit"], rows)


def seq_len_warmup_table(study: Study, best: dict) -> str | None:
    """Where some run warmed its sequence length up (training/seq_len_warmup.py): per point at its
    selected lr, the steps, the tokens trained and the tokens read (a truncated sequence's rest is
    read, not trained), means over seeds."""
    if not any(r.config.get("seq_len_warmup_start") for r in study.runs):
        return None
    rows = []
    for (label, batch), selection in best.items():
        trained = summary([r.final("tokens") for r in selection.runs]).mean
        read = summary([r.final("batch/tokens_read") or r.final("tokens") for r in selection.runs]).mean
        steps = summary([r.total_steps for r in selection.runs]).mean
        rows.append([label, str(batch), f"{selection.lr:g}", f"{steps:,.0f}", f"{trained:,.0f}", f"{read:,.0f}",
                     f"{1 - trained / read:.1%}"])
    return table(["point", "batch", "lr", "steps", "tokens trained", "tokens read", "read, not trained"], rows)


def target_table(best: dict, target: float, key: str) -> str:
    rows = []
    for (label, batch), selection in best.items():
        steps = [r.steps_to(key, target) for r in selection.runs]
        reached = [s for s in steps if s is not None]
        if not reached:
            rows.append([label, str(batch), "not reached", "-"])
            continue
        mean_steps = sum(reached) / len(reached)
        note = "" if len(reached) == len(steps) else f" ({len(reached)} of {len(steps)} seeds)"
        rows.append([label, str(batch), f"{mean_steps:.1f}{note}",
                     f"{selection.runs[0].tokens_at(mean_steps):,.0f}"])
    return table(["point", "batch", "steps", "tokens"], rows)


# What a batch ramp and its constant-batch controls may differ in beside the lr and the seeds: the
# batch and what follows it, and the decays (a control may hold them at their half-life in tokens).
RAMP_KEYS = {"batch_size", "batch_schedule", "warmup_steps", "warmup_tokens", *BATCH_DECAY_KEYS}


@dataclass
class Ramp:
    """A batch ramp and its arms: {name: seeds}, the constant small batch (the ramp's first), the
    ramp, the constant large batch (its last) and any other control (its decays named)."""

    phases: list[list[int]]
    arms: dict[str, list[Run]]

    @property
    def label(self) -> str:
        return self.arms["ramp"][0].optimizer_label

    @property
    def controls(self) -> list[str]:
        return [name for name in self.arms if name != "ramp"]


def control_name(run: Run, ramp: Run, first: int, last: int) -> str:
    """"constant small" or "constant large" (``run``'s batch, the ramp's ``first`` or ``last``), and how
    its decays differ from the ramp's: ", half-life decays" where each is the ramp's ** (B / first),
    its half-life in tokens held (Marek et al.), else their values."""
    name = "constant small" if run.batch_size == first else "constant large"
    mine, theirs = dict(run.point), dict(ramp.point)
    differing = {key.removeprefix("optimizer_options."): (mine.get(key), theirs.get(key)) for key in BATCH_DECAY_KEYS
                 if mine.get(key) != theirs.get(key)}
    if not differing:
        return name
    ratio = run.batch_size / first
    if all(None not in pair and math.isclose(pair[0], pair[1] ** ratio, rel_tol=1e-9) for pair in differing.values()):
        return f"{name}, half-life decays"
    return name + "".join(f", {key}={value}" for key, (value, _) in differing.items())


def ramps_of(runs: list[Run]) -> list[Ramp]:
    """Each batch ramp (runs with a ``batch_schedule``) with its controls: the runs that differ from
    it only by a constant batch (its first or its last), their decays, the lr, warmup and seeds."""
    def arm_key(run: Run) -> tuple:
        return tuple(item for item in run.point if item[0] not in RAMP_KEYS)
    by_point: dict[tuple, list[Run]] = {}
    for run in runs:
        if run.config.get("batch_schedule"):
            by_point.setdefault(run.point, []).append(run)
    found = []
    for members in by_point.values():
        phases, key = members[0].config["batch_schedule"], arm_key(members[0])
        first, last = phases[0][1], phases[-1][1]
        controls: dict[str, list[Run]] = {}
        for run in runs:
            if not run.config.get("batch_schedule") and arm_key(run) == key and run.batch_size in (first, last):
                controls.setdefault(control_name(run, members[0], first, last), []).append(run)
        order = ["constant small", "ramp", "constant large", *sorted(set(controls) - {"constant small",
                                                                                     "constant large"})]
        arms = {name: members if name == "ramp" else controls[name] for name in order
                if name == "ramp" or name in controls}
        found.append(Ramp(phases, arms))
    return found


def parent_measurements(ramp: Ramp, measured: dict) -> list[cbs.Measurement]:
    """The CBS measured on the ramp's constant small batch (the run of it that holds branches), []
    if none was."""
    return next((measured[r.folder] for r in ramp.arms.get("constant small", []) if measured.get(r.folder)), [])


def ramp_table(ramps: list[Ramp], report_on: str, measured: dict) -> str | None:
    """Each batch ramp beside its controls (Merrill et al.'s Table 1): the optimizer steps, the
    steps saved against the small batch, the final ``report_on`` and its difference from each
    control's, paired by seed; for the ramp, the share of its tokens it trained above both its first
    batch and the B* last measured on its small batch (``measured``: cbs.measured_runs)."""
    controls = list(dict.fromkeys(name for ramp in ramps for name in ramp.controls))
    rows = []
    for ramp in ramps:
        small = ramp.arms.get("constant small", [])
        small_steps = summary([r.last_step for r in small]).mean
        measurements = parent_measurements(ramp, measured)
        for name, arm in ramp.arms.items():
            steps = summary([r.last_step for r in arm]).mean
            if name == "ramp":
                batch = " -> ".join([str(ramp.phases[0][1]), *(f"{b} (at {tokens:,} tokens)"
                                                                 for tokens, b in ramp.phases[1:])])
                above = (f"{cbs.tokens_above(measurements, ramp.phases, arm[0].config['max_tokens']):.0%}"
                         if measurements and arm[0].config.get("max_tokens") else "-")
            else:
                batch, above = str(arm[0].batch_size), "-"
            rows.append([ramp.label, name, batch, f"{steps:,.0f}", f"{1 - steps / small_steps:.0%}" if small else "-",
                         _mean([r.final(report_on) for r in arm]),
                         *(_difference(paired(arm, ramp.arms[c], report_on)) if c in ramp.arms and c != name
                           else "-" for c in controls), above])
    if not rows:
        return None
    return table(["point", "arm", "batch (sequences)", "steps", "steps saved", f"final {report_on}",
                  *(f"Δ vs {c}, paired by seed [95%]" for c in controls), "tokens above the measured B*"], rows)


def mean_steps_to(runs: list[Run], key: str, target: float) -> float | None:
    """The step at which the seeds' mean ``key`` (at the steps every seed logged it) first reaches
    ``target``, interpolated between them (Run.steps_to); None if it never does. The mean is
    summary's, so that the mean of the final losses, as a target, is the curve's last point exactly."""
    logged = [dict(zip(*run.series(key))) for run in runs]
    steps = sorted(set.intersection(*(set(values) for values in logged)))
    mean = Run(runs[0].folder, runs[0].config,
               [{"step": step, key: summary([values[step] for values in logged]).mean} for step in steps])
    return mean.steps_to(key, target)


def equal_loss_table(ramps: list[Ramp], report_on: str) -> str | None:
    """Per ramp, the steps and tokens each arm needs to reach two losses on its seeds' mean
    ``report_on`` curve (interpolated between evaluations): the constant small batch's final loss
    (the ramp's promise: the small batch's loss in fewer steps) and the highest final loss among
    the arms (which each reaches), the steps saved against the small batch's to the same loss."""
    rows = []
    for ramp in ramps:
        if "constant small" not in ramp.arms:
            continue
        finals = {name: summary([r.final(report_on) for r in arm]).mean for name, arm in ramp.arms.items()}
        for target, what in ((finals["constant small"], "the constant small batch's final"),
                             (max(finals.values()), "the highest final of the arms")):
            small = mean_steps_to(ramp.arms["constant small"], report_on, target)
            for name, arm in ramp.arms.items():
                steps = mean_steps_to(arm, report_on, target)
                reached = steps is not None
                rows.append([ramp.label, f"{target:.3f} ({what})", name,
                             f"{steps:,.0f}" if reached else f"not reached (final {finals[name]:.3f})",
                             f"{1 - steps / small:.0%}" if reached and small else "-",
                             f"{arm[0].tokens_at(steps):,.0f}" if reached else "-"])
    if not rows:
        return None
    return table(["point", f"{report_on} to reach", "arm", "steps", "steps saved", "tokens"], rows)


def ramp_plan_table(ramps: list[Ramp], measured: dict) -> str | None:
    """Per ramp, the CBS measured on its constant small batch at each checkpoint branched (B* by the
    paper's rule, and over k >= 1 only), the batch the rule had reached before it, whether it doubles
    there (B* >= 2 x that batch: cbs.ramp), and the ramp's batch from there as it ran."""
    rows = []
    for ramp in ramps:
        measurements = parent_measurements(ramp, measured)
        planned = cbs.ramp(measurements, ramp.phases[0][1])
        for m in measurements:
            before, after = cbs.batch_at(planned, m.tokens - 1), cbs.batch_at(planned, m.tokens)
            tried = sorted(m.losses)  # (a B* at either end of the multipliers tried is a bound)
            rows.append([ramp.label, str(m.step), f"{m.tokens:,}", cbs.b_star(m.k_epsilon, m.batch, tried),
                         cbs.b_star(m.k_epsilon_from_one, m.batch, [k for k in tried if k >= 1]), str(before),
                         f"yes, to {after}" if after > before else "no",
                         str(cbs.batch_at(ramp.phases, m.tokens))])
    if not rows:
        return None
    return table(["point", "step", "tokens", "B* (the small batch's)", "B* over k >= 1", "the rule's batch before",
                  "B* >= 2 x it: doubles", "the ramp's batch from there (as run)"], rows)


def zero_shot_average(run: Run) -> float | None:
    """The mean accuracy over the zero-shot tasks that report one (``zero_shot/<task>/acc``)."""
    values = [run.final(k) for k in run.keys("zero_shot/") if k.endswith("/acc")]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def zero_shot_table(best: dict) -> str | None:
    keys = sorted({k for s in best.values() for r in s.runs for k in r.keys("zero_shot/")})
    if not keys:
        return None
    rows = [[label, str(batch), _mean([zero_shot_average(r) for r in s.runs]),
             *(_mean([r.final(k) for r in s.runs]) for k in keys)] for (label, batch), s in best.items()]
    return table(["point", "batch", "average acc", *(k.removeprefix("zero_shot/") for k in keys)], rows)


def hessian_table(best: dict) -> str | None:
    rows = [[label, str(batch), _mean([r.hessian["top_eigenvalue"] for r in s.runs if r.hessian], 2),
             _mean([r.hessian["trace"] for r in s.runs if r.hessian], 1)]
            for (label, batch), s in best.items() if any(r.hessian for r in s.runs)]
    return table(["point", "batch", "top eigenvalue", "trace"], rows) if rows else None


# The small-batch section (scripts/mini_study.py --preset small_batch): the claims of Marek et al.
# 2025 on this axis, each in a table; in a report of runs that reach a batch of one sequence, or asked for.
LR_MARGIN = 0.01  # an lr is near the best where its loss is within 1% of the best's


def optimizer_reference(best: dict, label: str) -> tuple[str, int]:
    """The point ``label`` is held against at the largest batch: its plain optimizer's (the same
    other keys, no ablation or decays by half-life: AdamW with fixed betas for AdamW with beta2 by
    half-life) where the runs hold it, else its own, at the largest batch it reached."""
    run = next(selection.runs[0] for (name, _), selection in best.items() if name == label)
    plain = run.config["optimizer"] + label.removeprefix(run.optimizer_label)
    reference = plain if any(name == plain for name, _ in best) else label
    return reference, max(batch for name, batch in best if name == reference)


def largest_batch_table(best: dict, report_on: str) -> str | None:
    """Each point against its optimizer's largest batch (``optimizer_reference``), paired by seed:
    what every token of a smaller batch buys at the same token budget."""
    rows = []
    for (label, batch), selection in best.items():
        reference = optimizer_reference(best, label)
        if reference == (label, batch):
            continue
        rows.append([label, str(batch), _mean(selected_finals(selection, report_on)),
                     f"{reference[0]}, batch {reference[1]}",
                     _difference(paired(selection.runs, best[reference].runs, report_on))])
    if not rows:
        return None
    return table(["point", "batch", f"final {report_on}", "against", "Δ, paired by seed [95%]"], rows)


def same_batch_table(best: dict, report_on: str, optimizer: str = "adamw") -> str | None:
    """Each point against every point of ``optimizer`` at the same batch (a column each: AdamW with
    fixed betas and with beta2 by half-life), paired by seed."""
    references = sorted({label for (label, _), s in best.items() if s.runs[0].config["optimizer"] == optimizer})
    rows = []
    for (label, batch), selection in best.items():
        cells = [_difference(paired(selection.runs, best[(reference, batch)].runs, report_on))
                 if (reference, batch) in best and reference != label else "-" for reference in references]
        if any(cell != "-" for cell in cells):
            rows.append([label, str(batch), *cells])
    if not rows:
        return None
    return table(["point", "batch", *(f"Δ vs {reference}, paired by seed [95%]" for reference in references)], rows)


def lr_range(by_lr: dict[float, list[Run]], key: str, margin: float = LR_MARGIN) -> dict | None:
    """Seed 0's final ``key`` at every lr of a point's grid (the seed every lr has): the best lr, the
    lrs next to it whose loss is within ``margin`` (relative) of the best's, one unbroken run of the
    grid (an lr whose seed 0 did not finish breaks it), and the width of that range (largest / smallest
    lr), also with the loss interpolated linearly in log lr between the grid's lrs to the margin;
    ``open``: the range reaches the grid's first or last lr, so the width may be larger. None where
    seed 0 finished at no lr."""
    lrs = list(by_lr)
    losses = [next((r.final(key) for r in runs if r.seed == 0 and r.finished), None) for runs in by_lr.values()]
    finite = [i for i, loss in enumerate(losses) if loss is not None and math.isfinite(loss)]
    if not finite:
        return None
    best = min(finite, key=lambda i: losses[i])
    threshold = losses[best] * (1 + margin)
    near = lambda i: 0 <= i < len(lrs) and losses[i] is not None and losses[i] <= threshold  # noqa: E731
    low, high = best, best
    while near(low - 1):
        low -= 1
    while near(high + 1):
        high += 1

    def crossing(inside: int, outside: int) -> float:
        """The lr between two neighbours of the grid where the interpolated loss reaches the threshold."""
        if losses[outside] is None or not math.isfinite(losses[outside]):
            return lrs[inside]  # (a diverged neighbour: nothing to interpolate to)
        a, b = math.log(lrs[inside]), math.log(lrs[outside])
        return math.exp(a + (b - a) * (threshold - losses[inside]) / (losses[outside] - losses[inside]))

    interpolated_low = crossing(low, low - 1) if low > 0 else lrs[low]
    interpolated_high = crossing(high, high + 1) if high < len(lrs) - 1 else lrs[high]
    return {"best": lrs[best], "loss": losses[best], "near": lrs[low:high + 1], "width": lrs[high] / lrs[low],
            "interpolated": interpolated_high / interpolated_low, "open": low == 0 or high == len(lrs) - 1}


def lr_range_table(study: Study, margin: float = LR_MARGIN) -> str | None:
    """Per point, how wide the range of good lrs is (``lr_range``, on the metric lrs are chosen on)."""
    rows = []
    for (label, batch), by_lr in study.points().items():
        found = lr_range(by_lr, study.select_on, margin)
        if found is None:
            continue
        at_least = "≥ " if found["open"] else ""
        rows.append([label, str(batch), str(len(by_lr)), f"{found['best']:g} ({found['loss']:.3f})",
                     ", ".join(f"{lr:g}" for lr in found["near"]), f"{at_least}{found['width']:.3g}",
                     f"{at_least}{found['interpolated']:.3g}"])
    if not rows:
        return None
    return table(["point", "batch", "lrs in the grid", f"best lr (seed 0's final {study.select_on})",
                  f"lrs within {margin:.0%} of it", "width (largest / smallest)",
                  "width, interpolated in log lr"], rows)


def training_seconds(run: Run) -> tuple[float, int, int] | None:
    """(The run's wall time to its last log step, the tokens and the steps trained by then), from
    its logged ``tokens_per_s`` (each the tokens since the last log step over the seconds since:
    evaluations and instruments included); None if it logged none."""
    seconds, tokens, steps = 0.0, 0, 0
    for record in run.records:
        if record.get("tokens_per_s") and "tokens" in record and "step" in record:
            seconds += (record["tokens"] - tokens) / record["tokens_per_s"]
            tokens, steps = record["tokens"], record["step"]
    return (seconds, tokens, steps) if tokens else None


def wall_time_table(study: Study) -> str:
    """Per point, what a token costs in wall time on the machine that trained it: the micro-batch
    and the micro-steps accumulated into a step, the optimizer steps, and the median over the
    point's finished runs (every lr and seed) of the seconds per million tokens and per step."""
    rows = []
    for (label, batch), by_lr in study.points().items():
        done = [r for runs in by_lr.values() for r in runs if r.finished]
        measured = [(timed, r) for r in done if (timed := training_seconds(r))]
        if not measured:
            continue
        run = measured[0][1]
        micro = run.config.get("micro_batch_size", batch)
        per_million = statistics.median(1e6 * seconds / tokens for (seconds, tokens, _), _ in measured)
        per_step = statistics.median(seconds / steps for (seconds, _, steps), _ in measured)
        rows.append([label, str(batch), f"{micro} x {batch // micro}", f"{run.total_steps:,}", f"{per_million:.1f}",
                     f"{1e3 * per_step:.2f}", str(len(measured))])
    return table(["point", "batch", "micro-batch x micro-steps", "steps", "seconds per million tokens (median)",
                  "ms per step (median)", "runs"], rows)


def reaches_one_sequence(runs: list[Run]) -> bool:
    """Whether ``runs`` hold a batch of one sequence: the small-batch section and figure are theirs
    unless asked otherwise (so an archive of them gives them as the preset that ran them did)."""
    return any(run.batch_size == 1 for run in runs)


def small_batch_sections(study: Study, best: dict, report_on: str) -> list[str]:
    """The small-batch section's headings and tables (Marek et al. 2025's four claims)."""
    sections = []
    for title, body in (
            (f"## Small batches: each point against its optimizer's largest batch ({report_on}, the same tokens)",
             largest_batch_table(best, report_on)),
            (f"## Small batches: against AdamW at the same batch ({report_on})", same_batch_table(best, report_on)),
            (f"## Small batches: the range of good lrs (seed 0's final {study.select_on} within {LR_MARGIN:.0%} of "
             f"the grid's best; ≥: the range reaches the grid's edge)", lr_range_table(study)),
            ("## Small batches: wall time per token (the runs' logged tokens_per_s, evaluations included, on the "
             "machine that trained them, under whatever else it ran)", wall_time_table(study))):
        if body:
            sections += [title, body]
    return sections


def report(runs: list[Run], target: float | None, select_on: str = "val/loss", report_on: str | None = None,
           branches: list[Run] = (), epsilon: float = 0.01, ema: float = 0.5,
           small_batch: bool | None = None) -> str:
    """The report of ``runs``: the lr of each point chosen on ``select_on``, the numbers reported
    on ``report_on`` (default the same; e.g. a held-out split's loss); with the ``branches`` of
    some of them (or among ``runs``), their critical batch sizes (study/cbs.py's rule: ``epsilon``,
    ``ema``); and the small-batch section (``small_batch_sections``) where ``small_batch`` says so,
    by default where the runs reach a batch of one sequence (``reaches_one_sequence``)."""
    branches = [*branches, *(r for r in runs if is_branch(r))]
    runs = [r for r in runs if not is_branch(r)]
    report_on = report_on or select_on
    study = Study(runs, select_on)
    best = study.best()
    title = f"# Study report: {len(runs)} runs, {len(study.points())} points"
    if not best:
        return f"{title}\n\nNo point has an lr all of whose seeds finished.\n\n{unfinished_note(study)}\n"
    if target is None:
        target = max(summary(selected_finals(s, report_on)).mean for s in best.values())
    where = f"selected on {select_on}, reported on {report_on}"
    with_batch = "".join(
        f" {key} goes with the batch ({', '.join(f'batch {b}: {v}' for b, v in values)})."
        for key, values in batch_values(study).items())
    with_batch += "".join(
        f" {key} goes with the optimizer ({', '.join(f'{o}: {v}' for o, v in values)})."
        for key, values in optimizer_values(study).items())
    sections = [title,
                f"Each point's lr is the one with the lowest mean final {select_on} among those all of whose "
                f"seeds finished. Cells: mean ± std [±95% interval half-width] over seeds.{with_batch}",
                f"## Final {report_on} (best lr per point; {where})", loss_table(study, best, report_on)]
    for optimizer in REFERENCES:
        comparison = comparison_table(best, report_on, optimizer)
        if comparison:
            sections += [f"## Against {optimizer} ({report_on})", comparison]
    if reaches_one_sequence(runs) if small_batch is None else small_batch:
        sections += small_batch_sections(study, best, report_on)
    sections += ["## Every lr of the grid", grid_table(study),
                 *filter(None, [unfinished_note(study), effective_batch_note(study), replica_groups_note(study)]),
                 "## Max attention logit per layer, every lr (peak / final, mean over seeds)",
                 max_logit_table(study, best)]
    for title, body in (("## Logits raw and soft-capped, and log Z, every lr (largest layer; peak / final, mean over "
                         "seeds)", logit_cure_table(study, best)),
                        ("## The second moment and the max attention logit, every lr (v: Adam's exp_avg_sq, over "
                         "all parameters; the logit's largest layer; peak / final, mean over seeds)",
                         second_moment_table(study, best)),
                        ("## Sequence-length warmup: the tokens trained and read (selected lr, mean over seeds)",
                         seq_len_warmup_table(study, best))):
        if body:
            sections += [title, body]
    sections += [f"## Steps and tokens to {report_on} {target:.3f} (interpolated between evaluations, mean over "
                 f"seeds)", target_table(best, target, report_on)]
    measured = cbs.measured_runs([*runs, *branches], epsilon, ema)
    ramps = ramps_of(runs)
    for title, body in ((f"## Batch ramps against constant batches ({report_on})",
                         ramp_table(ramps, report_on, measured)),
                        (f"## Batch ramps: steps and tokens to equal {report_on} (the seeds' mean curve, interpolated "
                         f"between evaluations)", equal_loss_table(ramps, report_on)),
                        ("## Batch ramps as planned: the critical batch measured on the small batch at each checkpoint",
                         ramp_plan_table(ramps, measured))):
        if body:
            sections += [title, body]
    for title, body in (("## Zero-shot", zero_shot_table(best)), ("## Hessian", hessian_table(best))):
        if body:
            sections += [title, body]
    by_folder = {run.folder: run for run in runs}
    for folder, measurements in measured.items():
        if measurements:
            parent = by_folder[folder]
            sections += [f"## Critical batch size by branching: {parent.optimizer_label}, batch "
                         f"{measurements[0].batch}, {folder.name}", cbs.table(measurements, epsilon)]
    return "\n\n".join(sections) + "\n"


# A block of a page (README.md, docs/*.md) that holds one of a report's tables:
# <!-- report: ARCHIVE [SELECT_ON REPORT_ON], SECTION -->
# A block's body is its lines up to its own end marker; an empty block (no lines) is a block too.
REPORT_BLOCK = re.compile(r"<!-- report: (\S+)(?: (\S+) (\S+))?, (.+?) -->\n((?:(?!<!-- ).*\n)*?)<!-- end -->")


def first_table(text: str, heading: str) -> str:
    """The first markdown table after the line of ``text`` starting with ``heading``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return "\n".join(rows)


def fill_blocks(document: str, archive: str, text: str) -> str:
    """``document`` with every block of ``archive`` holding its section's table from ``text`` (the
    archive's report)."""
    def table_of(match: re.Match) -> str:
        if match.group(1) != archive:
            return match.group(0)
        head = match.group(0).split("\n", 1)[0]
        return f"{head}\n{first_table(text, match.group(4))}\n<!-- end -->"
    return REPORT_BLOCK.sub(table_of, document)
