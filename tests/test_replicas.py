"""Replica groups on torchft (training/replicas.py), with the real pieces: torchft's lighthouse
(its Rust binary), one train.py process a group, gloo between them.

- On a busy machine (six processes spinning beside the test), a group stalled (SIGSTOP) past the
  lighthouse's timeouts, then killed with SIGKILL: the other trains on without it (its record says
  so: one participant, half the batch, the tokens lost), the killed group started again takes the
  live group's state and both end with the same weights and optimizer state, bitwise.
- That the groups train one model (training/replica_checks.py): a group resumed after the others
  finished does not train alone; one restarted with another lr or optimizer is refused before any
  state moves; groups that meet with different weights at one step stop, naming them; at the DiLoCo
  meeting where a group rejoins, its copied share is not counted.
- The lighthouse killed and started again within replica_timeout: survived; killed for good: every
  group ends with one line and its resume command, which continues the run.
- LocalSGD with H = 1 and plain SGD inside, and gradients averaged every step, are data-parallel
  training at the same global batch (a one-process run, a second code path).
- DiLoCo's outer step is a hand computation (float64) from the groups' own weights before each
  meeting: the mean pseudo-gradient through SGD with Nesterov momentum.
- A whole-job restart resumes bitwise: in the middle of a DiLoCo round, and averaging every step
  with Sophia-G (its Hessian pass's gradient averaged across the groups too).
"""
import os
import re
import shlex
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


@pytest.fixture
def busy_machine():
    """Six processes spinning beside the test on the machine's cores: a busy node, on which every
    process of the test waits its turn (the case in which groups used to end with different models)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(6)]
    yield
    for spinner in spinners:
        spinner.kill()
        spinner.wait()


def last_step(run_dir: Path) -> int:
    """The run's last logged step so far (0 before its first)."""
    try:
        return max((r["step"] for r in records(run_dir)), default=0)
    except (FileNotFoundError, ValueError):  # (not written yet; a line being written)
        return 0


def kill_group_1_after_its_checkpoint(step: int, args: list, tmp_path: Path, hold: Path | None = None):
    """Both groups of ``args`` started, group 1 killed (SIGKILL) once its checkpoint of ``step`` is
    written, from when group 0 is held back (``hold``: its steps slower, tests/replica_parts.py's
    Pace). Returns group 0's process and group 1's last logged step."""
    failed_dir = tmp_path / "run" / "replica_1"
    survivor = start(0, args, tmp_path / "group0.log", **({"HOLD_FILE": str(hold)} if hold else {}))
    failed = start(1, args, tmp_path / "group1.log")
    both = [(survivor, tmp_path / "group0.log"), (failed, tmp_path / "group1.log")]
    # (written: ckpt.pt names it, the run's last act of a save; the numbered file alone comes a moment before)
    wait_for(lambda: (failed_dir / "ckpt.pt").resolve().name == f"ckpt_{step:08d}.pt",
             f"group 1's step-{step} checkpoint", both)
    if hold:
        hold.touch()
    failed.send_signal(signal.SIGKILL)
    failed.wait()
    return survivor, last_step(failed_dir)


def test_a_stalled_and_a_killed_group_leave_the_other_training_and_rejoin_bitwise_on_a_busy_machine(
        byte_shards, tmp_path, lighthouse, busy_machine):
    """Group 1 stopped (SIGSTOP) for 3 s, past the lighthouse's heartbeat and join timeouts (1 s), then
    killed with SIGKILL after its next checkpoint; group 0 trains on alone, held back (slower steps)
    from the stall until group 1, restarted with --resume=auto, has joined it: whatever the load, the
    restarted group finds the job still training. Both end at step 160 with the same weights and
    optimizer state, and their records' final weights digests agree."""
    hold = tmp_path / "hold"
    args = group_args(byte_shards, tmp_path, lighthouse, "--max_steps=160", "--checkpoint_interval=10",
                      "--extra_parts=tests.replica_parts:Pace")
    survivor_dir, failed_dir = tmp_path / "run" / "replica_0", tmp_path / "run" / "replica_1"
    survivor = start(0, args, tmp_path / "group0.log", HOLD_FILE=str(hold))
    failed = start(1, args, tmp_path / "group1.log")
    both = [(survivor, tmp_path / "group0.log"), (failed, tmp_path / "group1.log")]
    wait_for(lambda: last_step(failed_dir) >= 5, "group 1's step 5", both)
    hold.touch()
    failed.send_signal(signal.SIGSTOP)  # (a stalled node: its heartbeat stops, its process lives)
    time.sleep(3)
    failed.send_signal(signal.SIGCONT)
    stalled_at = last_step(failed_dir)
    wait_for(lambda: any(int(p.stem[5:]) > stalled_at for p in failed_dir.glob("ckpt_*.pt")),
             "group 1's checkpoint after the stall", both)
    failed.send_signal(signal.SIGKILL)
    failed.wait()
    killed_at = last_step(failed_dir)
    # The survivor trains on alone: no restart, its steps averaging one group's gradients.
    wait_for(lambda: logged(survivor_dir, lambda r: r["replicas/participants"] == 1 and r["step"] > killed_at,
                            at_least=5), "steps without group 1", both[:1])
    rejoined = start(1, [*args, "--resume=auto"], tmp_path / "group1_again.log")
    wait_for(lambda: last_step(failed_dir) > killed_at, "group 1 back",
             [both[0], (rejoined, tmp_path / "group1_again.log")], timeout=120)
    hold.unlink()
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
    # The rejoined group's record goes on from the step it took from the survivor; both end with one model.
    steps = [r["step"] for r in records(failed_dir)]
    assert steps[-1] == 160 and any(b - a > 1 for a, b in zip(steps, steps[1:]))
    assert records(survivor_dir)[-1]["replicas/weights_sha256"] == records(failed_dir)[-1]["replicas/weights_sha256"]


def test_a_group_resumed_after_the_others_finished_does_not_train_alone(byte_shards, tmp_path, lighthouse):
    """The case that made two models on a busy machine: group 1 killed after its step-10 checkpoint,
    group 0 finishing the run before group 1 is back. Group 1, resumed, finds no group to rejoin:
    alone it would train a second model from step 10 under the job's name. It waits rejoin_timeout,
    then stops with a message, its checkpoint as it was; --rejoin_timeout=0 trains it alone on purpose."""
    args = group_args(byte_shards, tmp_path, lighthouse, "--max_steps=30", "--checkpoint_interval=10",
                      "--extra_parts=tests.replica_parts:Pace")
    failed_dir = tmp_path / "run" / "replica_1"
    survivor, _ = kill_group_1_after_its_checkpoint(10, args, tmp_path)
    finish(survivor, tmp_path / "group0.log")
    again = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--replica_id=1", "--resume=auto",
                            "--rejoin_timeout=2"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 1
    assert re.search(r"train.py: replica group 1 resumed at step 10 and met no other group within rejoin_timeout=2 s "
                     r"\(a longer one waits longer\): .* start it with --rejoin_timeout=0$", again.stderr.strip()), again.stderr
    assert checkpoint(failed_dir)["step"] == 10


def test_a_group_restarted_with_another_lr_or_optimizer_is_refused_before_any_state_moves(byte_shards, tmp_path,
                                                                                          lighthouse):
    """Group 1 killed after its step-10 checkpoint, then started again with another lr (refused by the
    resume, which says a change is for every group; then with --allow_changes=lr), and again as a new
    run with AdamW against the job's MERIT: the last two are refused at their first quorum, its message naming the key and both values and the whole-job restart; group 0
    drops the step each refusal interrupted and trains on alone, its record never counting group 1."""
    hold = tmp_path / "hold"
    args = group_args(byte_shards, tmp_path, lighthouse, "--max_steps=120", "--checkpoint_interval=10",
                      "--optimizer=merit", "--extra_parts=tests.replica_parts:Pace")
    survivor_dir = tmp_path / "run" / "replica_0"
    survivor, _ = kill_group_1_after_its_checkpoint(10, args, tmp_path, hold)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    refused = "replica group 1 is refused by the job's replica groups before any state moved between them: "
    for change, message in (
            # (the resume's own check first: a change is for every group)
            (["--resume=auto", "--lr=5e-4"], r"resuming .* at step 10 would change what the run trains \(lr: "
             r"checkpoint 0\.01, now 0\.0005\): .*--allow_changes=lr in a whole-job restart: every replica group "
             r"stopped and started with it \(a group restarted alone with a change is refused by the others when it "
             r"joins\)"),
            (["--resume=auto", "--lr=5e-4", "--allow_changes=lr"],
             refused + r"lr: 0\.0005 in group 1, 0\.01 in group 0\. .*--allow_changes=lr"),
            (["--overwrite", "--optimizer=adamw"],
             refused + r".*optimizer: 'adamw' in group 1, 'merit' in group 0;.*--allow_changes=.*optimizer.*")):
        joiner = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--replica_id=1", *change], cwd=ROOT,
                                capture_output=True, text=True, timeout=120, env=env)
        assert joiner.returncode == 1, joiner.stderr[-3000:]
        last = joiner.stderr.strip().splitlines()[-1]
        assert re.fullmatch("train.py: " + message, last), last
        assert survivor.poll() is None, (tmp_path / "group0.log").read_text()[-3000:]
    hold.unlink()
    finish(survivor, tmp_path / "group0.log")
    said = (tmp_path / "group0.log").read_text()
    assert said.count("replica group 0 refused group 1, which trains something else") == 2
    history = records(survivor_dir)
    assert history[-1]["step"] == 120 and history[-1]["replicas/dropped"] >= 2  # (two refusals'; the kill's)
    # Every step after the kill trained group 0's share alone, or none: group 1's never reached its weights.
    assert all(r["replicas/effective_batch"] in (0, 4) for r in history if r["step"] > 15)


def test_a_lighthouse_restarted_within_the_timeout_is_survived_and_one_gone_for_good_ends_every_group_resumably(
        byte_shards, tmp_path, lighthouse_process):
    """The lighthouse killed (SIGKILL) mid-run and started again on its port 2 s later: both groups
    wait out the gap in their quorum and end at step 60 with the same weights. Killed for good: each
    group ends within replica_timeout with one line that names the lighthouse and its resume command;
    the lighthouse started again and both groups resumed with those commands, they end as one model.
    (The survived gap is given 30 s: on a busy machine the new lighthouse's start and the groups'
    reconnection backoff take seconds; the lost one 8 s, the wait every group then sits out.)"""
    address = lighthouse_process.address
    args = group_args(byte_shards, tmp_path, address, "--max_steps=60", "--checkpoint_interval=10",
                      "--extra_parts=tests.replica_parts:Pace")

    def groups(run_name: str, logs: str) -> list[tuple[subprocess.Popen, Path]]:
        timeout = "--replica_timeout=30.0" if run_name == "restarted" else "--replica_timeout=8.0"
        return [(start(i, [*args, f"--run_name={run_name}", timeout], tmp_path / f"{logs}{i}.log"),
                 tmp_path / f"{logs}{i}.log") for i in range(2)]

    def digests(run_name: str) -> list[str]:
        return [records(tmp_path / run_name / f"replica_{i}")[-1]["replicas/weights_sha256"] for i in range(2)]

    running = groups("restarted", "restarted")
    wait_for(lambda: last_step(tmp_path / "restarted" / "replica_0") >= 10, "step 10", running)
    lighthouse_process.kill()
    time.sleep(2)
    lighthouse_process.start()
    for process, log in running:
        finish(process, log)
    assert digests("restarted")[0] == digests("restarted")[1]
    assert last_step(tmp_path / "restarted" / "replica_0") == 60

    running = groups("lost", "lost")
    wait_for(lambda: (tmp_path / "lost" / "replica_0" / "ckpt_00000020.pt").exists(), "step 20's checkpoint", running)
    lighthouse_process.kill()
    resumes = []
    for i, (process, log) in enumerate(running):
        assert process.wait(timeout=60) == 1
        last = log.read_text().strip().splitlines()[-1]
        assert re.fullmatch(rf"train.py: the lighthouse at {address} does not answer within replica_timeout=8 s "
                            rf"\(torchft: .*\): every group stops here\. Start the lighthouse again on its address "
                            rf"\(torchft_lighthouse --min_replicas N --bind \[::\]:{lighthouse_process.port}\), then "
                            rf"every group with --resume; resume this group with python train\.py .*--replica_id={i} "
                            rf"--resume", last), last
        resumes.append(shlex.split(last.split("resume this group with ")[1]))
    lighthouse_process.start()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    resumed = [(subprocess.Popen([sys.executable, *command[1:]], cwd=ROOT, stderr=subprocess.STDOUT,
                                 stdout=(tmp_path / f"again{i}.log").open("w"), env=env), tmp_path / f"again{i}.log")
               for i, command in enumerate(resumes)]
    for process, log in resumed:
        finish(process, log)
    assert digests("lost")[0] == digests("lost")[1]
    assert last_step(tmp_path / "lost" / "replica_0") == 60


def test_groups_that_meet_with_different_weights_at_the_same_step_stop_naming_them(byte_shards, tmp_path, lighthouse):
    """Two groups at the same committed step with different weights, which torchft takes for one
    model (it moves state only to a group behind): both trained together to step 20, then each alone
    to step 30 (--rejoin_timeout=0: on purpose), then resumed together. At their first quorum they
    compare their weights' fingerprints and stop, naming the groups, the step and the difference."""
    args = group_args(byte_shards, tmp_path, lighthouse, "--max_steps=40", "--checkpoint_interval=10")
    run_groups([*args, "--stop_at_step=20"], tmp_path / "together")
    for group in range(2):
        alone = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, f"--replica_id={group}", "--resume",
                                "--rejoin_timeout=0", "--stop_at_step=30"], cwd=ROOT, capture_output=True, text=True,
                               timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert alone.returncode == 0, alone.stderr[-3000:]
    met = [start(group, [*args, "--resume"], tmp_path / f"met{group}.log") for group in range(2)]
    for group, process in enumerate(met):
        assert process.wait(timeout=120) == 1
        last = (tmp_path / f"met{group}.log").read_text().strip().splitlines()[-1]
        assert re.fullmatch(r"train.py: replica groups hold different weights at step 30: the weights differ between "
                            r"group 0 \| group 1: \S+'s sum(?: of squares)? by \S+ of its scale\. They no longer train "
                            r"one model, and this run stops; .*", last), last
    assert [checkpoint(tmp_path / "run" / f"replica_{group}")["step"] for group in range(2)] == [30, 30]


def test_at_the_diloco_meeting_where_a_group_rejoins_its_copied_share_is_not_counted(byte_shards, tmp_path,
                                                                                     lighthouse):
    """DiLoCo (H = 4), group 1 killed after its step-8 checkpoint and restarted: it trains to its next
    meeting, where it takes group 0's state, so its pseudo-gradient there is a copy of group 0's. Both
    groups' records of that meeting say 2 participants but one share trained (4 sequences, not 8);
    the meetings after it count both."""
    hold = tmp_path / "hold"
    args = group_args(byte_shards, tmp_path, lighthouse, "--max_steps=60", "--local_steps=4",
                      "--checkpoint_interval=4", "--optimizer=adamw", "--extra_parts=tests.replica_parts:Pace")
    survivor_dir, failed_dir = tmp_path / "run" / "replica_0", tmp_path / "run" / "replica_1"
    survivor, killed_at = kill_group_1_after_its_checkpoint(8, args, tmp_path, hold)
    rejoined = start(1, [*args, "--resume=auto"], tmp_path / "group1_again.log")
    wait_for(lambda: last_step(failed_dir) > killed_at + 4, "group 1 back",
             [(survivor, tmp_path / "group0.log"), (rejoined, tmp_path / "group1_again.log")], timeout=120)
    hold.unlink()
    finish(rejoined, tmp_path / "group1_again.log")
    finish(survivor, tmp_path / "group0.log")
    for run_dir in (survivor_dir, failed_dir):
        meetings = [r for r in records(run_dir) if r["step"] % 4 == 0 and r["step"] > killed_at]
        rejoin = next(r for r in meetings if r["replicas/participants"] == 2)
        assert rejoin["replicas/effective_batch"] == 4, rejoin
        assert all(r["replicas/effective_batch"] == 8 for r in meetings if r["step"] > rejoin["step"])
        assert meetings[-1]["step"] == 60
    assert records(survivor_dir)[-1]["replicas/weights_sha256"] == records(failed_dir)[-1]["replicas/weights_sha256"]


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
