"""The critical batch size on a CPU, measured by branching, and a batch ramp that follows it.

    python -m scripts.cbs_study                                           # the study (times below)
    python -m scripts.cbs_study --archive docs/cbs_study/runs.tar.xz      # and the committed records
    python -m scripts.cbs_study --optimizers adamw,merit --seeds 1        # a smaller one

The mini-study's model and data (scripts/mini_study.py: a 4-layer, 64-dim GPT on Shakespeare
bytes, 1,048,576 training tokens a run) at its base batch of 8 sequences, below the critical batch
there, for AdamW, LAMB, MERIT and Muon, each at its best lr at batch 8 in the mini-study's
committed records (docs/mini_study/runs.tar.xz). Three stages:

1. **the parents**: each optimizer at batch 8, seeds 0 .. ``--seeds`` - 1 (initialisation and data
   order), seed 0 keeping a checkpoint every 64 steps;
2. **the branches** (scripts/cbs.py) from seed 0's checkpoints at ``STEPS`` (2,048 steps in all),
   at k = 1/4 .. 8 (``MULTIPLIERS``: batches 2 to 64), 81,920 tokens each (7.8% of the run: 640
   steps of the smallest, 20 of the largest), lr x sqrt(k), seeds 0 .. ``--seeds`` - 1 for the
   branches; two parents' branches at a time;
3. **the ramps** (AdamW and MERIT, ``RAMPED``): a batch schedule planned from seed 0's
   measurements at every checkpoint branched, in turn (study/cbs.ramp, Merrill et al.'s warmup):
   from 8, the batch doubles at a checkpoint where the measured B* (the paper's rule on the seeds'
   mean) is at least twice the batch the ramp has reached there, lr x sqrt(2) at each doubling
   (``batch_lr_scaling``), decays unchanged; against three controls on the same tokens: the
   constant small batch (the parents), the constant large batch (the ramp's last, its lr x
   sqrt(B / 8)) and that large batch with its decays at their half-life in tokens (beta1 and beta2
   ** (B / 8), Marek et al.: a large batch at the small batch's memory in tokens), ``--seeds``
   seeds each.

**Why these branches.** A branch must train at least as many steps as its optimizer's decays
remember, or it measures the state's transient after the batch change (study/cbs.py refuses it):
beta2 and Muon's momentum, 0.95, remember 1 / (1 - 0.95) = 20 steps. The study branched k = 1/4 ..
16 for 65,536 tokens before, whose k = 16 trained 8 steps. Two fixes keep the study's length: drop
k = 16 and lengthen the branches to 20 steps of k = 8 (chosen), or keep k = 16 with the decays at
their half-life (0.95 ** 16 = 0.44 remembers 2 steps). The half-life would measure the CBS of
another rule than the ramp runs (its lr x sqrt(2) keeps the decays), and at k = 16 with beta1 0.19
and beta2 0.44 an optimizer far from the parent's. Without k = 16 the largest B* measurable is 64
sequences (a k* of 8 says "64 or more"): the paper's rule never passed 64 in the study before (only
the interval rule reached k = 16), and 64 is 2 to 19 times the live B_simple there (3 to 36
sequences). Branch time grows about 10% (1,260 steps a checkpoint and seed against 1,016; the
tokens 6 x 81,920 against 7 x 65,536).

Writes OUT/ (default runs/cbs_study): a sweep folder per optimizer and arm (``small``, ``ramp``,
``large``, ``large_half_life``), the branches under seed 0's parent, ``report.md`` (scripts/report.py's
tables: the critical batch by branching per parent, the ramps against their controls paired by
seed, the steps each arm needs to equal losses, and the ramp's plan against the B* measured at
each checkpoint, read on heldout/loss) and ``figures/``. ``--archive`` packs the runs' configs and
metrics (the branches' metrics cut to what the measurement reads: step, tokens, train/loss, lr,
batch, a divergence) into an xz-compressed tar and writes, beside it, the report drawn from it
(ARCHIVE with .md for .tar.xz: docs/cbs_study/runs.md, what tests/test_doc_numbers.py compares)
and the critical batch's and the ramps' figures (``figures/``: cbs.png, cbs_branches.png,
ramps.png); scripts/report.py and scripts/plot.py draw the same from the archive. Rerunning skips
finished runs and branches and resumes interrupted ones.

**Time** (2 cores, 2 jobs): the study before these changes (24 runs, 420 branches) took 33.6
minutes; this one took 31.2 (2026-12-06): the 12 parents and 360 branches (5 checkpoints x 6
multipliers x 3 seeds x 4 optimizers), and no ramp, since the measured B* never reached 16 (a
ramp and its two large-batch controls would add 18 runs, about 7 minutes by the per-step costs
measured here: a step of b sequences about 20 + 3 b ms in one thread).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from atomic import atomic_write
from configs import ConfigError
from study import cbs, sweep
from study.mini_study import BASE, BLOCK, DATA, TOKENS, schedule
from study.plot import CBS_FIGURES, draw_all
from study.report import report
from study.runs import Study, find_runs, is_branch, pack_runs

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS = ("adamw", "lamb", "merit", "muon")
RAMPED = ("adamw", "merit")
BATCH = 8  # the base batch, below the critical batch in the mini-study (B_simple 700-2,200 tokens: 11-34 sequences)
STEPS = (64, 256, 512, 1024, 1536)  # the checkpoints branched (of 2,048 steps)
CHECKPOINT_EVERY = 64
MULTIPLIERS = (0.25, 0.5, 1, 2, 4, 8)
BRANCH_TOKENS = 20 * 8 * BATCH * 64  # 20 steps of k = 8 (64 x 64 tokens): the 20 steps beta2 0.95 remembers
HALF_LIFE = ("beta1", "beta2")  # the decays the large batch's third control holds at their half-life in tokens
MINI_STUDY = ROOT / "docs" / "mini_study" / "runs.tar.xz"
# What the archive keeps of a branch's records: what the measurement and the figures read.
BRANCH_KEYS = ("step", "tokens", "train/loss", "lr", "batch/size", "batch/tokens_per_step", "batch/phase", "event")


def best_lrs(archive: Path, batch: int) -> dict[str, float]:
    """Each optimizer's lr selected at ``batch`` in the mini-study's records (val/loss, its rule)."""
    best = Study(find_runs([archive]), "val/loss").best()
    return {selection.runs[0].config["optimizer"]: selection.lr for (label, b), selection in best.items()
            if b == batch and label in OPTIMIZERS}


def arm(name: str, optimizer: str, out: Path, base: Path, changes: dict, seeds: list[int],
        betas: tuple[str, ...] = ()) -> list[sweep.Point]:
    """The points of one arm (``name``) of ``optimizer``, seeds ``seeds`` (each its init and data
    order); ``betas``: decays held at their half-life in tokens from batch ``BATCH`` (beta ** (B / 8))."""
    folder = out / optimizer / name
    fixed = [f"--{key}={value!r}" for key, value in changes.items()]
    points = [p for seed in seeds for p in sweep.plan(str(base), {"seed": [seed]}, [*fixed, f"--data_seed={seed}"],
                                                     folder, "none", "none", BATCH, betas)]
    sweep.write_points(points, str(base), "python -m scripts.cbs_study")
    return points


def branch_all(parents: list[Path], seeds: list[int], jobs: int) -> None:
    """scripts.cbs on each parent, ``jobs`` at a time (one thread each)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))}
    pending, running = list(parents), []
    while pending or running:
        while pending and len(running) < jobs:
            parent = pending.pop(0)
            command = [sys.executable, "-m", "scripts.cbs", str(parent), "--steps", ",".join(map(str, STEPS)),
                       "--multipliers", ",".join(map(str, MULTIPLIERS)), "--branch-tokens", str(BRANCH_TOKENS),
                       "--seeds", ",".join(map(str, seeds)), "--launch", "local"]
            log = open(parent / "cbs.log", "a")
            running.append((subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log), log, parent))
            print(f"branching {parent} (its log: {parent / 'cbs.log'})")
        time.sleep(0.5)
        for process, log, parent in [r for r in running if r[0].poll() is not None]:
            running.remove((process, log, parent))
            log.close()
            if process.returncode:
                sys.exit(f"cbs_study: branching {parent} failed: {parent / 'cbs.log'}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/cbs_study"))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS), help=f"of {', '.join(OPTIMIZERS)}")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the parents, the branches and the ramps")
    parser.add_argument("--jobs", type=int, default=2, help="runs (and parents branched) at once (default 2)")
    parser.add_argument("--archive", type=Path, help="also pack the runs' configs and metrics into this .tar.xz")
    args = parser.parse_args(argv)
    names = args.optimizers.split(",")
    if set(names) - set(OPTIMIZERS):
        sys.exit(f"cbs_study: unknown optimizers {sorted(set(names) - set(OPTIMIZERS))}: of {', '.join(OPTIMIZERS)}")
    start = time.perf_counter()
    if not (ROOT / DATA / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "data.prepare", "shakespeare", "--tokenizer", "byte"], cwd=ROOT,
                       check=True)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = out / "base.py"
    base.write_text("# The CBS study's base config (scripts/cbs_study.py writes it): the mini-study's.\n"
                    + "".join(f"{key} = {value!r}\n" for key, value in BASE.items()))
    lrs = best_lrs(MINI_STUDY, BATCH)
    seeds = list(range(args.seeds))
    small = schedule(BATCH, TOKENS, BLOCK)

    print(f"cbs study stage 1: the parents at batch {BATCH}, lrs {lrs}")
    parents = {name: arm("small", name, out, base, {**small, "optimizer": name, "lr": lrs[name],
                                                    "min_lr": lrs[name] / 10, "checkpoint_interval": CHECKPOINT_EVERY,
                                                    "permanent_checkpoint_interval": CHECKPOINT_EVERY,
                                                    "keep_checkpoints": 1}, seeds)
               for name in names}
    sweep.launch_local([p for points in parents.values() for p in points], nproc=1, jobs=args.jobs)

    print(f"cbs study stage 2: branches at steps {STEPS}, k = {MULTIPLIERS}, {BRANCH_TOKENS:,} tokens, seeds {seeds}")
    branch_all([points[0].folder for points in parents.values()], seeds, args.jobs)

    measured = cbs.measured_runs(find_runs([out]), 0.01, 0.5)
    try:
        ramps = {name: cbs.ramp(measured.get(parents[name][0].folder, []), BATCH, list(STEPS))
                 for name in names if name in RAMPED}
    except ConfigError as error:
        sys.exit(f"cbs_study: {error}")
    print(f"cbs study stage 3: the ramps {ramps}")
    planned = []
    for name, phases in ramps.items():
        if len(phases) == 1:
            print(f"{name}: the measured B* never reached {2 * BATCH}: no doubling, so no ramp to run")
            continue
        large = phases[-1][1]
        factor = (large / BATCH) ** 0.5
        constant = {**schedule(large, TOKENS, BLOCK), "optimizer": name, "lr": lrs[name] * factor,
                    "min_lr": lrs[name] * factor / 10}
        planned += arm("ramp", name, out, base, {**small, "optimizer": name, "lr": lrs[name], "min_lr": lrs[name] / 10,
                                                 "batch_schedule": phases}, seeds)
        planned += arm("large", name, out, base, constant, seeds)
        planned += arm("large_half_life", name, out, base, constant, seeds, HALF_LIFE)
    sweep.launch_local(planned, nproc=1, jobs=args.jobs)

    runs = find_runs([out])
    write_report(runs, out / "report.md", out / "figures", None)
    if args.archive:
        pack_runs(runs, out, args.archive, branch_keys=BRANCH_KEYS)
        # The committed report and figures are the archive's own, as scripts/report.py and plot.py draw them.
        archived = args.archive.with_name(args.archive.name.removesuffix(".tar.xz") + ".md")
        write_report(find_runs([args.archive]), archived, args.archive.parent / "figures", CBS_FIGURES)
    print(f"cbs study: {sum(not is_branch(r) for r in runs)} runs, {sum(map(is_branch, runs))} branches, "
          f"{(time.perf_counter() - start) / 60:.1f} minutes; {out / 'report.md'}, {out / 'figures'}"
          + (f", {args.archive} and {archived}" if args.archive else ""))


def write_report(runs: list, path: Path, figures: Path, only: tuple[str, ...] | None) -> None:
    """The report of ``runs`` (lrs chosen on val/loss, numbers read on heldout/loss) into ``path``
    and printed, and their figures (those named in ``only``, None: all) into ``figures``."""
    points = [r for r in runs if not is_branch(r)]
    branches = [r for r in runs if is_branch(r)]
    text = report(points, target=None, select_on="val/loss", report_on="heldout/loss", branches=branches)
    with atomic_write(path, "w") as f:
        f.write(text)
    print(text, end="")
    draw_all(points, figures, "val/loss", "heldout/loss", branches, only=only)


if __name__ == "__main__":
    main()
