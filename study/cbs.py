"""The critical batch size by branching (Merrill, Arora, Groeneveld, Hajishirzi, "Critical Batch
Size Revisited", arXiv 2505.23971, 2025): docs/batch.md, "The critical batch size".

From a checkpoint of a run at batch B, a branch trains ``branch_tokens`` more tokens at batch k x B
with the lr times f(k) (sqrt by default), on the parent's lr schedule in tokens; its training loss
is smoothed by an EMA (s_t = a loss_t + (1 - a) s_{t-1}, a = 0.5); k* is the largest multiplier
whose smoothed final loss keeps up with every smaller one's (L_k <= L_j + epsilon for all j < k),
and B* = k* x B is the critical batch there. With several seeds (seed s reads the stream from s x
branch_tokens past the parent's position, so the multipliers of one seed see the same tokens) the
differences L_k - L_j are paired by seed, and a second rule reads their 95% interval: k falls
behind j when the whole interval lies above epsilon. Both rules compare k with every smaller
multiplier of K, the fractions included (the paper's rule); the table also gives k* over k >= 1
only, since the fractions' branches (many small steps) are the noisiest references and pull k* down.

**A branch is at least as long as its optimizer's memory.** A branch at k != 1 starts from the
parent's optimizer state, averaged at batch B, and its averages forget it over 1 / (1 - beta)
steps (beta2 0.95: 20 steps); a branch shorter than that ends inside that transient, and its loss
measures the state's adjustment to the new batch, not the batch. So ``plan`` refuses a branch at
k != 1 with fewer steps than the memory of any decay it trains with (Adam's beta1 and beta2,
Muon's momentum, after any half-life scaling: beta ** k), naming the branch, its steps, the decay
and the fixes (more branch tokens, smaller multipliers, or the decays at their half-life in
tokens, which shortens their memory at a larger batch). A refusal, not a warning: the branches
train for minutes to hours before the table says anything, a warning among their logs goes unread,
and the table cannot say afterwards that a k* came from a transient. The k = 1 branch is the
parent's own continuation (nothing changed for its state to adjust to), so it is exempt.

The ramp (``ramp``, Merrill et al.'s batch warmup) is planned from the parent's measurements at
every checkpoint branched, in turn: at each, the batch doubles when B* >= 2 x the ramp's batch
there. It never halves: where the measured B* falls back below the ramp's batch the ramp runs above
it, and ``tokens_above`` says over how many of its tokens.

Each branch is a run folder, RUN/branches/step_<step>/k<k>_s<seed>, that starts from a copy of the
parent's checkpoint (its loader position moved by the seed's offset) and resumes it with the
branch's settings as allowed changes (docs/checkpoints.md: the changes are recorded in the branch's
record), so it is resumable as any run and its config file (branch.py) trains it anywhere.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

import optim
from atomic import atomic_write
from configs import SCALINGS, ConfigError, TrainConfig, load_config
from study.runs import BRANCH_FILE, BRANCHES, Run, Summary, is_branch, read_records, summary
from study.sweep import ROOT
from training.batch_schedule import BatchSchedule, decay_of, followed_decays, half_life_betas
from training.checkpoint import NUMBERED, RECORDED, Checkpoint, numbered, save_in

BRANCH_FOLDER = re.compile(r"k([0-9.e+-]+)_s(\d+)")  # a branch's folder: k<multiplier>_s<seed>
NEVER = 10 ** 12  # an interval no branch reaches (validation, zero-shot: a branch measures its training loss)


@dataclass
class Branch:
    step: int  # the parent checkpoint's
    multiplier: float  # k
    seed: int
    config: TrainConfig  # resolved: what the branch trains with
    folder: Path
    parent_batch: int  # B, the parent's batch at the checkpoint

    @property
    def file(self) -> Path:
        return self.folder / BRANCH_FILE

    @property
    def name(self) -> str:
        return f"step {self.step} k {self.multiplier:g} seed {self.seed}"

    def status(self) -> str:
        """"finished" (its training loss of its last step is logged), "diverged" (it stopped on a
        non-finite gradient: done, it fell behind), "at step N", or "new"."""
        done = ending(self.records(), self.config.stop_at_step)
        if done:
            return done
        checkpoints = [int(NUMBERED.fullmatch(p.name).group(1)) for p in numbered(self.folder)]
        return f"at step {max(checkpoints)}" if checkpoints and max(checkpoints) > self.step else "new"

    def records(self) -> list[dict]:
        return read_records(self.folder / "metrics.jsonl")


def branch_name(multiplier: float, seed: int) -> str:
    return f"k{multiplier:g}_s{seed}"


def plan(run_dir: Path, steps: list[int] | None, multipliers: list[float], branch_tokens: int, lr_scaling: str,
         betas: tuple[str, ...] | None, seeds: list[int], world_size: int = 1) -> list[Branch]:
    """The branches of ``run_dir``'s checkpoints at ``steps`` (None: every numbered one that leaves
    ``branch_tokens`` of the run), each a resolved config (nothing is written); ``betas``: the decays
    a branch at k x B holds at their half-life in tokens (beta ** k), None: the parent's own rule (its
    batch_half_life_betas), recorded in each branch's batch_half_life_betas; a multiplier whose
    batch is not whole or does not divide over ``world_size`` ranks, branch tokens that are not whole
    steps of every branch, or a checkpoint too near the run's end, refused."""
    from training.run_config import resolve_config  # (the optimizer registry: only where branches are planned)
    available = {int(NUMBERED.fullmatch(p.name).group(1)): p for p in numbered(run_dir)}
    if not available:
        raise ConfigError(f"{run_dir} holds no numbered checkpoint (ckpt_<step>.pt) to branch from: train it with "
                          f"permanent_checkpoint_interval (or checkpoint_interval and keep_checkpoints) set")
    chosen = sorted(available) if steps is None else steps
    missing = [s for s in chosen if s not in available]
    if missing:
        raise ConfigError(f"{run_dir} has no checkpoint of step {', '.join(map(str, missing))}; its checkpoints are "
                          f"of steps {', '.join(map(str, sorted(available)))}")
    branches, too_late = [], []
    for step in chosen:
        checkpoint = Checkpoint.load(available[step])
        if checkpoint.tensors != "inline":
            raise ConfigError(f"{available[step]} is a sharded (FSDP2) checkpoint: branching copies whole-model "
                              f"checkpoints only; resume the run without fsdp to write one")
        parent = TrainConfig(**checkpoint.config)
        block = checkpoint.model_args["block_size"]
        schedule = BatchSchedule.of(parent, block, BatchSchedule.recorded(checkpoint.batch_phases), step)
        total, warmup = schedule.lengths(parent)
        lr = schedule.lr_schedule(parent, total, warmup)
        if checkpoint.tokens + branch_tokens > lr.total:
            only = (": it is the run's only checkpoint; train the run with permanent_checkpoint_interval set (a "
                    "checkpoint kept every that many steps) to branch from within it") if len(available) == 1 else ""
            too_late.append(ConfigError(f"the checkpoint of step {step} ({checkpoint.tokens:,} tokens) leaves fewer "
                                        f"than --branch-tokens {branch_tokens:,} of the run's {lr.total:,}{only}"))
            if steps is None:  # (every checkpoint: those near the end, the final one at least, are left out)
                continue
            raise too_late[-1]
        batch = schedule.phase(step).batch
        scale = SCALINGS[parent.batch_lr_scaling](schedule.ratio(step))  # a scheduled parent's lr there
        # ... and its decays there (its batch_half_life_betas', at its phase's batch): each branch's from
        # these, so that the k = 1 branch continues the parent.
        decays = half_life_betas(parent, schedule.ratio(step), followed_decays(parent))
        at_step = dataclasses.replace(parent, **decays)
        scaled = followed_decays(parent) if betas is None else tuple(betas)  # (the branch follows the parent's rule)
        for multiplier in multipliers:
            if not float(multiplier * batch).is_integer() or multiplier * batch % world_size:
                raise ConfigError(f"multiplier {multiplier:g} of the batch {batch} at step {step} is "
                                  f"{multiplier * batch:g} sequences, not a whole number divisible by {world_size} "
                                  f"ranks: choose multipliers whose batches divide")
        whole = math.lcm(*(int(k * batch) * block for k in multipliers))  # tokens: whole steps of every branch
        for multiplier in multipliers:
            branch_batch = int(multiplier * batch)
            step_tokens = branch_batch * block
            if branch_tokens % step_tokens:
                raise ConfigError(f"--branch-tokens {branch_tokens} is not a whole number of steps of the branch "
                                  f"k={multiplier:g} ({branch_batch} x {block} = {step_tokens} tokens a step): use a "
                                  f"multiple of {whole:,}")
            factor = SCALINGS[lr_scaling](multiplier) * scale
            micro = math.gcd(parent.micro_batch_size, branch_batch // world_size)
            branch_steps = branch_tokens // step_tokens
            for seed in seeds:
                folder = run_dir / BRANCHES / f"step_{step:08d}" / branch_name(multiplier, seed)
                changes = dict(
                    batch_size=branch_batch, batch_schedule=[], micro_batch_size=micro, lr=parent.lr * factor,
                    min_lr=parent.min_lr * factor, max_steps=0, max_tokens=lr.total, warmup_steps=0,
                    warmup_tokens=lr.warmup, stop_at_step=step + branch_steps, log_interval=1, eval_interval=NEVER,
                    checkpoint_interval=max(1, branch_steps // 4), keep_checkpoints=1, permanent_checkpoint_interval=0,
                    zero_shot_tasks="", zero_shot_interval=0, sample_tokens=0, wandb_mode="disabled",
                    run_name=folder.name, out_dir=str(folder.parent), resume="auto", overwrite=False,
                    batch_half_life_betas=",".join(scaled), **{**decays, **half_life_betas(at_step, multiplier, scaled)})
                config = dataclasses.replace(parent, **changes)
                differing = sorted(key for key in RECORDED if getattr(config, key) != checkpoint.config.get(key))
                config = resolve_config(dataclasses.replace(config, allow_changes=",".join(differing))).config
                if multiplier != 1:  # (k = 1 continues the parent: no transient)
                    check_length(config, step, multiplier, branch_steps, scaled, whole)
                branches.append(Branch(step, multiplier, seed, config, folder, batch))
    if too_late and not branches:  # (every checkpoint was too near the end: the earliest says so)
        raise too_late[0]
    return branches


def decays(config: TrainConfig) -> dict[str, float]:
    """The decays the resolved ``config`` trains with, by name: each its optimizer declares
    (optim.batch_decays: beta1 and beta2 are the config's, the others its optimizer_options')."""
    values = {}
    for name, (key, index) in optim.batch_decays(config.optimizer).items():
        if key == "betas":
            values[name] = getattr(config, f"beta{index + 1}")
        elif key in config.optimizer_options:
            values[name] = decay_of(config.optimizer_options[key], index)
    return {name: value for name, value in values.items() if value is not None}


def memory(beta: float) -> float:
    """The steps a decay ``beta`` remembers, 1 / (1 - beta), rounded up to whole steps (a round
    memory stays itself: 1 / (1 - 0.95) is 19.999999999999982 in floats, 20 steps)."""
    return math.ceil(1 / (1 - beta) - 1e-9) if beta < 1 else math.inf


def check_length(config: TrainConfig, step: int, multiplier: float, steps: int, scaled: tuple[str, ...],
                 whole: int) -> None:
    """Refuse the branch at ``multiplier`` of ``step`` (its resolved ``config``, ``steps`` long)
    if a decay it trains with remembers more steps than it trains (the module's docstring says why);
    ``scaled``: the decays already at their half-life in tokens, ``whole``: the tokens that are a
    whole number of steps of every branch."""
    short = {name: beta for name, beta in decays(config).items() if memory(beta) > steps}
    if not short:
        return
    name, beta = max(short.items(), key=lambda item: item[1])
    step_tokens = config.batch_size * config.model_config(1).block_size
    tokens = math.ceil(memory(beta) * step_tokens / whole) * whole
    fixes = f"--branch-tokens {tokens:,} or more ({memory(beta)} steps of this branch), smaller multipliers"
    # The half-life raises each decay to the power k: a shorter memory above the parent's batch.
    if not set(short) & set(scaled) and all(memory(b ** multiplier) <= steps for b in short.values()):
        fixes += f", or --beta-scaling half-life --scale-betas {','.join([*scaled, *short])}"
    raise ConfigError(f"the branch k={multiplier:g} at step {step} trains {steps} step{'s' * (steps != 1)}, fewer "
                      f"than its {name} {beta:.4g} remembers (1 / (1 - {name}) = {memory(beta)} steps): its loss "
                      f"would measure the optimizer state's adjustment to the batch, not the batch. Give {fixes}")


def write(branches: list[Branch], run_dir: Path, command: str) -> None:
    """Each new branch's folder: its config (branch.py) and its start, the parent's checkpoint with
    the loader moved by the seed's offset; a branch already written is left as it is."""
    for branch in branches:
        if branch.file.is_file():
            continue
        branch.folder.mkdir(parents=True, exist_ok=True)
        if not numbered(branch.folder):
            checkpoint = Checkpoint.load(run_dir / f"ckpt_{branch.step:08d}.pt")
            offset = branch.seed * (branch.config.stop_at_step - branch.step) * branch.config.batch_size * \
                checkpoint.model_args["block_size"]
            checkpoint.train_loader = {**checkpoint.train_loader,
                                       "position": checkpoint.train_loader["position"] + offset}
            save_in(branch.folder, checkpoint)
        lines = [f"# Branch {branch.name} of {run_dir}: batch {branch.config.batch_size} = {branch.multiplier:g} x "
                 f"{branch.parent_batch}, from the parent's checkpoint at step {branch.step}.",
                 f"# Written by: {command}", ""]
        lines += [f"{field.name} = {getattr(branch.config, field.name)!r}" for field in dataclasses.fields(TrainConfig)]
        with atomic_write(branch.file, "w") as f:
            f.write("\n".join(lines) + "\n")


def check_written(branches: list[Branch]) -> None:
    """Refuse a plan whose branch a folder already holds with other settings (each named)."""
    for branch in branches:
        if branch.file.is_file():
            written, mine = load_config(str(branch.file)).to_dict(), branch.config.to_dict()
            differing = [f"{key}: written {written[key]!r}, now {mine[key]!r}" for key in mine
                         if written[key] != mine[key]]
            if differing:
                raise ConfigError(f"{branch.folder} holds the branch {branch.name} with other settings "
                                  f"({'; '.join(differing)}): give the command it was written with, or move "
                                  f"{branch.folder.parent.parent} away")


def launch_local(branches: list[Branch], nproc: int, main: Callable[[list[str]], object]) -> list[str]:
    """Train the unfinished branches one after another, each writing its output to BRANCH/train.log:
    in this process by ``main``, train.py's entry point (``train.main``, which the caller above the
    layers hands down: train.py sits above ``study``; in-process, each branch saves a new
    interpreter, the torch import and the C++ kernels' load), or under torchrun with ``nproc`` > 1.
    Returns the names of those that failed."""
    pending = [b for b in branches if b.status() not in ("finished", "diverged")]
    failed = []
    for branch in tqdm(pending, unit="branch", desc="branches"):
        with open(branch.folder / "train.log", "a") as log:
            if nproc > 1:
                command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", "train.py", str(branch.file)]
                ok = subprocess.run(command, cwd=ROOT, stdout=log, stderr=log).returncode == 0
            else:
                try:
                    with redirect_stdout(log), redirect_stderr(log):
                        main([str(branch.file)])
                    ok = True
                except SystemExit as exit:  # (train.py's clear errors)
                    print(exit.code, file=log)
                    ok = exit.code in (None, 0)
        if not ok:
            failed.append(branch.name)
            tqdm.write(f"{branch.name}: FAILED ({branch.folder / 'train.log'}; run the command again to retry it)")
    return failed


# --- the selection rule ---
def paired_difference(a: dict[int, float], b: dict[int, float]) -> Summary:
    """a - b over the seeds both have: mean, std and 95% interval."""
    return summary([a[seed] - b[seed] for seed in a if seed in b])


def smoothed_series(losses: list[float], ema: float = 0.5) -> list[float]:
    """The EMA s_t = ema x loss_t + (1 - ema) x s_{t-1}, from s_1 = loss_1, at every step."""
    series = [losses[0]]
    for loss in losses[1:]:
        series.append(ema * loss + (1 - ema) * series[-1])
    return series


def smoothed(losses: list[float], ema: float = 0.5) -> float:
    """The smoothed loss at the last step (smoothed_series)."""
    return smoothed_series(losses, ema)[-1]


def critical_multiplier(final: dict[float, float], epsilon: float) -> float:
    """The largest k whose loss keeps up with every smaller multiplier's: L_k <= L_j + epsilon for
    all j < k (Merrill et al.'s rule)."""
    return max(k for k in final if all(final[k] <= final[j] + epsilon for j in final if j < k))


def critical_multiplier_interval(final: dict[float, dict[int, float]], epsilon: float) -> float | None:
    """With seeds: the largest k that falls behind no smaller j, falling behind meaning the 95%
    interval of L_k - L_j (paired by seed) lies wholly above epsilon; None with fewer than 2 seeds."""
    def falls_behind(k, j):
        if any(math.isinf(loss) and math.isfinite(final[j].get(seed, math.inf)) for seed, loss in final[k].items()):
            return True  # (diverged where j did not)
        difference = paired_difference(final[k], final[j])
        return difference.mean - difference.ci95 > epsilon
    if min(len(seeds) for seeds in final.values()) < 2:
        return None
    return max(k for k in final if not any(falls_behind(k, j) for j in final if j < k))


@dataclass
class Measurement:
    step: int
    tokens: int
    batch: int
    losses: dict[float, dict[int, float]]  # {k: {seed: smoothed final loss}}
    k_epsilon: float  # the paper's rule on the seeds' mean
    k_interval: float | None  # the interval rule (None: one seed)
    k_epsilon_from_one: float | None  # the paper's rule over k >= 1 only (None: no such k)
    k_interval_from_one: float | None  # the interval rule over k >= 1 only
    b_simple: float | None  # the parent's live B_simple there, in sequences (None: not measured)
    differences: dict[float, Summary]  # L_k - L_1 over seeds (k = 1: the parent's batch)


def branch_of(run: Run) -> tuple[Path, int, float, int] | None:
    """(the parent's folder, the checkpoint's step, k, seed) of a branch's run folder
    (PARENT/branches/step_<step>/k<k>_s<seed>), None for any other run."""
    match = BRANCH_FOLDER.fullmatch(run.folder.name)
    if not (match and is_branch(run) and run.folder.parent.name.startswith("step_")):
        return None
    return run.folder.parent.parent.parent, int(run.folder.parent.name[5:]), float(match[1]), int(match[2])


def ending(records: list[dict], stop_at_step: int) -> str | None:
    """How a branch's records end: "finished" (the training loss of its last step is logged),
    "diverged" (train.py recorded a stop on a non-finite gradient), or None (not done)."""
    if any(r.get("step") == stop_at_step and "train/loss" in r for r in records):
        return "finished"
    return "diverged" if any("nonfinite" in r.get("event", {}) for r in records) else None


def branch_end(run: Run) -> int:
    """The step a branch's run stops at: its config file's stop_at_step (a run's config.json records
    no invocation flag; one written before that rule, as in the archives packed then, does)."""
    return run.config["stop_at_step"] if "stop_at_step" in run.config else run.branch_stop


def branch_losses(run: Run) -> list[float] | None:
    """A branch's training loss at each of its steps, None until it is done; [inf] if it diverged
    (nonfinite="stop" ended it): it fell behind every branch that did not."""
    done = ending(run.records, branch_end(run))
    if done != "finished":
        return [math.inf] if done else None
    step = branch_of(run)[1]
    return [r["train/loss"] for r in run.records if r.get("step", 0) > step and "train/loss" in r]


def measure(parent: Run, branches: list[Run], epsilon: float, ema: float) -> list[Measurement]:
    """The CBS at each checkpoint of ``parent`` whose ``branches`` (runs of branch_of) all finished."""
    by_step: dict[int, list[Run]] = {}
    for run in branches:
        by_step.setdefault(branch_of(run)[1], []).append(run)
    measurements = []
    for step, runs in sorted(by_step.items()):
        finals = [branch_losses(run) for run in runs]
        if any(losses is None for losses in finals):
            continue
        losses: dict[float, dict[int, float]] = {}
        for run, series in zip(runs, finals):
            _, _, k, seed = branch_of(run)
            losses.setdefault(k, {})[seed] = smoothed(series, ema)
        # The tokens and batch at the checkpoint, from a branch that logged its first step.
        logged_first = [(run, r) for run in runs for r in run.records if r.get("step") == step + 1 and "tokens" in r]
        if not logged_first:  # (every branch diverged before its first log)
            continue
        run, first = logged_first[0]
        k = branch_of(run)[2]
        config = TrainConfig(**{key: value for key, value in run.config.items() if key != "changes"})
        branch_batch = next((c["to"] for c in run.config.get("changes", []) if c["key"] == "batch_size"),
                            config.batch_size)
        block = config.model_config(1).block_size
        logged = [r for r in parent.records if r.get("step", 0) <= step and r.get("noise_scale/b_simple") is not None]
        means = {k: sum(v.values()) / len(v) for k, v in losses.items()}
        reference = 1.0 if 1.0 in losses else min(losses)
        from_one = {k: v for k, v in losses.items() if k >= 1}  # (the parent's batch and up)
        measurements.append(Measurement(
            step, first["tokens"] - branch_batch * block, round(branch_batch / k), losses,
            critical_multiplier(means, epsilon), critical_multiplier_interval(losses, epsilon),
            critical_multiplier({k: means[k] for k in from_one}, epsilon) if from_one else None,
            critical_multiplier_interval(from_one, epsilon) if from_one else None,
            logged[-1]["noise_scale/b_simple"] / block if logged else None,
            {k: paired_difference(v, losses[reference]) for k, v in sorted(losses.items())}))
    return measurements


def measured_runs(runs: list[Run], epsilon: float, ema: float) -> dict[Path, list[Measurement]]:
    """{run folder: its measurements} of every run among ``runs`` that has branches among them."""
    branches: dict[Path, list[Run]] = {}
    for run in runs:
        if is_branch(run):
            branches.setdefault(branch_of(run)[0], []).append(run)
    return {run.folder: measure(run, branches[run.folder], epsilon, ema) for run in runs if run.folder in branches}


def ramp(measurements: list[Measurement], batch: int, steps: list[int] = ()) -> list[tuple[int, int]]:
    """A batch schedule from ``batch`` that follows the measured CBS (Merrill et al.'s warmup): at
    each checkpoint in turn, the batch doubles from its tokens on where B* there (the paper's rule)
    is at least twice the batch the ramp has reached; once per checkpoint, never down. ``steps``:
    the checkpoints branched, each of which must have its measurement (the ramp is planned from
    every one: a ConfigError names those without)."""
    missing = sorted(set(steps) - {m.step for m in measurements})
    if missing:
        raise ConfigError(f"the ramp is planned from a measurement at every checkpoint branched; the checkpoints of "
                          f"step {', '.join(map(str, missing))} have none (their branches have not all finished: "
                          f"branch the parent again to train them)")
    phases = [(0, batch)]
    for m in measurements:
        if m.k_epsilon * m.batch >= 2 * phases[-1][1]:
            phases.append((m.tokens, 2 * phases[-1][1]))
    return phases


def batch_at(phases: list[tuple[int, int]], tokens: int) -> int:
    """The batch of the schedule ``phases`` at ``tokens`` (that of the last phase begun by then)."""
    return [batch for start, batch in phases if start <= tokens][-1]


def tokens_above(measurements: list[Measurement], phases: list[tuple[int, int]], total: int) -> float:
    """The fraction of a run's ``total`` tokens over which the schedule ``phases`` trained above both
    its first batch and the B* last measured (the paper's rule): where a doubling ran ahead of the
    measurement. (A phase is taken to begin at its token count; the run begins it at the first step
    at or after it.)"""
    bounds = sorted({m.tokens for m in measurements} | {start for start, _ in phases} | {total})
    above = 0
    for start, end in zip(bounds, bounds[1:]):
        measured = [m for m in measurements if m.tokens <= start]
        if measured and batch_at(phases, start) > max(phases[0][1], measured[-1].k_epsilon * measured[-1].batch):
            above += end - start
    return above / total


def b_star(k: float | None, batch: int, tried: list[float]) -> str:
    """B* = k x B as a table says it: at the smallest multiplier ``tried`` a bound, <= (a smaller one
    might have kept up too), at the largest, >= (a larger one might have); "-" where k is None."""
    if k is None:
        return "-"
    ends = len(tried) > 1  # (one multiplier, or none recorded: nothing to bound it by)
    bound = "<= " if ends and k == tried[0] else ">= " if ends and k == tried[-1] else ""
    return f"{bound}{k * batch:g}"


def table(measurements: list[Measurement], epsilon: float) -> str:
    """The markdown table of the CBS over training: per checkpoint k*, B* and the live B_simple."""
    seeds = max((len(s) for m in measurements for s in m.losses.values()), default=0)
    interval = seeds > 1
    header = ["step", "tokens", "batch B", f"k* (eps {epsilon:g})", "B*", "B* over k >= 1"]
    if interval:
        header += ["k* (95% interval)", "B* (interval)", "B* (interval) over k >= 1"]
    header += ["B_simple (sequences)", "L_k - L_1 by k"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    for m in measurements:
        tried = sorted(m.losses)
        from_one = [k for k in tried if k >= 1]
        row = [str(m.step), f"{m.tokens:,}", str(m.batch), f"{m.k_epsilon:g}", b_star(m.k_epsilon, m.batch, tried),
               b_star(m.k_epsilon_from_one, m.batch, from_one)]
        if interval:
            row += [f"{m.k_interval:g}", b_star(m.k_interval, m.batch, tried),
                    b_star(m.k_interval_from_one, m.batch, from_one)]
        row.append(f"{m.b_simple:.3g}" if m.b_simple is not None else "-")
        row.append(", ".join(f"{k:g}: diverged" if any(map(math.isinf, m.losses[k].values())) else
                             f"{k:g}: {d.mean:+.4f}" + (f" ±{d.ci95:.4f}" if d.n > 1 else "")
                             for k, d in m.differences.items()))
        lines.append("| " + " | ".join(row) + " |")
    rule = (f"k*: the largest multiplier k whose EMA-smoothed final training loss L_k keeps up with every smaller "
            f"multiplier's, L_k <= L_j + {epsilon:g} (Merrill et al.), on the mean over {seeds} seed(s)")
    if interval:
        rule += ("; k* (95% interval): the largest k that falls behind no smaller j, falling behind meaning the "
                 f"95% t-interval of L_k - L_j over the seeds (paired) lies wholly above {epsilon:g}")
    return ("\n".join(lines) + "\n\n" + rule + ". B* = k* x B; <= and >= mark a k* at the smallest or the "
            "largest multiplier its rule compared, where the branches bound B* only. Both compare k with every smaller multiplier, the "
            "fractions included (the paper's rule); \"over k >= 1\": the same rule over the multipliers from the "
            "parent's batch up only, without the fractions' noisier branches as references. B_simple: the run's "
            "live noise-scale estimate there.")


def save_json(measurements: list[Measurement], path: Path) -> None:
    with atomic_write(path, "w") as f:
        json.dump([{**dataclasses.asdict(m),
                    "differences": {k: dataclasses.asdict(d) for k, d in m.differences.items()}}
                   for m in measurements], f, indent=1)
