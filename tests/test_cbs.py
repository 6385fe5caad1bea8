"""The critical batch size by branching (study/cbs.py, scripts/cbs.py): the selection rules on
hand-made loss curves whose answers are known, and branches of a tiny run: planned (what cannot
branch refused), trained (the k = 1, seed 0 branch is the parent's own continuation, bitwise),
measured into the table the report prints and the figures draw; and the command, killed
(SIGKILL) in a branch, run again: it resumes and prints the uninterrupted table."""
import math
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, TINY_RUN, train_here
from configs import ConfigError, TrainConfig
from study import cbs
from study.plot import plot_cbs, plot_cbs_branches
from study.report import ramp_table, report
from study.runs import Run, find_runs, is_branch
from training.checkpoint import Checkpoint
from training.parts import Part, Step


# --- the selection rules ---
def test_the_ema_smooths_from_the_first_loss():
    assert cbs.smoothed([4.0]) == 4.0
    assert cbs.smoothed([4.0, 2.0, 3.0]) == 0.5 * 3.0 + 0.5 * (0.5 * 2.0 + 0.5 * 4.0)  # 3.0 / 2 + 1.5 = 3.0
    assert cbs.smoothed([4.0, 2.0], ema=0.25) == 0.25 * 2.0 + 0.75 * 4.0


def test_the_papers_rule_takes_the_largest_multiplier_that_keeps_up_with_every_smaller_one():
    # Losses at the end of each branch: 2 keeps up with 1 (within 0.01), 4 falls behind 1 by 0.02.
    assert cbs.critical_multiplier({0.5: 3.000, 1: 3.004, 2: 3.009, 4: 3.020}, epsilon=0.01) == 2
    # Every larger batch is better: the largest.
    assert cbs.critical_multiplier({0.25: 3.3, 1: 3.2, 8: 3.1}, epsilon=0.01) == 8
    # 4 keeps up with 2 but not with 0.5 (3.0 + 0.01 < 3.02): 2.
    assert cbs.critical_multiplier({0.5: 3.0, 2: 3.01, 4: 3.02}, epsilon=0.01) == 2
    # Not monotone: 8 keeps up with everything smaller though 4 did not: the rule takes the largest, 8.
    assert cbs.critical_multiplier({1: 3.0, 2: 3.0, 4: 3.5, 8: 2.9}, epsilon=0.01) == 8
    # Nothing keeps up: the smallest.
    assert cbs.critical_multiplier({1: 3.0, 2: 3.1, 4: 3.2}, epsilon=0.01) == 1


def test_the_interval_rule_reads_the_paired_differences_over_seeds():
    # k=2 is worse than k=1 by 0.03 on average: beyond epsilon by the mean, but the seeds disagree
    # (+0.13, -0.07): the 95% interval reaches below 0.01, so 2 does not fall behind by it.
    noisy = {1: {0: 3.00, 1: 3.10}, 2: {0: 3.13, 1: 3.03}}
    assert cbs.critical_multiplier({k: sum(v.values()) / 2 for k, v in noisy.items()}, 0.01) == 1
    assert cbs.critical_multiplier_interval(noisy, 0.01) == 2
    # The same mean difference on every seed: the interval is the point, above epsilon: falls behind.
    steady = {1: {0: 3.00, 1: 3.10, 2: 3.20}, 2: {0: 3.03, 1: 3.13, 2: 3.23}}
    assert cbs.critical_multiplier_interval(steady, 0.01) == 1
    difference = cbs.paired_difference(steady[2], steady[1])
    assert difference.n == 3 and difference.mean == pytest.approx(0.03)
    assert difference.std == pytest.approx(0, abs=1e-12)
    assert cbs.critical_multiplier_interval({1: {0: 3.0}, 2: {0: 3.0}}, 0.01) is None  # one seed: no interval


def branch_run(tmp_path, k, seed, losses):
    """A finished branch of step 8 of a batch-8 parent, as the study reads it (``losses``: its
    training loss at each step; None: it diverged at its first log step)."""
    block = TrainConfig(max_steps=1).model_config(1).block_size
    batch = int(8 * k)
    changes = [{"step": 8, "key": "batch_size", "from": 8, "to": batch}] if k != 1 else []
    config = {**TrainConfig(max_steps=24, batch_size=8, stop_at_step=8 + len(losses or [0])).to_dict(),
              "changes": changes}
    records = ([{"event": {"nonfinite": {"step": 9, "error": "non-finite gradient at step 9"}}}] if losses is None
               else [{"step": 9 + i, "tokens": (64 + (i + 1) * batch) * block, "train/loss": loss}
                     for i, loss in enumerate(losses)])
    return Run(tmp_path / "parent" / "branches" / "step_00000008" / f"k{k:g}_s{seed}", config, records)


def test_a_diverged_branch_falls_behind_every_branch_that_did_not(tmp_path):
    parent = Run(tmp_path / "parent", {}, [])
    branches = [branch_run(tmp_path, 0.5, seed, [3.2, 3.0, 3.0, 3.0]) for seed in (0, 1)]
    branches += [branch_run(tmp_path, 1.0, seed, [3.0, 3.0]) for seed in (0, 1)]
    branches += [branch_run(tmp_path, 2.0, 0, None), branch_run(tmp_path, 2.0, 1, [2.5])]
    assert cbs.branch_losses(branches[4]) == [math.inf]
    [m] = cbs.measure(parent, branches, epsilon=0.01, ema=0.5)
    # k = 0.5 ends at 3.025 (3.2, 3.1, 3.05, 3.025), k = 1 at 3.0, k = 2 diverged on one seed:
    # behind by both rules, though its other seed's 2.5 is the best loss of all.
    assert (m.step, m.batch, m.losses[0.5][0], m.k_epsilon, m.k_interval) == (8, 8, 3.025, 1.0, 1.0)
    assert "2: diverged" in cbs.table([m], 0.01)


def measurement(tokens, k, batch=8):
    return cbs.Measurement(step=tokens // (batch * 32), tokens=tokens, batch=batch, losses={}, k_epsilon=k,
                           k_interval=None, b_simple=None, differences={})


def test_the_ramp_doubles_where_the_measured_batch_passes_twice_the_batch():
    # B* = 4, 16, 24, 64, 64 at five checkpoints of a batch-8 run: 16 >= 2 x 8 doubles to 16 at
    # 2,048 tokens; 24 < 32 holds; 64 >= 32 doubles once more (once per checkpoint), then again.
    measured = [measurement(1024, 0.5), measurement(2048, 2), measurement(4096, 3), measurement(8192, 8),
                measurement(16384, 8)]
    assert cbs.ramp(measured, 8) == [(0, 8), (2048, 16), (8192, 32), (16384, 64)]
    assert cbs.ramp(measured[:1], 8) == [(0, 8)]  # never twice the batch: no ramp


def arm_runs(tmp_path, name, batch, schedule, steps, losses):
    """One arm's runs (a seed each) as the report reads them: config and records."""
    return [Run(tmp_path / name / f"s{seed}", {"optimizer": "adamw", "batch_size": batch, "batch_schedule": schedule,
                                               "max_tokens": 4096, "seed": seed, "lr": 0.01, "min_lr": 0.001,
                                               "warmup_steps": 2},
                [{"step": steps, "heldout/loss": loss}]) for seed, loss in enumerate(losses)]


def test_the_ramp_table_sets_a_ramp_beside_its_constant_batches(tmp_path):
    ramped = [[0, 8], [1024, 16], [2048, 32]]
    runs = [*arm_runs(tmp_path, "small", 8, [], 16, [3.0, 3.1, 3.2]),
            *arm_runs(tmp_path, "ramp", 8, ramped, 8, [2.98, 3.12, 3.16]),
            *arm_runs(tmp_path, "large", 32, [], 4, [3.3, 3.2, 3.5]),
            *arm_runs(tmp_path, "other", 16, [], 8, [1.0, 1.0, 1.0])]  # a batch neither constant arm has
    rows = [line.split(" | ") for line in ramp_table(runs, "heldout/loss").splitlines()[2:]]
    assert [row[1:5] for row in rows] == [["constant small", "8", "16", "0%"],
                                          ["ramp", "8 -> 16 (at 1,024 tokens) -> 32 (at 2,048 tokens)", "8", "50%"],
                                          ["constant large", "32", "4", "75%"]]
    # The ramp's difference from the small batch, paired by seed: -0.02, +0.02, -0.04: mean -0.0133,
    # std 0.0306, 95% half-width t(2) 4.303 x 0.0306 / sqrt(3) = 0.0759.
    assert rows[1][6] == "-0.013 [-0.089, +0.063] |"
    assert rows[0][5].startswith("3.100 ± 0.100")


# --- scripts.cbs on a tiny run ---
# The parent: batch 8 of 32 tokens (256 a step), 24 steps, a kept checkpoint every 4; branches of
# 1,024 tokens (4 parent steps) at k = 0.5, 1, 2 from steps 8 and 16, seeds 0 and 1.
PARENT = [*TINY_RUN, "--run_name=parent", "--optimizer=adamw", "--lr=0.01", "--min_lr=0.001", "--warmup_steps=2",
          "--max_steps=24", "--batch_size=8", "--micro_batch_size=4", "--log_interval=4", "--eval_interval=12",
          "--checkpoint_interval=4", "--permanent_checkpoint_interval=4", "--keep_checkpoints=1",
          "--extra_parts=test_cbs:KillInABranch"]
BRANCHING = ["--steps", "8,16", "--multipliers", "0.5,1,2", "--branch-tokens", "1024", "--seeds", "0,1"]


class KillInABranch(Part):
    """Kills its process (SIGKILL) at step 13 of the branch the environment names, once."""

    def __init__(self, run):
        self.run = run

    def after_step(self, step: Step) -> None:
        if step.number == 13 and self.run.config.run_name == os.environ.get("KILL_IN_BRANCH"):
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def parent(byte_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("cbs")
    train_here(*PARENT, f"--data_dir={byte_shards}", f"--out_dir={out}")
    return out / "parent"


def branch_here(run, steps=(8, 16), multipliers=(0.5, 1.0, 2.0), branch_tokens=1024, lr_scaling="sqrt", seeds=(0, 1)):
    """scripts.cbs's work in this process, on one thread (as a process under helpers.run_train):
    plan, write and train the branches; their runs."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        branches = cbs.plan(run, list(steps), list(multipliers), branch_tokens, lr_scaling, (), list(seeds))
        cbs.check_written(branches)
        cbs.write(branches, run, "test")
        assert cbs.launch_local(branches, nproc=1) == []
    finally:
        torch.set_num_threads(threads)
    return find_runs([run])


def copy_of(parent, tmp_path):
    shutil.copytree(parent, tmp_path / "parent", symlinks=True)
    return tmp_path / "parent"


@pytest.fixture(scope="module")
def branched(parent, tmp_path_factory):
    """A copy of the parent with its branches trained (in this process): the run folder."""
    run = copy_of(parent, tmp_path_factory.mktemp("branched"))
    branch_here(run)
    return run


def test_branches_train_and_measure_the_critical_batch(branched):
    run = branched
    runs = find_runs([run])
    branches = [r for r in runs if is_branch(r)]
    assert len(branches) == 12
    # Each branch trained 1,024 tokens at its batch, with the lr times sqrt(k), from its parent's step.
    for branch in branches:
        _, step, k, seed = cbs.branch_of(branch)
        batch, changed = int(8 * k), {c["key"]: c["to"] for c in branch.config["changes"]}
        records = [r for r in branch.records if "train/loss" in r]
        assert len(records) == 1024 // (batch * 32) and records[0]["step"] == step + 1
        assert records[-1]["tokens"] - records[0]["tokens"] == 1024 - batch * 32
        assert changed.get("batch_size", 8) == batch
        assert changed.get("lr", 0.01) == pytest.approx(0.01 * k ** 0.5)
    # The k = 1, seed 0 branch is the parent's own continuation: its checkpoint at step 12 (20) is
    # the parent's, bitwise.
    for step in (8, 16):
        own = Checkpoint.load(run / "branches" / f"step_{step:08d}" / "k1_s0" / "ckpt.pt")
        theirs = Checkpoint.load(run / f"ckpt_{step + 4:08d}.pt")
        assert own.step == theirs.step and all(torch.equal(own.model[k], theirs.model[k]) for k in theirs.model)
    # Seed 1 read other tokens: another loss.
    assert [cbs.branch_of(b)[2:] for b in branches[:2]] == [(0.5, 0), (0.5, 1)]
    assert cbs.branch_losses(branches[0]) != cbs.branch_losses(branches[1])

    # The measurement is the rule on the smoothed final losses, and the table shows it.
    measurements = cbs.measured_runs(runs, epsilon=0.01, ema=0.5)[run]
    assert [(m.step, m.tokens, m.batch) for m in measurements] == [(8, 2048, 8), (16, 4096, 8)]
    for m in measurements:
        for k, seeds in m.losses.items():
            for seed, loss in seeds.items():
                branch = next(b for b in branches if cbs.branch_of(b)[1:] == (m.step, k, seed))
                assert loss == cbs.smoothed(cbs.branch_losses(branch))
        assert m.k_epsilon == cbs.critical_multiplier({k: sum(v.values()) / 2 for k, v in m.losses.items()}, 0.01)
        assert m.k_interval == cbs.critical_multiplier_interval(m.losses, 0.01)
    table = cbs.table(measurements, 0.01)
    rows = [line.split(" | ") for line in table.splitlines()[2:4]]
    assert [row[1:6] for row in rows] == [[f"{m.tokens:,}", "8", f"{m.k_epsilon:g}", f"{m.k_epsilon * 8:g}",
                                           f"{m.k_interval:g}"] for m in measurements]
    # The report holds the table, the figures draw it; branches are no study point's runs.
    parents = [r for r in runs if not is_branch(r)]
    assert f"## Critical batch size by branching: adamw, batch 8, parent\n\n{table}" in report(
        parents, None, branches=branches)
    assert plot_cbs(parents, branches, 0.01, 0.5) is not None and plot_cbs_branches(parents, branches, 0.5) is not None
    # Planned again: nothing to train; another plan into the folder is refused, naming what differs.
    assert branch_here(run) == runs
    with pytest.raises(ConfigError, match=r"holds the branch step 8 k 0.5 seed 0 with other settings \(.*lr"):
        branch_here(run, lr_scaling="linear")


@pytest.mark.parametrize("changes, error", [
    ({"multipliers": [0.3, 1]}, r"multiplier 0.3 of the batch 8 at step 8 is 2.4 sequences"),
    ({"branch_tokens": 1000}, r"--branch-tokens 1000 is not a whole number of steps .* multiple of 512"),
    ({"steps": [24]}, r"the checkpoint of step 24 \(6,144 tokens\) leaves fewer than --branch-tokens 1,024"),
    ({"steps": [9]}, r"has no checkpoint of step 9; its checkpoints are of steps 4, 8, 12, 16, 20, 24"),
])
def test_what_cannot_branch_is_refused_with_its_fix(parent, changes, error):
    arguments = {"steps": [8], "multipliers": [0.5, 1, 2], "branch_tokens": 1024, "lr_scaling": "sqrt", "betas": (),
                 "seeds": [0], **changes}
    with pytest.raises(ConfigError, match=error):
        cbs.plan(parent, **arguments)


@pytest.mark.slow
def test_the_command_killed_in_a_branch_resumes_and_prints_the_table(parent, branched, tmp_path):
    whole = branched  # (the same branches, trained uninterrupted in this process)
    expected = cbs.table(cbs.measured_runs(find_runs([whole]), 0.01, 0.5)[whole], 0.01)
    run = copy_of(parent, tmp_path / "killed")
    command = [sys.executable, "-m", "scripts.cbs", str(run), *BRANCHING, "--launch", "local"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), "OMP_NUM_THREADS": "1"}
    killed = subprocess.run(command, cwd=ROOT, env={**env, "KILL_IN_BRANCH": "k0.5_s1"}, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    branch = run / "branches" / "step_00000008" / "k0.5_s1"
    assert Checkpoint.load(branch / "ckpt.pt").step == 12  # its checkpoint every 2 of its 8 steps
    resumed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "cbs: 12 branches" in resumed.stdout and resumed.stdout.endswith(expected + "\n")
    for name in ("k0.5_s1", "k2_s0"):
        own, uninterrupted = (Checkpoint.load(r / "branches" / "step_00000008" / name / "ckpt.pt")
                              for r in (run, whole))
        assert all(torch.equal(own.model[k], uninterrupted.model[k]) for k in own.model)
