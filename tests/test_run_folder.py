"""The run folder is owned by one run: no silent replacement, --resume / --resume=auto /
--overwrite, a finished run resumed is a no-op, and a resumed run's log reads as one run."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import hf
from configs import TrainConfig
from helpers import ROOT, TINY_RUN, read_metrics, run_train, train_here
from model import GPT
from training import run_folder
from training.checkpoint import CHECKPOINT_NAME, Checkpoint

# Dropout on: a resumed run must restore the RNG to equal the uninterrupted one.
RUN = [*TINY_RUN, "--dropout=0.1", "--eval_interval=4", "--lr=0.01", "--min_lr=0.001", "--warmup_steps=2",
       "--batch_size=4", "--micro_batch_size=2"]


def comparable(log):
    """A metrics log's records without the start-up line and what is measured, not computed: the
    timing keys and the memory peak (the counted memory stays). Complete lines only: a log read
    while a run writes it may end in part of a record (a long line leaves the file's buffer in pieces)."""
    records = [json.loads(line) for line in log.read_text().split("\n")[:-1]]
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "mfu", "memory/peak")} for r in records
            if "run_info" not in r]


def folder_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def train(data, out, *extra, check=True):
    """train.py's main in this process (what these tests are about is the run folder, not the process)."""
    return train_here(*RUN, f"--data_dir={data}", f"--out_dir={out}", *extra, check=check)


def test_a_run_folder_is_not_replaced_without_resume_or_overwrite(byte_shards, tmp_path):
    train(byte_shards, tmp_path, "--max_steps=2", "--log_interval=1")
    before = folder_bytes(tmp_path / "default")
    refused = train(byte_shards, tmp_path, "--max_steps=2", check=False)
    assert refused.returncode != 0 and "already holds a run (ckpt.pt, metrics.jsonl, config.json, ckpt_00000002.pt)" in refused.stderr
    assert "--resume" in refused.stderr and "--overwrite" in refused.stderr
    assert folder_bytes(tmp_path / "default") == before  # nothing touched
    train(byte_shards, tmp_path, "--max_steps=3", "--log_interval=1", "--overwrite")
    steps = [r["step"] for r in read_metrics(tmp_path / "default") if "train/loss" in r]
    assert steps == [1, 2, 3]  # a new run, not appended to the old


def test_resume_auto_starts_fresh_or_continues(byte_shards, tmp_path):
    # A run that died before its first checkpoint left a log: --resume=auto starts over.
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "metrics.jsonl").write_text('{"step": 0, "val/loss": 9.0}\n')
    train(byte_shards, tmp_path, "--max_steps=8", "--log_interval=3", "--resume=auto", "--stop_at_step=5")
    train(byte_shards, tmp_path, "--max_steps=8", "--log_interval=3", "--resume=auto")
    train(byte_shards, tmp_path, "--max_steps=8", "--log_interval=3", "--run_name=straight")
    split, straight = (comparable(tmp_path / name / "metrics.jsonl") for name in ("default", "straight"))
    # The train-loss window of steps 4-5 was checkpointed: step 6's loss is the uninterrupted run's.
    assert split == straight and [r["step"] for r in split if "train/loss" in r] == [3, 6, 8]


def test_a_finished_run_resumed_is_a_no_op_and_too_few_steps_is_an_error(byte_shards, tmp_path):
    train(byte_shards, tmp_path, "--max_steps=3", "--log_interval=1")
    before = folder_bytes(tmp_path / "default")
    again = train(byte_shards, tmp_path, "--max_steps=3", "--resume")
    assert "already finished its 3 steps: nothing to do" in again.stdout
    assert folder_bytes(tmp_path / "default") == before
    fewer = train(byte_shards, tmp_path, "--max_steps=2", "--resume=auto", check=False)
    assert fewer.returncode != 0 and "at step 3, past this config's 2 steps: raise max_steps" in fewer.stderr
    other_batch = train(byte_shards, tmp_path, "--max_steps=6", "--resume", "--batch_size=8", check=False)
    assert other_batch.returncode != 0 and "batch_size: checkpoint 4, now 8" in other_batch.stderr
    assert folder_bytes(tmp_path / "default") == before


@pytest.mark.parametrize("run_name", ["../escape", "/abs", "a/b", ".."])
def test_run_name_is_one_folder_name(byte_shards, tmp_path, run_name):
    result = train(byte_shards, tmp_path / "out", "--max_steps=1", f"--run_name={run_name}", check=False)
    assert result.returncode != 0 and "must be one folder name" in result.stderr
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == []


def test_a_resumed_log_drops_a_torn_line_and_does_not_follow_a_planted_link(byte_shards, tmp_path):
    train(byte_shards, tmp_path, "--max_steps=4", "--log_interval=2", "--stop_at_step=2")
    log = tmp_path / "default" / "metrics.jsonl"
    with open(log, "a") as f:
        f.write('{"step": 3, "train/lo')  # killed mid-record
    train(byte_shards, tmp_path, "--max_steps=6", "--log_interval=2", "--stop_at_step=4", "--resume",
          "--allow_changes=max_steps")
    assert [r["step"] for r in comparable(log) if "train/loss" in r] == [2, 4]
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    kept = log.read_bytes()
    log.unlink()
    log.symlink_to(victim)  # planted where the log was: refused, neither read through nor written
    refused = train(byte_shards, tmp_path, "--max_steps=6", "--log_interval=2", "--resume", check=False)
    # (max_steps=6 is the schedule the resumed run took on: no change to name now)
    assert refused.returncode != 0 and "metrics.jsonl is a symbolic link" in refused.stderr
    assert victim.read_text() == "precious" and log.is_symlink() and kept


@pytest.mark.slow  # real processes, killed
def test_killed_runs_resumed_with_auto_end_as_the_uninterrupted_run(byte_shards, tmp_path):
    """kill -9 at five moments (the first while a checkpoint is being written, the fourth right
    after a resume), --resume=auto after each: the final weights are bitwise the uninterrupted
    run's and the log has exactly its records."""
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--max_steps=12", "--log_interval=3",
              "--checkpoint_interval=2", "--resume=auto"]
    train_here(*common, "--run_name=straight")  # (one thread, as the killed processes: bitwise alike)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "killed" / "metrics.jsonl"
    for kill_after_records in (2, 4, 6, 6, 8):  # metrics lines written before the kill
        # The first kill lands inside a checkpoint write: the save stalls there (a test hook).
        stall = ["-c", STALLED_SAVE] if kill_after_records == 2 else []
        proc = subprocess.Popen([sys.executable, *stall, str(ROOT / "train.py"), *common, "--run_name=killed"],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while (time.time() < deadline and proc.poll() is None
               and not (log.exists() and len(log.read_text().splitlines()) > kill_after_records)):
            time.sleep(0.05)
        if stall:
            while time.time() < deadline and not list((tmp_path / "killed").glob(".ckpt_*.pt.*.tmp")):
                time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not stall or list((tmp_path / "killed").glob(".ckpt_*.pt.*.tmp"))  # killed mid-write
    train_here(*common, "--run_name=killed")
    a, b = (Checkpoint.load(tmp_path / name / CHECKPOINT_NAME) for name in ("straight", "killed"))
    assert a.step == b.step == 12 and all(torch.equal(a.model[k], b.model[k]) for k in a.model)
    assert comparable(log) == comparable(tmp_path / "straight" / "metrics.jsonl")


# train.py with Checkpoint.save stalled halfway through writing its file (from the third save on).
STALLED_SAVE = """
import sys, time, runpy
import training.checkpoint.format as checkpoint
original, saves = checkpoint.torch.save, []
def stalled(obj, f):
    saves.append(1)
    if len(saves) >= 3:
        f.write(b"partial")
        f.flush()
        time.sleep(600)
    original(obj, f)
checkpoint.torch.save = stalled
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    return kids


@pytest.mark.slow  # torchrun, a worker killed
def test_torchrun_restarts_a_killed_worker_from_the_last_checkpoint(byte_shards, tmp_path):
    common = [*RUN, "--dropout=0.0", f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--max_steps=200",
              "--log_interval=10", "--checkpoint_interval=20", "--eval_interval=1000", "--resume=auto"]
    run_train(*common, "--run_name=straight", nproc=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                              "--max-restarts=1", str(ROOT / "train.py"), *common, "--run_name=restarted"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, deadline = tmp_path / "restarted" / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and not (log.exists() and any(r.get("step", 0) >= 50 for r in comparable(log))):
        time.sleep(0.02)
    os.kill(max(_children(agent.pid)), signal.SIGKILL)  # one of the two workers
    output, _ = agent.communicate(timeout=300)
    assert agent.returncode == 0, output[-3000:]
    starts = [r for r in map(json.loads, log.read_text().splitlines()) if "run_info" in r]
    assert len(starts) == 2  # the restarted workers resumed the checkpoint (a fresh start would clear the log)
    a, b = (Checkpoint.load(tmp_path / name / CHECKPOINT_NAME) for name in ("straight", "restarted"))
    assert b.step == 200 and all(torch.equal(a.model[k], b.model[k]) for k in a.model)
    assert comparable(log) == comparable(tmp_path / "straight" / "metrics.jsonl")


def test_checkpoint_retention_and_auto_skipping_a_corrupt_newest(byte_shards, tmp_path):
    lifecycle = ["--log_interval=2", "--checkpoint_interval=2", "--keep_checkpoints=2",
                 "--permanent_checkpoint_interval=4"]
    train(byte_shards, tmp_path, *lifecycle, "--max_steps=10")
    run_dir = tmp_path / "default"
    assert sorted(p.name for p in run_dir.glob("ckpt*")) == ["ckpt.pt", "ckpt_00000004.pt", "ckpt_00000008.pt",
                                                             "ckpt_00000010.pt"]
    assert os.readlink(run_dir / CHECKPOINT_NAME) == "ckpt_00000010.pt"
    newest = run_dir / "ckpt_00000010.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated (a disk fault: our writes are atomic)
    strict = train(byte_shards, tmp_path, *lifecycle, "--max_steps=12", "--allow_changes=max_steps", "--resume",
                   check=False)
    assert strict.returncode != 0 and "ckpt_00000010.pt cannot be read" in strict.stderr
    auto = train(byte_shards, tmp_path, *lifecycle, "--max_steps=12", "--allow_changes=max_steps", "--resume=auto")
    assert "skipping the checkpoint" in auto.stderr and "ckpt_00000008.pt at step 8" in auto.stdout
    assert Checkpoint.load(run_dir / CHECKPOINT_NAME).step == 12


def test_a_dangling_latest_link_and_an_empty_data_folder_say_what_to_do(byte_shards, tmp_path):
    run = tmp_path / "default"
    run.mkdir()
    (run / CHECKPOINT_NAME).symlink_to("ckpt_00000004.pt")  # the checkpoint it named deleted
    dangling = train(byte_shards, tmp_path, "--max_steps=4", "--resume", check=False)
    assert dangling.returncode != 0
    assert (f"{run / CHECKPOINT_NAME} is a link to ckpt_00000004.pt, which does not exist, and {run} holds no other "
            f"checkpoint: the run cannot resume; put the checkpoint back, or start the run again with --overwrite"
            in dangling.stderr), dangling.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    for tokenizer in ("byte", "gpt2"):  # the hint prepares shards the config can read
        refused = train(empty, tmp_path, "--max_steps=4", "--run_name=other", f"--tokenizer={tokenizer}", check=False)
        assert f"no 'train' shards in data dir {empty}; prepare it with `python -m data.prepare shakespeare " \
               f"--tokenizer {tokenizer} --out {empty}`" in refused.stderr, refused.stderr


def test_the_guide_says_that_any_resume_runs_a_pending_evaluation_first(tmp_path):
    """A stop during the final evaluation: the guide says it is pending, and both the resume that
    finishes it and the one that trains on say that it runs first."""
    config, argv = TrainConfig(model="nano", max_steps=6), ["configs/default.py", "--max_steps=6", "--resume"]
    lines = run_folder.guide(tmp_path, 6, 6, config, ["python"], argv, evaluation_pending=True).splitlines()
    assert (f"  checkpoint  {tmp_path / CHECKPOINT_NAME} (step 6 of 6; step 6's evaluation, which a stop interrupted, "
            f"is pending)") in lines
    assert "resume    python train.py configs/default.py --max_steps=6 --resume  (runs step 6's pending evaluation " \
           "first)" in lines
    assert ("train on  python train.py configs/default.py --resume --max_steps=12 --allow_changes=max_steps  (any "
            "longer run; the lr schedule follows the new length; step 6's pending evaluation runs first)") in lines
    finished = run_folder.guide(tmp_path, 6, 6, config, ["python"], argv)  # nothing pending: trains on only
    assert "pending" not in finished and not any(line.startswith("resume") for line in finished.splitlines())
    stopped = run_folder.guide(tmp_path, 4, 6, config, ["python"], argv, evaluation_pending=True).splitlines()
    assert "resume    python train.py configs/default.py --max_steps=6 --resume  (runs step 4's pending evaluation " \
           "first)" in stopped


@pytest.mark.parametrize("options, reason", [
    ({"qk_norm": "rmsnorm"}, "a model with qk_norm='rmsnorm' has no Hugging Face GPT-2 equivalent (GPT2LMHeadModel "
                             "normalises no q or k)"),
    ({"arch": "llama", "attn_logit_softcap": 50.0, "final_logit_softcap": 30.0},
     "a model with attn_logit_softcap=50.0, final_logit_softcap=30.0 has no Hugging Face Llama equivalent "
     "(LlamaForCausalLM soft-caps no logits)"),
])
def test_the_guide_prints_no_export_command_the_export_refuses_but_why(tmp_path, options, reason):
    config = TrainConfig(model="nano", max_steps=2, **options)
    export_line = run_folder.guide(tmp_path, 2, 2, config, ["python"], []).splitlines()[-1]
    assert export_line == f"export    none to Hugging Face: {reason}; python -m eval evaluates it (above)"
    # The export refuses that model, for that reason.
    Checkpoint.of_model(GPT(config.model_config(n_vocab=257)), "byte", step=2).save(tmp_path / CHECKPOINT_NAME)
    with pytest.raises(ValueError, match=re.escape(f"{reason}: evaluate its checkpoint with python -m eval")):
        hf.export(tmp_path / CHECKPOINT_NAME, tmp_path / "hf")
