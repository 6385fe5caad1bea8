"""What the batch axis costs (docs/batch.md, docs/performance.md): a batch schedule's per-step cost
against a fixed batch, and a CBS branch's overhead over training the same tokens from scratch.

    python -m scripts.bench_batch [--config configs/default.py] [--steps 40] [--repeats 3]

Both on the config's model in this process (one rank), on random tokens of its tokenizer
(scripts/bench_train's synthetic data):

* **schedule**: two trainers, one with the config's fixed batch and one with a batch schedule
  whose change lies beyond the run (the same batch, every step going through the schedule: the
  phase lookup, the lr in tokens, the phase check), their ordinary loop steps interleaved round
  by round; the mean step of each and their ratio (target: 1.00), per repeat;
* **branch**: a parent trained ``--steps`` steps with a kept checkpoint halfway; then, in turn, a
  k = 1 branch of it (scripts/cbs: planned, its start written, resumed, trained to the parent's
  end; log every step) and a run of the same config trained the same number of steps from
  scratch (log every step; the same schedule, stopped halfway: no evaluation but the step-0
  validation of one micro-batch), each through ``train.main`` in this process; their wall times
  and ratio, per repeat.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

from scripts.bench_train import ROOT, loop_step, synthetic_trainer, timed_ms


def schedule_ratio(config: Path, overrides: list[str], folder: Path, steps: int) -> tuple[float, float]:
    """(fixed batch ms per step, scheduled / fixed), ``steps`` ordinary steps each, interleaved."""
    fixed = synthetic_trainer(config, overrides, folder, run_name="fixed")
    batch = fixed.config.batch_size
    scheduled = synthetic_trainer(config, [*overrides, f"--batch_schedule=[(0, {batch}), ({10 ** 15}, {2 * batch})]"],
                                  folder, run_name="scheduled")
    try:
        for trainer in (fixed, scheduled):
            loop_step(trainer)  # warm-up
        times = {"fixed": [], "scheduled": []}
        for _ in range(steps):
            times["fixed"].append(timed_ms(lambda: loop_step(fixed), fixed.device))
            times["scheduled"].append(timed_ms(lambda: loop_step(scheduled), scheduled.device))
    finally:
        fixed.close()
        scheduled.close()
    base = statistics.fmean(times["fixed"])
    return base, statistics.fmean(times["scheduled"]) / base


def quietly(fn):
    with redirect_stdout(StringIO()), redirect_stderr(StringIO()):
        return fn()


def branch_ratio(config: Path, overrides: list[str], folder: Path, steps: int) -> tuple[float, float]:
    """(from-scratch seconds, branch / from scratch) for ``steps // 2`` steps each, on the tokens
    synthetic_trainer wrote under ``folder``."""
    import train
    from configs import load_config
    from study import cbs

    half = steps // 2
    data = folder / "data" / Path(load_config(config, overrides).tokenizer).name  # (a tokenizer may be a folder)
    common = [str(config), *overrides, f"--data_dir={data}", f"--out_dir={folder}", "--wandb_mode=disabled",
              "--sample_tokens=0", "--warmup_steps=2", "--val_tokens=1"]  # (validation: one micro-batch)
    if not (folder / "parent").is_dir():
        quietly(lambda: train.main([*common, "--run_name=parent", f"--max_steps={steps}",
                                    f"--permanent_checkpoint_interval={half}", f"--checkpoint_interval={half}"]))
    shutil.rmtree(folder / "parent" / cbs.BRANCHES, ignore_errors=True)
    parent = folder / "parent"
    start = time.perf_counter()
    branches = cbs.plan(parent, [half], [1.0], half * train_tokens(parent), "sqrt", (), [0])
    cbs.write(branches, parent, "bench")
    quietly(lambda: cbs.launch_local(branches, nproc=1, main=train.main))
    branch = time.perf_counter() - start
    shutil.rmtree(folder / "scratch", ignore_errors=True)
    start = time.perf_counter()
    quietly(lambda: train.main([*common, "--run_name=scratch", f"--max_steps={steps}", f"--stop_at_step={half}",
                                "--log_interval=1", f"--eval_interval={10 ** 12}"]))
    scratch = time.perf_counter() - start
    return scratch, branch / scratch


def train_tokens(run: Path) -> int:
    """The tokens a step of ``run`` (its config's batch x block)."""
    from configs import load_config
    config = load_config(str(run / "config.json"))
    return config.batch_size * config.model_config(1).block_size


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.py")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as train.py's --key=value")
    parser.add_argument("--steps", type=int, default=40, help="timed steps (schedule); the parent's steps (branch)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    overrides = [f"--{item}" for item in args.set]
    import torch
    print(f"config {args.config} {' '.join(overrides)}; {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        schedule = [schedule_ratio(args.config, overrides, folder, args.steps) for _ in range(args.repeats)]
        branch = [branch_ratio(args.config, overrides, folder, args.steps) for _ in range(args.repeats)]
    ratios = [r for _, r in schedule]
    print(f"schedule: a step {statistics.fmean(ms for ms, _ in schedule):.1f} ms at the fixed batch; scheduled / "
          f"fixed {statistics.fmean(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, {args.repeats} repeats "
          f"of {args.steps} interleaved steps)")
    ratios = [r for _, r in branch]
    print(f"branch: {args.steps // 2} steps from scratch {statistics.fmean(s for s, _ in branch):.2f} s; a k=1 "
          f"branch of the same steps / from scratch {statistics.fmean(ratios):.2f} (range {min(ratios):.2f}-"
          f"{max(ratios):.2f}, {args.repeats} repeats)")


if __name__ == "__main__":
    main()
