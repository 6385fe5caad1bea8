"""Multi-node launches on one machine: two torchrun agents meeting in a c10d rendezvous on
127.0.0.1 train exactly as one node's two ranks; scripts/slurm/train.sbatch, run by bash under a
fake SLURM (srun, scancel and scontrol shims), launches such a run, and on USR1 has it save,
requeues the job, and the requeued job resumes it to the end."""

import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from helpers import ROOT, TINY, run_train, train_here
from training.checkpoint import CHECKPOINT_NAME, Checkpoint, load_model

pytestmark = pytest.mark.slow  # torchrun agents, a fake SLURM, signals: real processes throughout

SBATCH = ROOT / "scripts" / "slurm" / "train.sbatch"
TIMEOUT = 240  # a hung rendezvous or collective fails the test instead of blocking it

# A tiny float32 model without dropout, 2 micro-batches of 2 per step (on 2 ranks: no accumulation).
# The optimizer's torch reference: these runs build no C++ kernels, so killing one (on a failure, or
# srun's --kill-on-bad-exit) never leaves torch's extension-build lock behind for later runs.
SETTINGS = dict(TINY, dtype="float32", device="cpu", batch_size=4, micro_batch_size=2, lr=0.01, min_lr=0.001,
                warmup_steps=2, log_interval=1, optim_backend="torch")


def overrides(data_dir, out_dir, **extra) -> list[str]:
    return [f"--{key}={value!r}" for key, value in {**SETTINGS, "data_dir": str(data_dir), "out_dir": str(out_dir),
                                                    **extra}.items()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc; torchrun starts its workers in sessions of their own,
    so a process group does not hold them)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    found, pending = [], [pid]
    while pending:
        pid = pending.pop()
        kids = [child for child, parent in parents.items() if parent == pid]
        found += kids
        pending += kids
    return found


@contextmanager
def started(*commands: list[str], **popen):
    """Start the commands, each with its output to a file (a pipe nobody reads while the test polls
    could fill and stall them); on leaving, SIGKILL whatever of them and their descendants still
    runs: a failed or hung launch leaves no agents or workers behind."""
    procs = []
    try:
        for command in commands:
            output = tempfile.TemporaryFile("w+")
            procs.append(subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True, **popen))
            procs[-1].output = output
        yield procs
    finally:
        for pid in [pid for proc in procs for pid in _descendants(proc.pid)] + [proc.pid for proc in procs]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            proc.wait()
            proc.output.close()


def output_of(proc: subprocess.Popen) -> str:
    proc.output.seek(0)
    return proc.output.read()


def finish(*procs: subprocess.Popen) -> str:
    """The started commands' output once all exit 0; fails as soon as one exits otherwise (its
    peers may wait for it forever), or after TIMEOUT."""
    deadline = time.time() + TIMEOUT
    while True:
        for proc in procs:
            assert proc.poll() in (None, 0), f"exit {proc.returncode}:\n{output_of(proc)[-5000:]}"
        if all(proc.poll() == 0 for proc in procs):
            return "".join(output_of(proc) for proc in procs)
        assert time.time() < deadline, "timed out:\n" + "\n".join(output_of(proc)[-3000:] for proc in procs)
        time.sleep(0.1)


def records(run_dir: Path) -> list[dict]:
    """The run's metrics log, its complete lines (one being written has no newline yet)."""
    log = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in log.read_text().split("\n")[:-1]] if log.exists() else []


def test_two_agents_rendezvous_on_localhost_and_match_one_node(byte_shards, tmp_path):
    args = overrides(byte_shards, tmp_path, max_steps=3)
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
             f"--rdzv_endpoint=127.0.0.1:{free_port()}", f"--rdzv_id={uuid.uuid4().hex}", str(ROOT / "train.py"),
             *args, "--run_name='two_nodes'"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with started(agent, agent, cwd=ROOT, env=env) as agents:
        output = finish(*agents)
    assert "micro 2 x 2 ranks x 1 accumulation" in output  # both agents' workers joined one world
    run_train(*args, "--run_name='one_node'", nproc=2)

    two, one = (Checkpoint.load(tmp_path / name / CHECKPOINT_NAME) for name in ("two_nodes", "one_node"))
    assert two.step == one.step == 3 and len(two.rng) == len(one.rng) == 2  # (one RNG state per rank)
    # The same two ranks with the same batches and the same gloo reduction of two gradients: bitwise.
    assert two.model.keys() == one.model.keys()
    for name in one.model:
        assert torch.equal(two.model[name], one.model[name]), name
    assert [r["train/loss"] for r in records(tmp_path / "two_nodes") if "train/loss" in r] == [
        r["train/loss"] for r in records(tmp_path / "one_node") if "train/loss" in r]


# The shims of a fake SLURM whose nodes are all this machine. srun starts its one task per node
# and, as srun does, kills the step with SIGKILL when a task fails (--kill-on-bad-exit) or when it
# gets a SIGTERM itself; a step is every process below srun (slurmstepd's container). scancel
# --signal=SIG signals the step's processes, not the batch shell; scontrol shows the job's hosts
# and requeues it. scancel and scontrol requeue log their calls.
SRUN = """#!{python}
import os, signal, subprocess, sys, time
from pathlib import Path
{descendants}
def kill_step(*_):
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
signal.signal(signal.SIGTERM, kill_step)
Path(os.environ["FAKE_SLURM_STEP"]).write_text(str(os.getpid()))
args = sys.argv[1:]
while args[0].startswith("-"):  # srun's own options (the script writes them as --name=value)
    args.pop(0)
tasks = [subprocess.Popen(args, env={{**os.environ, "SLURM_NODEID": str(node), "SLURM_PROCID": str(node),
                                     "SLURM_LOCALID": "0"}}) for node in range(int(os.environ["SLURM_NNODES"]))]
while any(task.poll() is None for task in tasks):
    if any(task.poll() not in (None, 0) for task in tasks):
        kill_step()
    time.sleep(0.1)
sys.exit(max(abs(task.returncode) for task in tasks))
"""

SCANCEL = """#!{python}
import os, signal, sys
from pathlib import Path
{descendants}
*options, job = sys.argv[1:]
with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
    log.write(" ".join(["scancel", *options, job]) + "\\n")
assert job == os.environ["SLURM_JOB_ID"] and len(options) == 1 and options[0].startswith("--signal="), sys.argv
signum = getattr(signal, "SIG" + options[0].split("=", 1)[1].removeprefix("SIG"))
for pid in _descendants(int(Path(os.environ["FAKE_SLURM_STEP"]).read_text())):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
"""

SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show hostnames") [[ "$3" == "$SLURM_JOB_NODELIST" ]] && for _ in $(seq "$SLURM_NNODES"); do echo 127.0.0.1; done ;;
  requeue*) echo "scontrol $*" >> "$FAKE_SLURM_LOG" ;;
  *) echo "scontrol shim: unexpected $*" >&2; exit 1 ;;
esac
"""


def fake_slurm(tmp_path: Path) -> dict:
    """The environment of a 2-node job's batch shell, 1 GPU a node, with the shims first on PATH."""
    shims = tmp_path / "bin"
    shims.mkdir()
    shared = dict(python=sys.executable, descendants=inspect.getsource(_descendants))
    for name, text in (("srun", SRUN.format(**shared)), ("scancel", SCANCEL.format(**shared)), ("scontrol", SCONTROL)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    return {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", "PYTHON": sys.executable, "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2",
            "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_GPUS_ON_NODE": "1", "SLURM_CPUS_PER_TASK": "1",
            "SLURM_SUBMIT_DIR": str(ROOT), "MASTER_PORT": str(free_port()),
            "FAKE_SLURM_LOG": str(tmp_path / "slurm.log"), "FAKE_SLURM_STEP": str(tmp_path / "step.pid")}


def tiny_config(tmp_path: Path, byte_shards: Path, max_steps: int) -> Path:
    config = tmp_path / "tiny.py"
    config.write_text("".join(f"{key} = {value!r}\n" for key, value in {**SETTINGS, "data_dir": str(byte_shards),
                                                                          "max_steps": max_steps}.items()))
    return config


def test_the_train_sbatch_script_launches_a_multi_node_run(byte_shards, tmp_path):
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0
    env = fake_slurm(tmp_path)
    # Run from elsewhere: the script goes to $SLURM_SUBMIT_DIR itself, as under sbatch.
    command = ["bash", str(SBATCH), str(tiny_config(tmp_path, byte_shards, max_steps=3)),
               f"--out_dir={str(tmp_path)!r}"]
    with started(command, cwd=tmp_path, env=env) as (job,):
        output = finish(job)
    assert f"2 nodes x 1 GPUs, rendezvous 127.0.0.1:{env['MASTER_PORT']}" in output
    assert "micro 2 x 2 ranks x 1 accumulation" in output  # the two srun tasks' agents made one world
    state = Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME)
    assert state.step == 3 and len(state.rng) == 2
    assert state.config["resume"] == "auto"  # the script's --resume=auto
    assert not (tmp_path / "slurm.log").exists()  # nothing signalled or requeued


def test_usr1_saves_requeues_and_the_requeued_job_resumes_to_the_end(byte_shards, tmp_path):
    env = fake_slurm(tmp_path)
    steps = 100
    command = ["bash", str(SBATCH), str(tiny_config(tmp_path, byte_shards, max_steps=steps)),
               f"--out_dir={str(tmp_path)!r}"]
    with started(command, cwd=tmp_path, env=env) as (job,):
        # Signal once training runs (the batch shell is then in `wait`, its trap set).
        deadline = time.time() + TIMEOUT
        training = False
        while job.poll() is None and time.time() < deadline and not training:
            training = any("train/loss" in r for r in records(tmp_path / "default"))
            time.sleep(0.05)
        assert training and job.poll() is None, output_of(job)[-5000:]
        job.send_signal(signal.SIGUSR1)  # what SLURM's --signal=B:USR1@120 sends the batch shell
        output = finish(job)
    assert (tmp_path / "slurm.log").read_text().splitlines() == ["scancel --signal=TERM 4242",
                                                                 "scontrol requeue 4242"]
    assert "SIGTERM received" in output
    saved = Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME).step
    assert 1 <= saved < steps, output[-3000:]

    # The requeued job: the same script, the same arguments.
    with started(command, cwd=tmp_path, env=env) as (job,):
        output = finish(job)
    assert "resumed" in output and f"at step {saved}" in output and "micro 2 x 2 ranks" in output
    state = Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME)
    assert state.step == steps and len(state.rng) == 2
    assert [r["step"] for r in records(tmp_path / "default") if "train/loss" in r] == list(range(1, steps + 1))
    assert len((tmp_path / "slurm.log").read_text().splitlines()) == 2  # nothing more signalled or requeued


def array_task(tmp_path: Path, task: int, lighthouse: str) -> dict:
    """The environment of task ``task`` of a 2-task array job (its own fake SLURM, job id and port)."""
    (tmp_path / f"task{task}").mkdir(exist_ok=True)
    return {**fake_slurm(tmp_path / f"task{task}"), "SLURM_JOB_ID": str(4300 + task), "SLURM_ARRAY_TASK_ID": str(task),
            "SLURM_ARRAY_TASK_COUNT": "2", "TORCHFT_LIGHTHOUSE": lighthouse}


@pytest.mark.parametrize("layout", [[], ["--fsdp"]], ids=["ddp", "fsdp"])
def test_an_array_job_is_replica_groups_of_two_nodes_each(byte_shards, tmp_path, lighthouse, layout):
    """Submitted as an array, each task is one replica group (torchft): here 2 groups of 2 one-rank
    nodes, DDP (or FSDP2) inside each group and torchft's average across them, which together train
    as one process does at the same global batch of 8 (each of the 4 ranks its 2 rows a step)."""
    config = tiny_config(tmp_path, byte_shards, max_steps=4)
    command = ["bash", str(SBATCH), str(config), f"--out_dir={str(tmp_path)!r}", "--batch_size=8", *layout]
    with started(command, cwd=tmp_path, env=array_task(tmp_path, 0, lighthouse)) as (first,), \
            started(command, cwd=tmp_path, env=array_task(tmp_path, 1, lighthouse)) as (second,):
        output = finish(first, second)
    assert "replica group 1 of 2, lighthouse " + lighthouse in output
    assert "micro 2 x 4 ranks x 1 accumulation" in output  # (each group's 2 ranks, times the 2 groups)
    assert f"({'fsdp_replicas' if layout else 'replicas'})" in output
    groups = [load_model(tmp_path / "default" / f"replica_{task}" / CHECKPOINT_NAME) for task in range(2)]
    assert groups[0][1].step == groups[1][1].step == 4
    weights = [model.state_dict() for model, _ in groups]
    assert all(torch.equal(value, weights[1][key]) for key, value in weights[0].items())
    train_here(*overrides(byte_shards, tmp_path, run_name="one", max_steps=4, batch_size=8))
    one = Checkpoint.load(tmp_path / "one" / CHECKPOINT_NAME)
    for key, value in one.model.items():  # (the mean of 8 rows' gradients taken in two orders)
        assert torch.allclose(weights[0][key], value, rtol=0, atol=1e-6 * value.abs().max().item()), key


def test_a_killed_fsdp_replica_group_rejoins_from_its_peer_s_shards(byte_shards, tmp_path, lighthouse):
    """Two replica groups of 2 FSDP2 ranks each (array tasks); group 1's job killed with SIGKILL
    (every process of it) after its step-10 checkpoint, group 0 training on alone, group 1 submitted
    again: its ranks resume their checkpoint, then take group 0's state rank by rank (each rank its
    shard of the weights and optimizer state), and both groups end with the same weights, bitwise."""
    config = tiny_config(tmp_path, byte_shards, max_steps=120)
    command = ["bash", str(SBATCH), str(config), f"--out_dir={str(tmp_path)!r}", "--batch_size=8", "--fsdp",
               "--checkpoint_interval=10", "--extra_parts='tests.replica_parts:Pace'"]
    survivor_dir, failed_dir = tmp_path / "default" / "replica_0", tmp_path / "default" / "replica_1"

    def participants(run_dir):
        return [r.get("replicas/participants") for r in records(run_dir) if "replicas/participants" in r]

    task1, hold = array_task(tmp_path, 1, lighthouse), tmp_path / "hold"
    # (group 0 held back, at slower steps, from group 1's kill until group 1 is back: its steps outlast the restart)
    with started(command, cwd=tmp_path, env={**array_task(tmp_path, 0, lighthouse), "HOLD_FILE": str(hold)}) as (
            survivor,):
        with started(command, cwd=tmp_path, env=task1) as (failed,):
            deadline = time.time() + TIMEOUT
            while not list(failed_dir.glob("ckpt_00000010.dcp")):
                assert time.time() < deadline and failed.poll() is None, output_of(failed)[-3000:]
                time.sleep(0.1)
            hold.touch()
        # (leaving ``started`` killed every process of group 1's job)
        while participants(survivor_dir).count(1) < 3:
            assert time.time() < deadline and survivor.poll() is None, output_of(survivor)[-3000:]
            time.sleep(0.1)
        killed_at = len(participants(failed_dir))
        with started(command, cwd=tmp_path, env=task1) as (rejoined,):  # (submitted again)
            while len(participants(failed_dir)) <= killed_at:
                assert time.time() < deadline and rejoined.poll() is None, output_of(rejoined)[-3000:]
                time.sleep(0.1)
            hold.unlink()
            finish(survivor, rejoined)
    weights = [load_model(run_dir / CHECKPOINT_NAME)[0].state_dict() for run_dir in (survivor_dir, failed_dir)]
    assert all(torch.equal(value, weights[1][key]) for key, value in weights[0].items())
    assert participants(survivor_dir)[-1] == 2
    # Group 1's record: to its step 10 (the checkpoint it resumed), then from the step it took from group 0.
    steps = [r["step"] for r in records(failed_dir) if "replicas/participants" in r]
    assert steps[-1] == 120 and any(b - a > 1 for a, b in zip(steps, steps[1:]))
