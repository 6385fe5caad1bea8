"""Nothing a run or an evaluation produced is lost to a later command: one run at a time holds a
run folder (a second is refused, naming the holder; a dead holder's lock is taken over),
--resume=auto never starts over a run whose checkpoints are gone, a second evaluation keeps the
first one's tasks, and an HF export never replaces the run folder it reads (or any folder that is
not an earlier export)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import eval.__main__ as eval_cli
from eval.samples import write_fixtures
from helpers import ROOT, TINY_RUN, read_metrics, run_train, train_here
from hf import export
from model import GPT, GPTConfig
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.run_folder import LOCK_NAME, STALE_SECONDS

RUN = [*TINY_RUN, "--log_interval=2", "--batch_size=2", "--micro_batch_size=2", "--max_steps=4"]


def folder_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(byte_shards, tmp_path_factory):
    """A finished 4-step run with a checkpoint, and zero-shot task files."""
    root = tmp_path_factory.mktemp("nothing_lost")
    train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={root}", "--run_name=run")
    write_fixtures(root / "tasks")
    return root


def test_resume_auto_refuses_a_trained_run_whose_checkpoints_were_removed(finished_run, byte_shards, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run)
    for checkpoint in [*run.glob("ckpt_*"), run / "ckpt.pt"]:
        checkpoint.unlink()  # someone freeing disk
    before = folder_bytes(run)
    refused = train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run",
                         "--resume=auto", check=False)
    assert refused.returncode != 0
    assert "trained to step 4 (its metrics.jsonl) but no checkpoint" in refused.stderr
    assert "--overwrite" in refused.stderr
    assert folder_bytes(run) == before  # the log and the config as they were


def evaluate(ckpt, out, tasks, data_dir, *extra):
    eval_cli.main(["--ckpt", str(ckpt), "--tasks", tasks, "--data-dir", str(data_dir), "--limit", "4",
                   "--batch-size", "2", "--out", str(out), *extra])
    return json.loads(out.read_text())


def test_a_second_evaluation_keeps_the_first_ones_tasks(finished_run, tmp_path, capsys):
    ckpt, tasks = finished_run / "run" / "ckpt.pt", finished_run / "tasks"
    out = tmp_path / "results.json"
    first = evaluate(ckpt, out, "boolq,cb", tasks)
    second = evaluate(ckpt, out, "cb,rte", tasks, "--limit", "3")  # cb again, with other settings
    assert set(second["results"]) == {"boolq", "cb", "rte"}
    assert second["results"]["boolq"] == first["results"]["boolq"]  # kept
    assert second["results"]["cb"]["n"] == 3 and first["results"]["cb"]["n"] == 4  # replaced by the new run
    assert second["task_config"]["boolq"]["eval_config"]["limit"] == 4  # each task its own configuration
    assert second["task_config"]["cb"]["eval_config"]["limit"] == 3
    # The same checkpoint by its numbered file (ckpt.pt points at it) is the same model: merged.
    numbered = evaluate(ckpt.resolve(), out, "wsc", tasks)
    assert set(numbered["results"]) == {"boolq", "cb", "rte", "wsc"}
    assert numbered["model_sha256"] == first["model_sha256"] and len(first["model_sha256"]) == 64
    # Another model's results are never replaced silently.
    other = json.loads(out.read_text())
    other["model_sha256"] = "0" * 64
    out.write_text(json.dumps(other))
    own = out.with_name(f"results_{first['model_sha256'][:12]}.json")
    with pytest.raises(SystemExit, match=re.escape(
            f"holds the results of another model (ckpt {ckpt.resolve()}, step 4, model_sha256 {'0' * 64}): write this "
            f"model's with --out {own}, or pass --overwrite")):
        evaluate(ckpt, out, "boolq", tasks)
    assert json.loads(out.read_text())["model_sha256"] == "0" * 64
    replaced = evaluate(ckpt, out, "boolq", tasks, "--overwrite")
    assert set(replaced["results"]) == {"boolq"} and replaced["step"] == 4


@pytest.mark.slow  # real processes, at once
def test_two_evaluations_into_one_file_at_once_keep_both(finished_run, tmp_path):
    out = tmp_path / "results.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    evaluations = [subprocess.Popen([sys.executable, "-m", "eval", "--ckpt", str(finished_run / "run" / "ckpt.pt"),
                                     "--tasks", tasks, "--data-dir", str(finished_run / "tasks"), "--limit", "4",
                                     "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
                   for tasks in ("boolq", "cb")]
    for evaluation in evaluations:
        output, _ = evaluation.communicate(timeout=300)
        assert evaluation.returncode == 0 and f"wrote {out}" in output, output
    assert set(json.loads(out.read_text())["results"]) == {"boolq", "cb"}


def test_a_run_started_over_removes_what_was_derived_from_the_earlier_model(finished_run, byte_shards, tmp_path):
    """The results, the Hessian and the Hugging Face export the guide names (RUN/hf) are the
    earlier model's: --overwrite removes them with its checkpoints."""
    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run, symlinks=True)
    tasks = finished_run / "tasks"
    eval_cli.main(["--ckpt", str(run / "ckpt.pt"), "--tasks", "boolq", "--data-dir", str(tasks), "--limit", "4"])
    (run / "hessian.json").write_text(json.dumps({"step": 4, "top_eigenvalue": -7.29, "trace": 99.4}))
    export(run / "ckpt.pt", run / "hf")
    derived = ["hessian.json", "hf", "results_00000004.json"]
    assert set(derived) <= {p.name for p in run.iterdir()}
    train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run", "--overwrite",
               "--lr=0.05")
    assert not set(derived) & {p.name for p in run.iterdir()}  # of the model --overwrite replaced
    evaluate(run / "ckpt.pt", run / "results.json", "cb", tasks)
    assert set(json.loads((run / "results.json").read_text())["results"]) == {"cb"}


def test_two_checkpoints_of_a_run_keep_their_results_apart_by_default(finished_run, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for step, seed in ((2, 0), (4, 1)):  # two checkpoints of one run: two models
        torch.manual_seed(seed)
        Checkpoint.of_model(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=32, vocab_size=320)), "byte",
                            step=step).save(run / f"ckpt_{step:08d}.pt")
    (run / CHECKPOINT_NAME).symlink_to("ckpt_00000004.pt")
    for checkpoint in (run / "ckpt_00000002.pt", run / CHECKPOINT_NAME):
        eval_cli.main(["--ckpt", str(checkpoint), "--tasks", "boolq", "--data-dir", str(finished_run / "tasks"),
                       "--limit", "4"])
    kept = {step: json.loads((run / f"results_{step:08d}.json").read_text()) for step in (2, 4)}
    assert {step: record["step"] for step, record in kept.items()} == {2: 2, 4: 4}
    assert kept[2]["model_sha256"] != kept[4]["model_sha256"] and all(r["results"]["boolq"] for r in kept.values())


def test_an_export_never_replaces_its_run_folder_or_a_folder_that_is_not_an_export(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run)
    before = folder_bytes(run)
    for out_dir in (run, tmp_path):  # the run folder, and a folder that contains it
        with pytest.raises(ValueError, match="the export would replace its own input"):
            export(run / "ckpt.pt", out_dir, force=True)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"is not a Hugging Face export \(no nanomerit.json\)"):
        export(run / "ckpt.pt", other, force=True)
    assert folder_bytes(run) == before and (other / "todo.txt").read_text() == "keep me"
    export(run / "ckpt.pt", tmp_path / "hf")
    with pytest.raises(FileExistsError, match="exists and holds an earlier export: pass --force"):
        export(run / "ckpt.pt", tmp_path / "hf")
    export(run / "ckpt.pt", tmp_path / "hf", force=True)  # an earlier export is replaced
    assert (tmp_path / "hf" / "nanomerit.json").is_file()


def plant_lock(run, host, pid, age):
    (run / LOCK_NAME).write_text(json.dumps({"host": host, "pid": pid, "started": "2026-01-01T00:00:00+00:00",
                                             "token": "planted"}) + "\n")
    os.utime(run / LOCK_NAME, (time.time() - age, time.time() - age))


def test_a_live_holders_lock_refuses_and_a_dead_ones_is_taken_over(finished_run, byte_shards, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run)
    resume = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run", "--resume",
              "--max_steps=6", "--allow_changes=max_steps"]
    plant_lock(run, "node-17", 4242, age=10)  # another host, heartbeat 10 s ago: alive
    before = folder_bytes(run)
    refused = train_here(*resume, check=False)
    assert refused.returncode != 0
    assert re.search(r"in use by another run: host node-17, pid 4242, started 2026-01-01T00:00:00\+00:00, "
                     r"heartbeat 1\d s ago", refused.stderr), refused.stderr
    assert folder_bytes(run) == before  # the lock, the log and the checkpoints as they were
    plant_lock(run, "node-17", 4242, age=STALE_SECONDS + 60)  # its heartbeat stopped: a lost node
    taken = train_here(*resume)
    assert "took over the lock of a run that is gone (host node-17, pid 4242" in taken.stdout
    assert not (run / LOCK_NAME).exists()  # released at the end
    assert Checkpoint.load(run / CHECKPOINT_NAME).step == 6


def test_a_resume_or_restart_of_a_folder_in_use_names_the_live_run(byte_shards, tmp_path):
    """A run stopped before its first checkpoint (Ctrl-Z) holds its folder: --resume is refused
    naming it, as a plain start is, not for want of a checkpoint."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"run_info": {"optim_backend": "auto"}}\n')
    plant_lock(run, "node-17", 4242, age=10)  # alive: its heartbeat 10 s ago
    before = folder_bytes(run)
    for how in ("--resume", "--overwrite", "--resume=auto"):
        refused = train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run", how,
                             check=False)
        assert refused.returncode != 0 and "in use by another run: host node-17, pid 4242" in refused.stderr, how
        assert "no checkpoint" not in refused.stderr
    assert folder_bytes(run) == before


def lock_holder(run) -> int | None:
    try:
        return json.loads((run / LOCK_NAME).read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def start_holding_run(args: list[str], run) -> subprocess.Popen:
    """train.py in a process of its own, once it holds ``run``'s lock and wrote a checkpoint."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (lock_holder(run) == process.pid and (run / CHECKPOINT_NAME).exists()):
        time.sleep(0.05)
    return process


@pytest.mark.slow  # real processes: two at once, one killed
def test_a_second_run_on_a_held_folder_is_refused_and_a_killed_runs_lock_does_not_block_resume(byte_shards,
                                                                                             tmp_path):
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run", "--max_steps=100000",
              "--log_interval=20", "--checkpoint_interval=20"]
    run = tmp_path / "run"
    first = start_holding_run(common, run)
    second = run_train(*common, "--resume=auto", check=False, timeout=120)  # what a requeued job would run
    assert second.returncode != 0, second.stdout
    assert f"in use by another run: host {socket.gethostname()}, pid {first.pid}" in second.stderr
    assert first.poll() is None  # the first run trains on, undisturbed
    first.kill()  # kill -9: its lock stays behind
    first.communicate(timeout=60)
    assert lock_holder(run) == first.pid
    step = Checkpoint.load(run / CHECKPOINT_NAME).step
    resumed = run_train(*common, "--resume", f"--stop_at_step={step + 20}")
    assert f"took over the lock of a run that is gone (host {socket.gethostname()}, pid {first.pid}" in resumed.stdout
    assert Checkpoint.load(run / CHECKPOINT_NAME).step == step + 20 and not (run / LOCK_NAME).exists()


@pytest.mark.slow  # real processes: one stopped (SIGSTOP) and continued (SIGCONT)
def test_a_stopped_run_keeps_its_lock_and_one_whose_lock_was_taken_writes_nothing_more(byte_shards, tmp_path):
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run", "--max_steps=100000",
              "--log_interval=20", "--checkpoint_interval=20"]
    run = tmp_path / "run"
    first = start_holding_run(common, run)
    os.kill(first.pid, signal.SIGSTOP)  # Ctrl-Z, SLURM's suspend
    try:
        long_ago = time.time() - STALE_SECONDS - 60  # stopped past the heartbeat rule
        os.utime(run / LOCK_NAME, (long_ago, long_ago))
        second = run_train(*common, "--resume=auto", check=False, timeout=120)
        assert second.returncode != 0, second.stdout  # its pid lives on this host: never taken over
        assert f"in use by another run: host {socket.gethostname()}, pid {first.pid}" in second.stderr
        # Now taken over all the same, as a run on another host would after the heartbeat's age.
        plant_lock(run, "node-17", 4242, age=0)
        before = folder_bytes(run)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 1, output
    assert ("this run's lock was taken over by another run (host node-17, pid 4242" in output
            and "this run stops without writing more there" in output), output
    assert folder_bytes(run) == before  # no checkpoint, no metrics line, the other run's lock untouched


def dead_pid() -> int:
    """A pid no process of this host has."""
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def test_what_interrupted_writes_left_is_removed_at_start_up_and_said(finished_run, byte_shards, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run, symlinks=True)
    dead, alive = run / f".ckpt_00000006.pt.{dead_pid()}.0123abcd.tmp", run / f".results.json.{os.getpid()}.89ab.tmp"
    dead.write_bytes(b"\0" * 1000)  # a kill -9 inside a checkpoint write
    alive.write_text("{")  # a live writer's (this process)
    (run / ".ckpt_00000006.dcp.partial").mkdir()  # a sharded save interrupted
    resumed = train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run", "--resume",
                         "--max_steps=6", "--allow_changes=max_steps")
    assert f"removed what interrupted writes left: .ckpt_00000006.dcp.partial, {dead.name}" in resumed.stdout
    assert not dead.exists() and not (run / ".ckpt_00000006.dcp.partial").exists() and alive.exists()


def test_a_damaged_line_inside_the_log_is_kept_with_a_warning(finished_run, byte_shards, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run, symlinks=True)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines.insert(2, '{"step": 1, "train/lo')  # damaged in the middle (only a torn LAST line is a crash's trace)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n" + '{"step": 5, "tra')  # and a torn last line
    resumed = train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run", "--resume",
                         "--max_steps=6", "--allow_changes=max_steps")
    assert "metrics.jsonl line 3 is not a JSON record" in resumed.stderr and "kept as it is" in resumed.stderr
    after = (run / "metrics.jsonl").read_text().splitlines()
    assert after[:len(lines)] == lines and '{"step": 5, "tra' not in after  # the torn last line is dropped


def test_resume_auto_says_which_checkpoint_it_falls_back_to(finished_run, byte_shards, tmp_path):
    run = tmp_path / "run"
    train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run", "--checkpoint_interval=2")
    (run / "ckpt_00000004.pt").unlink()
    resumed = train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run",
                         "--resume=auto", "--max_steps=6", "--allow_changes=max_steps")
    assert "ckpt_00000004.pt (ckpt.pt points at it) is missing; resuming the one before it, ckpt_00000002.pt" \
        in resumed.stderr
    assert "at step 2" in resumed.stdout and Checkpoint.load(run / CHECKPOINT_NAME).step == 6


def test_a_sharding_request_on_one_process_is_said(finished_run, byte_shards, tmp_path):
    for flag in ("--zero_stage=1", "--fsdp"):
        result = train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", f"--run_name={flag[2:6]}",
                            "--max_steps=1", "--warmup_steps=0", flag)
        asked = "zero_stage=1" if flag == "--zero_stage=1" else "fsdp=True"
        assert f"{asked} on one process shards nothing: this run is unsharded" in result.stderr


@pytest.mark.slow  # a real process, interrupted
def test_ctrl_c_saves_like_sigterm_and_a_second_stops_at_once(byte_shards, tmp_path):
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--max_steps=100000", "--log_interval=5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    run = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *common], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, deadline = tmp_path / "default" / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and not (log.exists() and "train/loss" in log.read_text()):
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 0, output[-3000:]
    assert "Ctrl-C: saving at the next log step" in output and "Ctrl-C received, saved step" in output
    step = Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME).step
    assert step > 0 and step % 5 == 0 and not (tmp_path / "default" / LOCK_NAME).exists()


def test_a_zero_shot_task_the_model_cannot_score_is_skipped_and_the_run_ends_well(finished_run, byte_shards, tmp_path):
    # hellaswag's endings are longer than a 32-byte window (lm-eval refuses them too: test_eval_window.py).
    result = train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--zero_shot_tasks=boolq,hellaswag",
                        f"--zero_shot_data_dir={finished_run / 'tasks'}", "--zero_shot_limit=4")
    assert result.returncode == 0
    assert "zero-shot evaluation at step 4 skips task hellaswag: a continuation of" in result.stderr
    keys = {key for record in read_metrics(tmp_path / "default") for key in record}
    assert "zero_shot/boolq/acc" in keys and not any(key.startswith("zero_shot/hellaswag/") for key in keys)
