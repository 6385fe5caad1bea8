"""The critical batch size by branching (study/cbs.py, scripts/cbs.py): the selection rules on
hand-made loss curves whose answers are known, and branches of a tiny run: planned (what cannot
branch refused), trained (the k = 1, seed 0 branch is the parent's own continuation, bitwise),
measured into the table the report prints and the figures draw; and the command, killed
(SIGKILL) in a branch, run again: it resumes and prints the uninterrupted table."""
import dataclasses
import math
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import train
from helpers import ROOT, TINY_RUN, read_metrics, train_here
from configs import ConfigError, TrainConfig
from study import cbs
from study.plot import plot_cbs, plot_cbs_branches
from study.report import equal_loss_table, ramp_plan_table, ramp_table, ramps_of, report
from study.runs import Run, find_runs, is_branch, pack_runs
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
    # 4 keeps up with 2 (3.012 <= 3.015) but not with 0.5 (3.012 > 3.01): 2.
    assert cbs.critical_multiplier({0.5: 3.0, 2: 3.005, 4: 3.012}, epsilon=0.01) == 2
    # On the tie, exact in binary (3.0 + 0.25 == 3.25), k keeps up: the rule is <=.
    assert cbs.critical_multiplier({1: 3.0, 2: 3.25}, epsilon=0.25) == 2
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
    assert (m.k_epsilon_from_one, m.k_interval_from_one) == (1.0, 1.0)  # (over k = 1 and 2 only: the same)
    # The checkpoint's 64 sequences of 1,024 tokens; L_0.5 - L_1 = 3.025 - 3.0 on both seeds.
    assert cbs.table([m], 0.01).splitlines()[:3] == [
        "| step | tokens | batch B | k* (eps 0.01) | B* | B* over k >= 1 | k* (95% interval) | B* (interval) "
        "| B* (interval) over k >= 1 | B_simple (sequences) | L_k - L_1 by k |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        "| 8 | 65,536 | 8 | 1 | 8 | <= 8 | 1 | 8 | <= 8 | - | 0.5: +0.0250 ±0.0000, 1: +0.0000 ±0.0000, 2: diverged |"]


def measurement(tokens, k, batch=8, from_one=None, block=32):
    return cbs.Measurement(step=tokens // (batch * block), tokens=tokens, batch=batch, losses={}, k_epsilon=k,
                           k_interval=None, k_epsilon_from_one=from_one, k_interval_from_one=None, b_simple=None,
                           differences={})


def test_the_ramp_doubles_where_the_measured_batch_passes_twice_the_batch():
    # B* = 4, 16, 24, 64, 64 at five checkpoints of a batch-8 run: 16 >= 2 x 8 doubles to 16 at
    # 2,048 tokens; 24 < 32 holds; 64 >= 32 doubles once more (once per checkpoint), then again.
    measured = [measurement(1024, 0.5), measurement(2048, 2), measurement(4096, 3), measurement(8192, 8),
                measurement(16384, 8)]
    assert cbs.ramp(measured, 8) == [(0, 8), (2048, 16), (8192, 32), (16384, 64)]
    assert cbs.ramp(measured[:1], 8) == [(0, 8)]  # never twice the batch: no ramp
    # The committed study's AdamW (B* = 2, 64, 8, 8, 2 at steps 64, 256, 512, 1,024, 1,536 of 2,048, 512
    # tokens a step): one doubling, at step 256, and never down; from step 512 on (786,432 of its
    # 1,048,576 tokens, 75%) the ramp's 16 runs above the B* measured. Before it, at step 64, its batch
    # 8 lies above B* = 2 too, but that is the batch it starts at, not a doubling.
    study = [measurement(step * 512, k, block=64) for step, k in ((64, 0.25), (256, 8), (512, 1), (1024, 1), (1536, 0.25))]
    phases = cbs.ramp(study, 8, [64, 256, 512, 1024, 1536])
    assert phases == [(0, 8), (131072, 16)]
    assert cbs.tokens_above(study, phases, 1_048_576) == 786_432 / 1_048_576 == 0.75
    assert cbs.batch_at(phases, 131071) == 8 and cbs.batch_at(phases, 131072) == 16
    # B* exactly twice the batch doubles (>=); a checkpoint branched but not measured is refused.
    assert cbs.ramp([measurement(1024, 2)], 8) == [(0, 8), (1024, 16)]
    with pytest.raises(ConfigError, match=r"^the ramp is planned from a measurement at every checkpoint branched; "
                                          r"the checkpoints of step 512, 1536 have none"):
        cbs.ramp(study[:2] + study[3:4], 8, [64, 256, 512, 1024, 1536])


def arm_runs(tmp_path, name, batch, schedule, curves, betas=(0.9, 0.95)):
    """One arm's runs (a seed each) as the report reads them, 32-token sequences: ``curves``, per seed,
    its (step, tokens, heldout/loss) at each evaluation."""
    return [Run(tmp_path / name / f"s{seed}", {"optimizer": "adamw", "batch_size": batch, "batch_schedule": schedule,
                                               "max_tokens": 4096, "seed": seed, "lr": 0.01, "min_lr": 0.001,
                                               "warmup_steps": 2, "beta1": betas[0], "beta2": betas[1]},
                [{"step": step, "tokens": tokens, "heldout/loss": loss} for step, tokens, loss in curve])
            for seed, curve in enumerate(curves)]


@pytest.fixture
def ramp_arms(tmp_path):
    """A ramp of 8 -> 16 -> 32 sequences (4,096 tokens: 8 steps) and its controls, 3 seeds each: the
    constant 8 (16 steps), the constant 32 (4 steps), the constant 32 with its betas at their half-life
    (0.9 ** 4, 0.95 ** 4), and a batch of neither (16)."""
    def arm(name, batch, schedule, steps, tokens, finals, middle, betas=(0.9, 0.95)):
        curves = [[(0, 0, 5.0), (steps[0], tokens, mid), (steps[1], 4096, final)] for mid, final in zip(middle, finals)]
        return arm_runs(tmp_path, name, batch, schedule, curves, betas)
    return [*arm("small", 8, [], (8, 16), 2048, [3.0, 3.1, 3.2], [3.4, 3.5, 3.6]),
            *arm("ramp", 8, [[0, 8], [1024, 16], [2048, 32]], (4, 8), 1024, [2.98, 3.12, 3.16], [3.3, 3.4, 3.5]),
            *arm("large", 32, [], (2, 4), 2048, [3.3, 3.2, 3.5], [3.6, 3.7, 3.8]),
            *arm("half_life", 32, [], (2, 4), 2048, [3.1, 3.15, 3.2], [3.5, 3.6, 3.7], (0.9 ** 4, 0.95 ** 4)),
            *arm("other", 16, [], (4, 8), 2048, [1.0, 1.0, 1.0], [2.0, 2.0, 2.0])]


def test_the_ramp_table_sets_a_ramp_beside_each_of_its_controls(ramp_arms):
    [ramp] = ramps_of(ramp_arms)
    assert list(ramp.arms) == ["constant small", "ramp", "constant large", "constant large, half-life decays"]
    # The small batch's B* at three checkpoints: 16, 64, 16 (k = 2, 8, 2 of 8): the ramp's plan, and from
    # 3,072 tokens on its 32 above the last B* (16): 1,024 of 4,096 tokens.
    measured = {ramp.arms["constant small"][0].folder: [measurement(1024, 2), measurement(2048, 8, from_one=8),
                                                        measurement(3072, 2)]}
    lines = ramp_table([ramp], "heldout/loss", measured).splitlines()
    assert lines[0].split(" | ")[6:] == ["Δ vs constant small, paired by seed [95%]",
                                         "Δ vs constant large, paired by seed [95%]",
                                         "Δ vs constant large, half-life decays, paired by seed [95%]",
                                         "tokens above the measured B* |"]
    rows = [line.split(" | ") for line in lines[2:]]
    assert [row[1:5] for row in rows] == [["constant small", "8", "16", "0%"],
                                          ["ramp", "8 -> 16 (at 1,024 tokens) -> 32 (at 2,048 tokens)", "8", "50%"],
                                          ["constant large", "32", "4", "75%"],
                                          ["constant large, half-life decays", "32", "4", "75%"]]
    assert rows[0][5].startswith("3.100 ± 0.100")
    # The ramp against each control, paired by seed (95% half-width t(2) 4.303 x std / sqrt(3)):
    # small: -0.02, +0.02, -0.04: mean -0.0133, std 0.0306, half-width 0.0759;
    # large: -0.32, -0.08, -0.34: mean -0.2467, std 0.1447, half-width 0.3594;
    # large, half-life: -0.12, -0.03, -0.04: mean -0.0633, std 0.0493, half-width 0.1225.
    assert rows[1][6:] == ["-0.013 [-0.089, +0.063]", "-0.247 [-0.606, +0.113]", "-0.063 [-0.186, +0.059]",
                           "25% |"]
    assert [row[6 + i] for i, row in enumerate(rows[:1] + rows[2:])] == ["-", "-", "-"]  # (none against itself)
    # The plan: 16 >= 2 x 8 doubles at step 4, 64 >= 2 x 16 at step 8, 16 < 2 x 32 holds at step 12.
    plan = [line.split(" | ")[1:] for line in ramp_plan_table([ramp], measured).splitlines()[2:]]
    assert plan == [["4", "1,024", "16", "-", "8", "yes, to 16", "16 |"], ["8", "2,048", "64", "64", "16", "yes, to 32",
                                                                          "32 |"],
                    ["12", "3,072", "16", "-", "32", "no", "32 |"]]


def test_the_ramp_plan_prints_a_b_star_at_the_multipliers_ends_as_a_bound(ramp_arms):
    # Branches at k = 0.25, 1 and 8 of batch 8: a k* of 0.25 only bounds B* from above (<= 2), one of 8
    # from below (>= 64); over k >= 1 the smallest multiplier is 1 (<= 8).
    [ramp] = ramps_of(ramp_arms)
    tried = {k: {0: 3.0} for k in (0.25, 1, 8)}
    at_ends = [dataclasses.replace(measurement(1024, 0.25, from_one=1), losses=tried),
               dataclasses.replace(measurement(2048, 8, from_one=8), losses=tried)]
    plan = ramp_plan_table([ramp], {ramp.arms["constant small"][0].folder: at_ends}).splitlines()[2:]
    assert [line.split(" | ")[3:5] for line in plan] == [["<= 2", "<= 8"], [">= 64", ">= 64"]]


def test_the_equal_loss_table_reads_each_arms_mean_curve(ramp_arms):
    # Mean curves (step: loss): small 0: 5.0, 8: 3.5, 16: 3.1; ramp 4: 3.4, 8: 3.0867; large 2: 3.7,
    # 4: 3.3333; half-life 2: 3.6, 4: 3.15. To 3.1 (the small batch's final): small at 16; the ramp at
    # 4 + 4 x (3.4 - 3.1) / (3.4 - 3.0867) = 7.83 (51% fewer steps), 1,024 + 3,072 x 3.83 / 4 = 3,965 tokens
    # (seed 0's: the tokens of a step change with the batch); neither large arm. To 3.3333 (the large
    # batch's final, the highest): small at 8 + 8 x 0.1667 / 0.4 = 11.33 (2,048 + 2,048 x 3.33 / 8 = 2,901
    # tokens), the ramp at 4 + 4 x 0.0667 / 0.3133 = 4.85 (57% fewer; 1,024 + 3,072 x 0.85 / 4 = 1,678
    # tokens), large at 4 (65%), the half-life arm at 2 + 2 x 0.2667 / 0.45 = 3.19 (72%; 2,048 + 2,048 x
    # 1.19 / 2 = 3,262 tokens).
    rows = [line.split(" | ")[1:] for line in equal_loss_table(ramps_of(ramp_arms), "heldout/loss").splitlines()[2:]]
    small, large = "3.100 (the constant small batch's final)", "3.333 (the highest final of the arms)"
    assert rows == [[small, "constant small", "16", "0%", "4,096 |"],
                    [small, "ramp", "8", "51%", "3,965 |"],
                    [small, "constant large", "not reached (final 3.333)", "-", "- |"],
                    [small, "constant large, half-life decays", "not reached (final 3.150)", "-", "- |"],
                    [large, "constant small", "11", "0%", "2,901 |"],
                    [large, "ramp", "5", "57%", "1,678 |"],
                    [large, "constant large", "4", "65%", "4,096 |"],
                    [large, "constant large, half-life decays", "3", "72%", "3,262 |"]]


# --- scripts.cbs on a tiny run ---
# The parent: batch 8 of 32 tokens (256 a step), 24 steps, a kept checkpoint every 4; branches of
# 1,024 tokens (4 parent steps) at k = 0.5, 1, 2 from steps 8 and 16, seeds 0 and 1. Its betas remember
# 2 steps (1 / (1 - 0.5); 1 / (1 - 0.4) rounds up to 2), so that the k = 2 branches, 2 steps long, are
# long enough (study/cbs.py's rule).
PARENT = [*TINY_RUN, "--run_name=parent", "--optimizer=adamw", "--beta1=0.4", "--beta2=0.5", "--lr=0.01",
          "--min_lr=0.001", "--warmup_steps=2", "--max_steps=24", "--batch_size=8", "--micro_batch_size=4",
          "--log_interval=4", "--eval_interval=12",
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
        assert cbs.launch_local(branches, nproc=1, main=train.main) == []
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

    # The measurement smooths each branch's logged losses: the EMA of a = 1/2 written out, weights
    # 1/2^(n-1) on the first loss and 1/2^(n-i+1) on loss i >= 2.
    def smoothed_by_hand(losses):
        n = len(losses)
        return losses[0] / 2 ** (n - 1) + sum(loss / 2 ** (n - i + 1) for i, loss in enumerate(losses[1:], 2))

    logged = {cbs.branch_of(b)[1:]: [r["train/loss"] for r in read_metrics(b.folder) if "train/loss" in r]
              for b in branches}
    measurements = cbs.measured_runs(runs, epsilon=0.01, ema=0.5)[run]
    assert [(m.step, m.tokens, m.batch) for m in measurements] == [(8, 2048, 8), (16, 4096, 8)]
    for m in measurements:
        assert {k: sorted(seeds) for k, seeds in m.losses.items()} == {0.5: [0, 1], 1.0: [0, 1], 2.0: [0, 1]}
        for k, seeds in m.losses.items():
            for seed, loss in seeds.items():
                assert loss == pytest.approx(smoothed_by_hand(logged[m.step, k, seed]), rel=1e-12)
    # The table: a row per checkpoint (its tokens, the batch 8, B* = 8 k*), in the report under its heading.
    # k* by the paper's rule on the seeds' means, written out for K = 0.5, 1, 2: 2 if L_2 keeps up with
    # both smaller ones, else 1 if L_1 keeps up with L_0.5, else 0.5; over k >= 1: 2 if L_2 <= L_1 + eps.
    table = cbs.table(measurements, 0.01)
    rows = [line.split(" | ") for line in table.splitlines()[2:4]]
    assert [row[:3] for row in rows] == [["| 8", "2,048", "8"], ["| 16", "4,096", "8"]]

    def bound(cell, k, smallest=0.5, largest=2):  # (a k* at the ends of the multipliers: a bound on B*)
        assert cell.startswith("<= " if k == smallest else ">= " if k == largest else tuple("0123456789")), cell
        return float(cell.removeprefix("<= ").removeprefix(">= "))
    for row, m in zip(rows, measurements):
        mean = {k: sum(smoothed_by_hand(logged[m.step, k, seed]) for seed in (0, 1)) / 2 for k in (0.5, 1.0, 2.0)}
        k_star = (2 if mean[2.0] <= min(mean[0.5], mean[1.0]) + 0.01 else 1 if mean[1.0] <= mean[0.5] + 0.01 else 0.5)
        from_one = 2 if mean[2.0] <= mean[1.0] + 0.01 else 1
        assert (float(row[3]), bound(row[4], k_star), bound(row[5], from_one, 1)) == (k_star, 8 * k_star, 8 * from_one)
        k_interval = float(row[6])
        assert k_interval in (0.5, 1, 2) and bound(row[7], k_interval) == 8 * k_interval  # (the interval rule)
        assert row[8] in ("<= 8", ">= 16")  # (over k = 1 and 2: at one end or the other)
    parents = [r for r in runs if not is_branch(r)]
    text = report(parents, None, branches=branches)
    assert "## Critical batch size by branching: adamw, batch 8, parent\n\n| step | tokens | batch B |" in text
    assert all(line in text for line in table.splitlines())
    # The figures: B* and the run's batch (dotted) at the checkpoints' tokens; each branch's smoothed
    # loss over its fraction of the branch tokens, the mean over its seeds.
    [axes] = plot_cbs(parents, branches, 0.01, 0.5).axes
    b_star, from_one, batch = axes.lines[0], axes.lines[1], axes.lines[-1]
    assert list(b_star.get_xdata()) == [2048, 4096] and list(b_star.get_ydata()) == [8 * float(r[3]) for r in rows]
    assert list(from_one.get_ydata()) == [float(r[5].split()[-1]) for r in rows] and from_one.get_linestyle() == "-."
    assert (list(batch.get_xdata()), list(batch.get_ydata()), batch.get_linestyle()) == ([2048, 4096], [8, 8], ":")
    panels = [ax for ax in plot_cbs_branches(parents, branches, 0.5).axes if ax.lines]
    assert [ax.get_title() for ax in panels] == ["adamw (parent), step 8", "adamw (parent), step 16"]
    for ax, step in zip(panels, (8, 16)):
        assert [line.get_label() for line in ax.lines] == ["k=0.5 (2 seeds)", "k=1 (2 seeds)", "k=2 (2 seeds)"]
        for line, k, n in zip(ax.lines, (0.5, 1.0, 2.0), (8, 4, 2)):  # steps of 1,024 tokens at 8 k x 32 a step
            assert list(line.get_xdata()) == [(i + 1) / n for i in range(n)]
            assert line.get_ydata()[-1] == pytest.approx(
                sum(smoothed_by_hand(logged[step, k, seed]) for seed in (0, 1)) / 2, rel=1e-12)
    # Packed into an archive (no checkpoints; each branch's config file says where it ends: its config.json
    # records no stop_at_step) and read back, the measurement is the folder's.
    pack_runs(runs, run.parent, run.parent / "runs.tar.xz")
    [packed] = cbs.measured_runs(find_runs([run.parent / "runs.tar.xz"]), epsilon=0.01, ema=0.5).values()
    assert [(m.step, m.tokens, m.batch, m.losses) for m in packed] == \
        [(m.step, m.tokens, m.batch, m.losses) for m in measurements]
    # Planned again: nothing to train; another plan into the folder is refused, naming what differs.
    assert branch_here(run) == runs
    with pytest.raises(ConfigError, match=r"holds the branch step 8 k 0.5 seed 0 with other settings \(.*lr"):
        branch_here(run, lr_scaling="linear")


@pytest.mark.parametrize("changes, error", [
    ({"multipliers": [0.3, 1]}, r"multiplier 0.3 of the batch 8 at step 8 is 2.4 sequences"),
    ({"branch_tokens": 1000}, r"--branch-tokens 1000 is not a whole number of steps .* multiple of 512"),
    ({"steps": [24]}, r"the checkpoint of step 24 \(6,144 tokens\) leaves fewer than --branch-tokens 1,024"),
    ({"steps": [9]}, r"has no checkpoint of step 9; its checkpoints are of steps 4, 8, 12, 16, 20, 24"),
    # k = 2 at 512 tokens is 1 step of 16 x 32 tokens, under the 2 steps the betas remember; the least
    # branch tokens of 2 such steps, a whole number of steps of every branch (512), is 1,024. Halving the
    # betas' memory would not do: 0.4 ** 2 still remembers 1 / (1 - 0.16), 2 steps.
    ({"branch_tokens": 512}, r"^the branch k=2 at step 8 trains 1 step, fewer than its beta2 0.5 remembers "
                             r"\(1 / \(1 - beta2\) = 2 steps\): its loss would measure the optimizer state's "
                             r"adjustment to the batch, not the batch. Give --branch-tokens 1,024 or more \(2 steps "
                             r"of this branch\), smaller multipliers$"),
])
def test_what_cannot_branch_is_refused_with_its_fix(parent, changes, error):
    arguments = {"steps": [8], "multipliers": [0.5, 1, 2], "branch_tokens": 1024, "lr_scaling": "sqrt", "betas": (),
                 "seeds": [0], **changes}
    with pytest.raises(ConfigError, match=error):
        cbs.plan(parent, **arguments)


def resolved(optimizer, batch, **settings):
    from training.run_config import resolve_config
    return resolve_config(TrainConfig(optimizer=optimizer, batch_size=batch, block_size=64, max_tokens=1_048_576,
                                      **settings)).config


def test_a_branch_shorter_than_its_decays_memory_is_refused_with_the_fixes():
    # The audit's branch: k = 16 of batch 8 (128 x 64 tokens a step) for 65,536 tokens is 8 steps;
    # AdamW's beta2 0.95 remembers 1 / 0.05 = 20 steps (19.999999999999982 in floats), beta1 0.9 10.
    # Fixes: 20 steps = 163,840 tokens (a multiple of 8,192, k = 16's step: whole steps of every
    # branch of k = 1/4..16), or both betas at their half-life: 0.95 ** 16 = 0.440 remembers
    # 1 / 0.560 = 1.8 steps, 0.9 ** 16 = 0.185 1.2: 2 steps each, within 8.
    assert cbs.decays(resolved("adamw", 128)) == {"beta1": 0.9, "beta2": 0.95}
    assert (cbs.memory(0.95), cbs.memory(0.9), cbs.memory(0.95 ** 16), cbs.memory(0.9 ** 16)) == (20, 10, 2, 2)
    with pytest.raises(ConfigError) as refused:
        cbs.check_length(resolved("adamw", 128), 64, 16, 8, (), 8192)
    assert str(refused.value) == (
        "the branch k=16 at step 64 trains 8 steps, fewer than its beta2 0.95 remembers (1 / (1 - beta2) = 20 "
        "steps): its loss would measure the optimizer state's adjustment to the batch, not the batch. Give "
        "--branch-tokens 163,840 or more (20 steps of this branch), smaller multipliers, or --beta-scaling half-life "
        "--scale-betas beta1,beta2")
    # With them at their half-life the branch is long enough; so is k = 1/4 (512 steps: beta2 ** 0.25 = 0.98726
    # remembers 78.5 steps), and k = 8 at 20 steps, the study's settings.
    cbs.check_length(resolved("adamw", 128, beta1=0.9 ** 16, beta2=0.95 ** 16), 64, 16, 8, ("beta1", "beta2"), 8192)
    cbs.check_length(resolved("adamw", 2, beta2=0.95 ** 0.25), 64, 0.25, 512, ("beta2",), 8192)
    cbs.check_length(resolved("adamw", 64), 64, 8, 20, (), 4096)
    # Muon's momentum counts as its AdamW part's betas do; with beta2 already at its half-life, the fix keeps
    # it and adds the two decays still too long (momentum and beta1, the largest named).
    muon = resolved("muon", 128, beta2=0.95 ** 16)
    assert cbs.decays(muon) == {"momentum": 0.95, "beta1": 0.9, "beta2": 0.95 ** 16}
    with pytest.raises(ConfigError, match=r"fewer than its momentum 0.95 remembers \(1 / \(1 - momentum\) = 20 "
                                          r"steps\).* Give --branch-tokens 163,840 or more \(20 steps of this "
                                          r"branch\), smaller multipliers, or --beta-scaling half-life --scale-betas "
                                          r"beta2,momentum,beta1$"):
        cbs.check_length(muon, 64, 16, 8, ("beta2",), 8192)


def final_only(parent, tmp_path):
    """A copy of the parent that kept its final checkpoint only (as a run trained without
    permanent_checkpoint_interval does)."""
    run = copy_of(parent, tmp_path)
    for step in range(4, 24, 4):
        (run / f"ckpt_{step:08d}.pt").unlink()
    return run


def test_by_default_the_checkpoints_that_leave_the_branch_tokens_branch(parent, tmp_path):
    """Every checkpoint but those too near the run's end (the final one, always, used to refuse the
    default); a run with only its final checkpoint is told how to keep earlier ones."""
    # 6,144 tokens in all: step 20 (5,120 tokens) leaves 1,024, step 24 none.
    branches = cbs.plan(parent, None, [0.5, 1, 2], 1024, "sqrt", (), [0])
    assert sorted({b.step for b in branches}) == [4, 8, 12, 16, 20] and len(branches) == 15
    with pytest.raises(ConfigError, match=r"^the checkpoint of step 24 \(6,144 tokens\) leaves fewer than "
                                          r"--branch-tokens 1,024 of the run's 6,144: it is the run's only checkpoint; "
                                          r"train the run with permanent_checkpoint_interval set"):
        cbs.plan(final_only(parent, tmp_path), None, [0.5, 1, 2], 1024, "sqrt", (), [0])


@pytest.mark.slow  # a process for each command
def test_what_the_command_cannot_take_is_refused_naming_it_and_the_fix(parent, tmp_path):
    final = final_only(parent, tmp_path / "final")
    branching = [str(parent), "--steps", "8", "--branch-tokens", "1024"]
    refused = [  # (the command's arguments, its exit status, the end of its message)
        ([*branching, "--seeds", "0,x"], 2, "argument --seeds: 'x' is not a whole number >= 0: give the seeds (each "
                                            "reads the data from seed x branch tokens on) comma-separated, e.g. 0,1,2"),
        ([*branching, "--seeds", "0,1,0"], 2, "argument --seeds: 0,1,0 gives 0 twice: give each once"),
        ([*branching, "--multipliers", "0,-2"], 2, "argument --multipliers: '0' is not a number > 0: give the batch "
                                                   "multipliers k comma-separated, e.g. 0.25,0.5,1,2,4"),
        ([str(parent), "--branch-tokens=-2048"], 2, "argument --branch-tokens: '-2048' is not a whole number > 0: give "
                                                    "the tokens each branch trains (a whole number of steps of every "
                                                    "branch), e.g. 65536"),
        ([*branching, "--ema", "0"], 2, "argument --ema: '0' is not a number > 0: give the weight of each new loss in "
                                        "the smoothed loss, in (0, 1], e.g. 0.5"),
        ([*branching, "--ema", "1.5"], 2, "--ema 1.5 is above 1: give the weight of each new loss in the smoothed "
                                          "loss, in (0, 1], e.g. 0.5"),
        ([str(parent / "ckpt.pt"), "--branch-tokens", "1024"], 2,
         f"argument run: {parent / 'ckpt.pt'} is a file: give the run folder that holds the checkpoints, {parent}"),
        ([str(parent / "missing"), "--branch-tokens", "1024"], 2,
         f"argument run: {parent / 'missing'} does not exist: give a run folder with numbered checkpoints "
         f"(ckpt_<step>.pt)"),
        ([str(final), "--branch-tokens", "1024"], 1,
         "cbs: the checkpoint of step 24 (6,144 tokens) leaves fewer than --branch-tokens 1,024 of the run's 6,144: it "
         "is the run's only checkpoint; train the run with permanent_checkpoint_interval set (a checkpoint kept every "
         "that many steps) to branch from within it"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [subprocess.Popen([sys.executable, "-m", "scripts.cbs", *arguments], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for arguments, _, _ in refused]  # (at once: each process is mostly its imports)
    for process, (arguments, status, message) in zip(processes, refused):
        stderr = process.communicate(timeout=120)[1]
        last_line = stderr.strip().splitlines()[-1]
        assert (process.returncode, last_line.split(": error: ")[-1]) == (status, message), (arguments, stderr)
    assert not (parent / "branches").exists() and not (final / "branches").exists()


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


def test_the_k1_branch_of_a_scheduled_parent_continues_it_bitwise(byte_shards, tmp_path):
    # A parent whose batch doubles (4 -> 8 at 512 tokens: step 4) with its lr by sqrt and its betas at
    # their half-life (beta ** 2 from then on): a branch from step 12 takes the phase's batch, lr and
    # betas, not the first phase's, so the k = 1 branch is the parent's continuation, bitwise.
    scheduled = {"--run_name": "scheduled", "--batch_size": "4", "--batch_schedule": "[(0, 4), (512, 8)]",
                 "--batch_half_life_betas": "beta1,beta2", "--extra_parts": "''"}
    args = [arg for arg in PARENT if arg.split("=")[0] not in scheduled]
    train_here(*args, *(f"{key}={value}" for key, value in scheduled.items()), f"--data_dir={byte_shards}",
               f"--out_dir={tmp_path}")
    run = tmp_path / "scheduled"
    [branch] = cbs.plan(run, [12], [1.0], 1024, "sqrt", (), [0])
    betas = (0.4 ** 2.0, 0.5 ** 2.0)  # (the parent's betas, at twice the first batch)
    assert (branch.config.batch_size, (branch.config.beta1, branch.config.beta2)) == (8, betas)
    # By default (betas None) a branch follows the parent's own rule, its batch_half_life_betas: k = 2
    # takes beta ** 2 of the phase's betas, and its config records the rule it trained with; asked for
    # none (--beta-scaling none: ()), it keeps the phase's betas and records no rule.
    [own_rule] = cbs.plan(run, [12], [2.0], 1024, "sqrt", None, [0])
    assert (own_rule.config.beta1, own_rule.config.beta2) == (betas[0] ** 2.0, betas[1] ** 2.0)
    assert own_rule.config.batch_half_life_betas == "beta1,beta2"
    [unscaled] = cbs.plan(run, [12], [2.0], 1024, "sqrt", (), [0])
    assert ((unscaled.config.beta1, unscaled.config.beta2), unscaled.config.batch_half_life_betas) == (betas, "")
    branch_here(run, steps=(12,), multipliers=(1.0,), seeds=(0,))
    own, theirs = Checkpoint.load(branch.folder / "ckpt.pt"), Checkpoint.load(run / "ckpt_00000016.pt")
    assert own.step == theirs.step == 16
    assert all(torch.equal(own.model[k], theirs.model[k]) for k in theirs.model)
    for key, state in theirs.optimizer["state"].items():
        assert all(torch.equal(own.optimizer["state"][key][name], value) for name, value in state.items())


def test_a_critical_batch_at_the_end_of_the_multipliers_tried_is_printed_as_a_bound():
    # k* the smallest multiplier tried says only B* <= k x B; the largest, only B* >= k x B.
    losses = {k: {0: 1.0} for k in (0.25, 0.5, 1.0, 2.0, 8.0)}
    m = cbs.Measurement(step=64, tokens=16384, batch=8, losses=losses, k_epsilon=0.25, k_interval=None,
                        k_epsilon_from_one=1.0, k_interval_from_one=None, b_simple=None, differences={})
    row = cbs.table([m], 0.01).splitlines()[2].split(" | ")
    assert row[3:6] == ["0.25", "<= 2", "<= 8"], row
    inner = cbs.Measurement(**{**m.__dict__, "k_epsilon": 0.5, "k_epsilon_from_one": 2.0})
    assert cbs.table([inner], 0.01).splitlines()[2].split(" | ")[3:6] == ["0.5", "4", "16"]
    top = cbs.Measurement(**{**m.__dict__, "k_epsilon": 8.0, "k_epsilon_from_one": 8.0})
    assert cbs.table([top], 0.01).splitlines()[2].split(" | ")[3:6] == ["8", ">= 64", ">= 64"]
    assert "<= and >=" in cbs.table([m], 0.01)  # the note says what a bound means
