"""Replica groups on torchft (training/replicas.py), with the real pieces: torchft's lighthouse
(its Rust binary), one train.py process a group, gloo between them.

- A group killed with SIGKILL mid-run: the other trains on without it (its record says so: one
  participant, half the batch, the tokens lost), the killed group started again takes the live
  group's state and both end with the same weights and optimizer state, bitwise.
- LocalSGD with H = 1 and plain SGD inside, and gradients averaged every step, are data-parallel
  training at the same global batch (a one-process run, a second code path).
- DiLoCo's outer step is a hand computation (float64) from the groups' own weights before each
  meeting: the mean pseudo-gradient through SGD with Nesterov momentum.
- A whole-job restart resumes bitwise: in the middle of a DiLoCo round, and averaging every step
  with Sophia-G (its Hessian pass's gradient averaged across the groups too).
"""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT, TINY_RUN, read_metrics, train_here

pytest.importorskip("torchft", reason="torchft is not installed (requirements-ft.txt)")
pytestmark = pytest.mark.slow

def group_args(byte_shards, out, lighthouse, *extra):
    """A replica group of the tiny run: 2 groups, each of one process with half the batch of 8."""
    return [*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={out}", "--run_name=run", "--batch_size=8",
            "--micro_batch_size=4", "--log_interval=1", "--lr=1e-2", "--replica_groups=2",
            f"--lighthouse={lighthouse}", "--replica_timeout=20.0", *extra]


def start(replica_id: int, args: list, log: Path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, f"--replica_id={replica_id}"], cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "RUST_LOG": "warn", **env},
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    assert process.wait(timeout=timeout) == 0, f"a replica group failed:\n{log.read_text()[-5000:]}"


def run_groups(args: list, folder: Path, **env) -> None:
    """Both groups of ``args`` to the end."""
    folder.mkdir(parents=True, exist_ok=True)
    processes = [start(i, args, folder / f"group{i}.log", **env) for i in range(2)]
    for i, process in enumerate(processes):
        finish(process, folder / f"group{i}.log")


def records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "replicas/participants" in r]


def wait_for(condition, what: str, running: list[tuple[subprocess.Popen, Path]], timeout: float = 60) -> None:
    """Until ``condition()``, while each of ``running``'s (process, log) runs."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for process, log in running:
            assert process.poll() is None, f"a replica group stopped:\n{log.read_text()[-5000:]}"
        time.sleep(0.05)


def logged(run_dir: Path, predicate, at_least: int = 1) -> bool:
    """Whether ``at_least`` of the run's records so far satisfy ``predicate``."""
    try:
        return sum(map(predicate, records(run_dir))) >= at_least
    except (FileNotFoundError, ValueError):  # (not written yet; a line being written)
        return False


def checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "ckpt.pt", weights_only=True)


def test_a_killed_group_leaves_the_others_training_and_rejoins_bitwise(byte_shards, tmp_path, lighthouse):
    args = group_args(byte_shards, tmp_path, lighthouse, "--max_steps=160", "--checkpoint_interval=10",
                      "--extra_parts=tests.replica_parts:Pace")
    survivor_dir, failed_dir = tmp_path / "run" / "replica_0", tmp_path / "run" / "replica_1"
    survivor = start(0, args, tmp_path / "group0.log")
    failed = start(1, args, tmp_path / "group1.log")
    both = [(survivor, tmp_path / "group0.log"), (failed, tmp_path / "group1.log")]
    wait_for(lambda: logged(failed_dir, lambda r: r["step"] >= 15), "group 1's step 15", both)
    failed.send_signal(signal.SIGKILL)
    failed.wait()
    # The survivor trains on alone: no restart, its steps averaging one group's gradients.
    wait_for(lambda: logged(survivor_dir, lambda r: r["replicas/participants"] == 1, at_least=5),
             "steps without group 1", both[:1])
    rejoined = start(1, [*args, "--resume=auto"], tmp_path / "group1_again.log")
    finish(rejoined, tmp_path / "group1_again.log")
    finish(survivor, tmp_path / "group0.log")

    kept, back = checkpoint(survivor_dir), checkpoint(failed_dir)
    assert kept["step"] == back["step"] == 160
    for key, value in kept["model"].items():
        assert torch.equal(value, back["model"][key]), key
    for kept_state, back_state in zip(kept["optimizer"]["state"].values(), back["optimizer"]["state"].values()):
        for name, value in kept_state.items():
            assert torch.equal(value, back_state[name]), name

    # The survivor's record: every step's participants and effective batch (4 sequences a group), the
    # steps without group 1, group 1 back before the end; the tokens trained and lost add up to the run's.
    history = records(survivor_dir)
    assert [r["step"] for r in history] == list(range(1, 161))
    for r in history:
        assert r["replicas/effective_batch"] == 4 * r["replicas/participants"] or r["replicas/dropped"]
        assert r["replicas/tokens_trained"] + r["replicas/tokens_lost"] == r["tokens"]
    alone = [r["step"] for r in history if r["replicas/participants"] == 1]
    assert len(alone) >= 5 and history[-1]["replicas/participants"] == 2
    assert history[-1]["replicas/tokens_lost"] >= len(alone) * 4 * 32  # (half of each step alone: 4 rows of 32)
    # The rejoined group's record goes on from the step it took from the survivor.
    steps = [r["step"] for r in records(failed_dir)]
    assert steps[-1] == 160 and any(b - a > 1 for a, b in zip(steps, steps[1:]))


def final_weights(run_dir: Path) -> dict:
    return {key: value.double() for key, value in checkpoint(run_dir)["model"].items()}


def assert_close(ours: dict, reference: dict, what: str) -> None:
    """Equal up to float32 rounding (a mean of two taken in two orders), relative to the tensor's scale."""
    for key, value in reference.items():
        scale = value.abs().max().item() or 1.0
        assert torch.allclose(ours[key], value, rtol=0, atol=2e-6 * scale), f"{what}: {key}"


@pytest.mark.parametrize("mode", [("--local_steps=1", "--local_method=localsgd"), ()],
                         ids=["localsgd_h1", "every_step"])
def test_localsgd_h1_and_averaging_every_step_are_data_parallel_training(byte_shards, tmp_path, lighthouse, mode):
    common = ["--optimizer=sgd", "--lr=0.5", "--grad_clip=0", "--max_steps=6", "--warmup_steps=2"]
    run_groups(group_args(byte_shards, tmp_path / "groups", lighthouse, *common, *mode), tmp_path)
    # One process, the same global batch of 8 as two micro-batches of 4: the same rows (training/parallel.py).
    train_here(*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path / 'one'}", "--run_name=run",
               "--batch_size=8", "--micro_batch_size=4", "--log_interval=1", *common)
    reference = final_weights(tmp_path / "one" / "run")
    for group in range(2):
        assert_close(final_weights(tmp_path / "groups" / "run" / f"replica_{group}"), reference, f"group {group}")


def test_diloco_meets_as_computed_by_hand_and_a_restart_mid_round_resumes_bitwise(byte_shards, tmp_path, lighthouse):
    """Each meeting's weights are the last meeting's minus 0.7 x the Nesterov step (momentum 0.9) of
    the groups' mean pseudo-gradient, computed here in float64 from each group's own weights before
    the meeting (tests/replica_parts.py records them). Both groups stopped at step 6, 2 steps into
    the second round of 4, and resumed from their checkpoints end as the uninterrupted run, bitwise,
    their managers' state too."""
    lr, momentum, local_steps = 0.7, 0.9, 4
    args = group_args(byte_shards, tmp_path, lighthouse, "--optimizer=adamw", "--max_steps=8",
                      f"--local_steps={local_steps}", "--extra_parts=tests.replica_parts:RecordWeights")
    run_groups([*args, "--run_name=whole"], tmp_path / "whole", RECORD_DIR=str(tmp_path / "record"))
    scratch = str(tmp_path / "scratch")  # (the interrupted run's records)
    run_groups([*args, "--run_name=halves", "--stop_at_step=6"], tmp_path / "first", RECORD_DIR=scratch)
    run_groups([*args, "--run_name=halves", "--resume"], tmp_path / "second", RECORD_DIR=scratch)

    def load(group: int, name: str) -> dict:
        return torch.load(tmp_path / "record" / f"replica_{group}" / f"{name}.pt", weights_only=True)

    met = load(0, "initial")  # (every group starts from the seed's weights)
    assert all(torch.equal(met[k], load(1, "initial")[k]) for k in met)
    buffers = None
    for meeting in (local_steps, 2 * local_steps):
        # The groups trained apart since the last meeting: different weights.
        inner = [load(g, f"inner_{meeting}") for g in range(2)]
        key = "transformer.h.0.attn.c_attn.weight"
        assert not torch.equal(inner[0][key], inner[1][key])
        pseudo = {k: met[k] - (inner[0][k] + inner[1][k]) / 2 for k in met}
        buffers = pseudo if buffers is None else {k: momentum * buffers[k] + pseudo[k] for k in met}
        met = {k: met[k] - lr * (pseudo[k] + momentum * buffers[k]) for k in met}  # (Nesterov)
        for g in range(2):
            assert_close(load(g, f"after_{meeting}"), met, f"group {g} after meeting {meeting}")
    for group in range(2):
        whole, halves = (checkpoint(tmp_path / name / f"replica_{group}") for name in ("whole", "halves"))
        assert all(torch.equal(value, halves["model"][key]) for key, value in whole["model"].items())
        assert whole["parts"]["replica_groups"]["manager"] == halves["parts"]["replica_groups"]["manager"] == {
            "step": 2, "batches_committed": 4}


def test_averaging_every_step_resumes_bitwise_with_sophia_g_s_pass_across_the_groups(byte_shards, tmp_path,
                                                                                      lighthouse):
    """Both groups stopped at step 6 and resumed end as the uninterrupted run, bitwise, their
    managers' state too; Sophia-G's Hessian pass every 2 steps (``hessian_interval``) averages its
    gradient across the groups as a step's is, so the groups' weights stay equal."""
    args = group_args(byte_shards, tmp_path, lighthouse, "--max_steps=8", "--optimizer=sophiag",
                      "--optimizer_options={'hessian_interval': 2}")
    run_groups([*args, "--run_name=whole"], tmp_path / "whole")
    run_groups([*args, "--run_name=halves", "--stop_at_step=6"], tmp_path / "first")
    run_groups([*args, "--run_name=halves", "--resume"], tmp_path / "second")
    for group in range(2):
        whole, halves = (checkpoint(tmp_path / name / f"replica_{group}") for name in ("whole", "halves"))
        assert all(torch.equal(value, halves["model"][key]) for key, value in whole["model"].items())
        assert whole["parts"]["replica_groups"]["manager"] == halves["parts"]["replica_groups"]["manager"] == {
            "step": 8, "batches_committed": 16}
    groups = [checkpoint(tmp_path / "whole" / f"replica_{group}")["model"] for group in range(2)]
    assert all(torch.equal(value, groups[1][key]) for key, value in groups[0].items())


def test_the_local_steps_study_s_report_and_figures_come_again_from_its_archive(tmp_path):
    """scripts/replica_study.py --report: the committed report.md (docs/results/local_steps.md's
    tables, held there by test_doc_numbers) from the committed archive alone, and both figures."""
    committed = ROOT / "docs" / "replica_study"
    shutil.copy(committed / "runs.tar.xz", tmp_path / "runs.tar.xz")
    subprocess.run([sys.executable, "-m", "scripts.replica_study", "--report", str(tmp_path / "runs.tar.xz")], cwd=ROOT,
                   check=True, capture_output=True)
    assert (tmp_path / "report.md").read_text() == (committed / "report.md").read_text()
    assert {p.name for p in (tmp_path / "figures").iterdir()} == {"loss_vs_tokens.png", "loss_vs_bytes.png"}
