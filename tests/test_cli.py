"""train.py explains itself: --help lists every config key from the schema; a run says where its
folder is at the start and, at the end, where its files are and the commands that evaluate, resume
and export it (the resume commands it prints are run here); under torchrun an error is printed by
one rank and is torchrun's closing word. (The resume command a torchrun run prints:
tests/test_train.py.)"""
import dataclasses
import re
import shlex
import subprocess
import sys

import pytest

import train
from configs import TrainConfig
from helpers import ROOT, TINY_RUN, run_train, train_here

RUN = [*TINY_RUN, "--log_interval=2", "--batch_size=2", "--micro_batch_size=2", "--max_steps=4"]


def test_help_lists_every_config_key_with_its_type_default_and_meaning(capsys):
    result = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python train.py CONFIG")
    lines = result.stdout.splitlines()
    for f in dataclasses.fields(TrainConfig):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        entry = f"  --{f.name}={default!r}  ({f.type})"
        assert entry in lines, entry
        meaning = lines[lines.index(entry) + 1]
        assert meaning.startswith("      ") and len(meaning.split()) >= 2, (f.name, meaning)
    # -h anywhere, in the process itself: the same text, and nothing trains.
    train.main(["configs/default.py", "-h"])
    assert capsys.readouterr().out == result.stdout


def test_the_run_says_where_it_wrote_and_its_resume_commands_work(byte_shards, tmp_path):
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=r"]
    first = train_here(*common, "--stop_at_step=2", cwd=tmp_path)
    run_dir = tmp_path / "r"
    assert first.stdout.startswith(f"run folder {run_dir}: ")  # (before the model's description)
    guide = first.stdout[first.stdout.rindex(f"run folder {run_dir}:\n"):].splitlines()
    assert guide[1:4] == [f"  checkpoint  {run_dir}/ckpt.pt (step 2 of 4)", f"  metrics     {run_dir}/metrics.jsonl",
                          f"  config      {run_dir}/config.json"]
    assert all((run_dir / name).is_file() for name in ("ckpt.pt", "metrics.jsonl", "config.json"))
    commands = {line.split()[0]: line.split(None, 1)[1] for line in guide[4:]}
    assert commands["evaluate"].startswith(f"python -m eval --ckpt {run_dir}/ckpt.pt --tasks paper ")
    assert commands["export"].startswith(f"python -m scripts.export_hf {run_dir}/ckpt.pt {run_dir}/hf ")

    # The printed resume command, as typed (stop_at_step dropped), finishes the run ...
    resume = shlex.split(commands["resume"])
    assert resume[:2] == ["python", "train.py"] and "--stop_at_step=2" not in resume
    second = train_here(*resume[2:], cwd=tmp_path)
    assert "resumed" in second.stdout and "(step 4 of 4)" in second.stdout
    # ... and a finished run's guide continues it on a longer schedule.
    train_on = second.stdout.rsplit("train on  ", 1)[1].split("  (")[0]
    third = train_here(*shlex.split(train_on)[2:], cwd=tmp_path)
    assert "(step 8 of 8)" in third.stdout
    assert [arg for arg in shlex.split(train_on) if arg.startswith("--max_steps")] == ["--max_steps=8"]


@pytest.mark.slow
def test_under_torchrun_one_rank_says_the_error_and_it_is_torchrun_s_closing_word(byte_shards, tmp_path):
    # batch 2 on 2 ranks x micro-batch 2: not divisible, an error every rank meets.
    result = run_train(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", nproc=2, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    message = re.search(r"train\.py: batch_size=2 is not divisible[^\n]*", output).group(0)
    assert output.count(message) == 2  # rank 0's line, and the summary's root cause
    summary = output[output.index("Root Cause (first observed failure)"):]
    assert "rank      : 0 (local_rank: 0)" in summary and f"traceback : {message}" in summary
    assert "To enable traceback" not in output

