"""What train.py is asked is done, or refused in one line that says why and what works (issue 56): an optimizer
key the optimizer takes none of, the optimizer names --help lists, a second Ctrl-C."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import optim
from configs import ConfigError, command_line_config, key_reference
from helpers import ROOT, TINY_RUN
from training.run_config import resolve_config
from training.signals import StopSignals

TAKES = {  # the top-level keys each optimizer without betas or eps takes, and its own options
    "sgd": "sgd takes lr and weight_decay, and in optimizer_options momentum",
    "adafactor": "adafactor takes lr and weight_decay, and in optimizer_options decay_rate, min_dim_size_to_factor, "
                 "clipping_threshold, param_rms_floor",
    "lion": "lion takes lr, weight_decay, beta1 and beta2, and no optimizer_options",
}


def resolved(*flags: str):
    return resolve_config(command_line_config(["--max_steps=1", *flags]))


@pytest.mark.parametrize("optimizer, flag, key", [
    ("sgd", "--eps=1e-8", "eps=1e-08"), ("adafactor", "--eps=1e-3", "eps=0.001"), ("lion", "--eps=1e-8", "eps=1e-08"),
    ("sgd", "--beta1=0.9", "beta1=0.9"), ("sgd", "--beta2=0.99", "beta2=0.99"), ("adafactor", "--beta2=0.9", "beta2=0.9")])
def test_a_top_level_key_the_optimizer_takes_none_of_is_refused_naming_it_and_what_it_takes(optimizer, flag, key):
    # (--eps was dropped without a word: config.json said eps null and the resume command repeated --eps.)
    with pytest.raises(ConfigError) as error:
        resolved(f"--optimizer={optimizer}", flag)
    name = key.partition("=")[0]
    hyper = "betas" if name.startswith("beta") else name
    assert str(error.value) == (f"{key}: optimizer {optimizer!r} takes no {hyper}; drop {name} "
                                f"({TAKES[optimizer]})")


def test_betas_in_optimizer_options_of_an_optimizer_without_them_are_refused_with_a_fix_that_works():
    # (This advice was "use its top-level key (... beta1/beta2 ...)", which sgd then refused: a circle.)
    with pytest.raises(ConfigError) as error:
        resolved("--optimizer=sgd", "--optimizer_options={'betas': (0.9, 0.99)}")
    assert str(error.value).endswith("optimizer 'sgd' takes no betas, in optimizer_options or as beta1/beta2; drop "
                                     f"them ({TAKES['sgd']})")
    # What the messages advise works: momentum in optimizer_options.
    config = resolved("--optimizer=sgd", "--optimizer_options={'momentum': 0.9}").config
    assert config.optimizer_options["momentum"] == 0.9 and config.eps is None and config.beta1 is None


def test_the_library_refuses_a_hyper_parameter_the_optimizer_takes_none_of():
    with pytest.raises(TypeError, match=r"^optimizer 'sgd' takes no eps; drop eps \(sgd takes lr and weight_decay"):
        optim.settings("sgd", lr=0.1, eps=1e-8)
    with pytest.raises(TypeError, match=r"^optimizer 'lion' takes no eps; drop eps"):
        optim.settings("lion", lr=1e-4, eps=1e-8)
    assert optim.settings("sgd", lr=0.1, eps=None).kwargs == {"lr": 0.1, "weight_decay": 0.0, "momentum": 0.0}


def test_the_keys_each_optimizer_takes_are_accepted():
    for name in optim.available():
        flags = [f"--optimizer={name}", "--lr_schedule=constant" if optim.schedule_free(name) else "--lr=1e-3"]
        taken = set(optim.settings(name, lr=1e-3).entries)
        if "eps" in taken:
            flags.append("--eps=1e-7")
        if "betas" in taken:
            flags += ["--beta1=0.8", "--beta2=0.9"]
        config = resolved(*flags).config
        assert ("eps" not in taken or config.eps == 1e-7) and ("betas" not in taken or config.beta1 == 0.8), name


def test_help_lists_every_registered_optimizer_under_optimizer():
    lines = key_reference().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  --optimizer="))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("      "))
    meaning = " ".join(lines[start + 1:end])
    for name in optim.available():
        assert f'"{name}"' in meaning, (name, meaning)


def test_a_second_ctrl_c_during_a_checkpoint_s_write_stops_once_the_file_is_whole(tmp_path, capsys):
    """Both Ctrl-Cs land in the write (train.py's save_checkpoint runs it deferred): nothing is raised
    inside it, the file is written whole, and then the run stops as at once: status 130, one line.
    (Raised inside torch.save, the stop left its writer mid-record: torch's error, a traceback, 1.)"""
    signals = StopSignals(is_main=True)
    try:
        with pytest.raises(SystemExit) as stopped, signals.deferred():
            signal.raise_signal(signal.SIGINT)  # the first: save at the next log step
            signal.raise_signal(signal.SIGINT)  # the second: at once, but for the write
            torch.save({"w": torch.arange(1000)}, tmp_path / "ckpt.pt")
    finally:
        signals.restore()
    assert stopped.value.code == 130
    assert torch.equal(torch.load(tmp_path / "ckpt.pt", weights_only=True)["w"], torch.arange(1000))
    out, err = capsys.readouterr()
    assert "Ctrl-C again: stopping once the checkpoint being written is whole" in out
    assert err.startswith("train.py: stopped at once by a second Ctrl-C after step 0, unsaved; no checkpoint")


@pytest.mark.slow  # a real process, signalled twice
def test_a_second_ctrl_c_stops_at_once_in_one_line_with_status_130(byte_shards, tmp_path):
    # No log step in reach (the first Ctrl-C would save there and exit 0); a checkpoint every 2 steps.
    args = [*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--max_steps=100000",
            "--log_interval=100000", "--checkpoint_interval=2", "--batch_size=2", "--micro_batch_size=2"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoint, deadline = tmp_path / "default" / "ckpt.pt", time.time() + 120
    while time.time() < deadline and not checkpoint.exists():
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "Ctrl-C: saving at the next log step" in stdout
    said = [line for line in stderr.splitlines() if "train.py" in line]  # (the rest: the progress bar's)
    assert len(said) == 1 and said[0].startswith("train.py: stopped at once by a second Ctrl-C after step "), stderr
    line = said[0]
    assert f"; the last checkpoint is {checkpoint} (step " in line and line.endswith(
        f"): resume with python train.py {' '.join(args)} --resume"), line
