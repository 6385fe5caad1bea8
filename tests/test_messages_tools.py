"""Issue 56 for the tools: a typo or a wrong path given to python -m eval, scripts.plot, data.prepare
--verify, scripts.bench_batch or train.py's --out_dir is one line naming the problem and the fix and
a non-zero exit, never a traceback; and eval never writes one model's results into another run's
folder (where that run's --overwrite would delete them). Each tool's main in this process, on tiny
inputs (the message is SystemExit's: what the process prints, with exit status 1); the scripts, which
tests do not import, as short processes of their own."""
import json
import subprocess
import sys

import pytest
import torch

import data.prepare
import eval.__main__ as eval_cli
from helpers import ROOT, TINY_RUN, train_here
from model import GPT, GPTConfig
from training.checkpoint import Checkpoint


def exit_message(main, *argv) -> str:
    """The message ``main(argv)`` exits with (a string: printed, status 1), failing on any other end."""
    with pytest.raises(SystemExit) as exit:
        main(list(map(str, argv)))
    assert isinstance(exit.value.code, str), exit.value.code
    assert "\n" not in exit.value.code.strip() and "Traceback" not in exit.value.code
    return exit.value.code


def script_message(module: str, *argv) -> str:
    """The one line ``python -m module argv`` exits with (status 1, no traceback)."""
    result = subprocess.run([sys.executable, "-m", module, *map(str, argv)], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, result.stdout
    return lines[-1]


@pytest.fixture
def two_runs(tmp_path):
    """Run folders A and B, each a train.py run's config.json and a tiny checkpoint (ckpt.pt)."""
    runs = {}
    for name in ("A", "B"):
        folder = tmp_path / name
        folder.mkdir()
        torch.manual_seed(0)
        Checkpoint.of_model(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=256, vocab_size=320)),
                            "byte").save(folder / "ckpt.pt")
        (folder / "config.json").write_text(json.dumps({"run_name": name}))
        runs[name] = folder
    return runs


# ---- 1. python -m eval --ckpt RUN/config.json ----

def test_eval_of_a_config_json_names_the_checkpoint_to_pass(two_runs):
    a = two_runs["A"]
    message = exit_message(eval_cli.main, "--ckpt", a / "config.json", "--tasks", "lambada_openai", "--samples")
    assert f"{a / 'config.json'} is a run's config, not a checkpoint: pass {a / 'ckpt.pt'}" in message
    assert "Please file an issue" not in message and "torch.load" not in message


def test_eval_of_a_text_file_or_a_run_folder_says_what_to_pass(two_runs, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    message = exit_message(eval_cli.main, "--ckpt", text, "--tasks", "lambada_openai", "--samples")
    assert f"checkpoint {text} cannot be read (not the zip file torch.save writes" in message
    assert "not a nanoMERIT checkpoint: pass one train.py wrote (RUN/ckpt.pt" in message
    message = exit_message(eval_cli.main, "--ckpt", two_runs["A"], "--tasks", "lambada_openai", "--samples")
    assert f"{two_runs['A']} is a run folder, not a checkpoint: pass {two_runs['A'] / 'ckpt.pt'}" in message


# ---- 2. python -m eval --ckpt A/ckpt.pt --out B/results.json ----

def test_eval_refuses_results_in_another_run_s_folder(two_runs):
    a, b = two_runs["A"], two_runs["B"]
    for out in (b / "results.json", b / "evals" / "results.json"):
        message = exit_message(eval_cli.main, "--ckpt", a / "ckpt.pt", "--out", out, "--tasks", "lambada_openai",
                               "--samples")
        assert f"--out {out} is in the run folder {b} of another model" in message
        assert f"--out {a / 'results.json'}" in message and "or write them outside it" in message
        assert not out.exists()


# ---- 3. train.py --out_dir=/proc/x ----

def test_a_run_folder_that_cannot_be_made_names_why_and_a_writable_out_dir(byte_shards):
    result = train_here(*TINY_RUN, f"--data_dir={byte_shards}", "--out_dir=/proc/x", "--max_steps=2", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "cannot " in result.stderr and "/proc" in result.stderr and "choose a writable out_dir" in result.stderr


# ---- 4. python -m scripts.plot RUN --out /etc/passwd ----

@pytest.mark.slow  # (seconds: the tool runs several times)
def test_plot_refuses_an_out_that_is_a_file_or_cannot_be_written(tmp_path):
    existing = tmp_path / "passwd"
    existing.write_text("root:x:0:0\n")
    message = script_message("scripts.plot", tmp_path, "--out", existing)
    assert f"--out {existing} is a file, not a folder for the figures: choose a folder" in message
    assert existing.read_text() == "root:x:0:0\n"
    message = script_message("scripts.plot", tmp_path, "--out", existing / "figures")
    assert f"--out {existing / 'figures'}: cannot make the folder" in message and "choose" in message


# ---- 5. python -m data.prepare --verify EMPTY ----

def test_verify_of_an_empty_or_missing_folder_says_how_to_prepare_it(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (empty, tmp_path / "missing"):
        message = exit_message(data.prepare.main, "--verify", folder)
        assert message.startswith("prepare: ") and str(folder) in message and "python -m data.prepare" in message


# ---- 6. python -m scripts.bench_batch subnormal --checkpoint X ----

@pytest.mark.slow  # (seconds: the tool runs several times)
def test_bench_batch_subnormal_of_a_non_checkpoint_is_a_message(two_runs, tmp_path):
    a = two_runs["A"]
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    expected = {text: f"{text} cannot be read (not the zip file", a / "config.json": "is a run's config, not a checkpoint",
                tmp_path / "missing.pt": "no checkpoint at"}
    for given, words in expected.items():
        message = script_message("scripts.bench_batch", "subnormal", "--checkpoint", given, "--steps", 1, "--rounds", 1)
        assert message.startswith("bench_batch: --checkpoint ") and words in message


@pytest.mark.slow  # (seconds: the tool runs several times)
def test_bench_batch_takes_a_run_folder_s_newest_checkpoint(two_runs):
    a, b = two_runs["A"], two_runs["B"]
    result = subprocess.run([sys.executable, "-m", "scripts.bench_batch", "subnormal", "--checkpoint", str(a),
                             "--steps", "1", "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and f"subnormal: {a / 'ckpt.pt'}: a forward and backward" in result.stdout
    (b / "ckpt.pt").unlink()  # a run folder without a checkpoint
    message = script_message("scripts.bench_batch", "subnormal", "--checkpoint", b, "--steps", 1, "--rounds", 1)
    assert message == f"bench_batch: --checkpoint {b}: no checkpoint at {b}: give the path of a checkpoint train.py " \
                      f"wrote (RUN/ckpt.pt is the newest of a run)"
