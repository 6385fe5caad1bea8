"""Evaluation offline: `python -m eval.samples DIR` writes the sample tasks and prints the command
that evaluates them; `python -m eval --samples` does both in one command; a hub that cannot be
reached is found with one request (not the hub client's ~25 s of retries) and the error names the
--samples command, which then works. On an untrained byte-level model: no training needed. The
same through processes, on a trained checkpoint, is in tests/test_eval.py."""
import json
import re
import shlex
import socket
import time

import datasets
import huggingface_hub
import pytest
import torch

import eval.__main__ as cli
from data.tokenizer import get_tokenizer
from hf import export
from eval import evaluate, format_table, samples
from eval.scorer import Scorer
from eval.tasks import DATASETS_OFFLINE_FLAGS, TASKS, datasets_offline, tasks_named
from model import GPT, GPTConfig
from training.checkpoint import Checkpoint, load_model


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """A random 1-layer byte-level model whose 256-token window holds every sample task's answers."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny") / "ckpt.pt"
    Checkpoint.of_model(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=256, vocab_size=320)),
                        "byte").save(path)
    return path


@pytest.fixture
def datasets_home(tmp_path, monkeypatch):
    """datasets' cache in tmp_path (a copy of no hub dataset), its and huggingface_hub's progress
    bars as they were after the test (`python -m eval` turns them off)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    bars = datasets.is_progress_bar_enabled(), not huggingface_hub.utils.are_progress_bars_disabled()
    yield tmp_path / "hf_cache"
    if bars[0]:
        datasets.enable_progress_bars()
    if bars[1]:
        huggingface_hub.utils.enable_progress_bars()


def test_the_samples_command_writes_every_task_and_prints_how_to_evaluate_them(tmp_path, capsys):
    folder = tmp_path / "my tasks"
    samples.main([str(folder)])
    printed = capsys.readouterr().out
    for task in TASKS:
        rows = [json.loads(line) for line in (folder / f"{task}.jsonl").read_text().splitlines()]
        assert rows == json.loads(json.dumps(samples.FIXTURES[task])) and f"{task}.jsonl" in printed
    assert f"python -m eval --ckpt runs/NAME/ckpt.pt --tasks paper --data-dir '{folder}'" in printed
    mtimes = {path: path.stat().st_mtime_ns for path in folder.iterdir()}
    samples.main([str(folder)])  # the same files are left alone: datasets' cache of them stays valid
    assert {path: path.stat().st_mtime_ns for path in folder.iterdir()} == mtimes


def test_the_samples_command_has_help_and_needs_a_folder(capsys):
    with pytest.raises(SystemExit) as exit_info:
        samples.main(["--help"])
    assert exit_info.value.code == 0 and "usage: python -m eval.samples [-h] dir" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        samples.main([])
    assert exit_info.value.code == 2 and "required: dir" in capsys.readouterr().err


def closed_port_url() -> str:
    """An http address on this machine where nothing listens: a connection is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_an_unreachable_hub_fails_at_once_naming_the_offline_command_that_works(tiny_ckpt, tmp_path, datasets_home,
                                                                                monkeypatch, capsys):
    endpoint = closed_port_url()
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", endpoint)
    for flag in DATASETS_OFFLINE_FLAGS:  # online mode, as without HF_HUB_OFFLINE=1, whatever this shell sets
        monkeypatch.setattr(datasets.config, flag, False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    argv = ["--ckpt", str(tiny_ckpt), "--tasks", "copa,lambada_openai", "--out", str(tmp_path / "results.json")]
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert time.perf_counter() - start < 10  # the hub client alone retries for about 25 s
    message = str(exit_info.value.code)
    assert message.startswith(f"eval: task copa: the hub ({endpoint}) cannot be reached (ConnectError"), message
    assert "--data-dir DIR" in message and "`python -m eval.samples DIR`" in message
    assert not datasets_offline() and not huggingface_hub.constants.HF_HUB_OFFLINE  # offline for the loading only
    command = shlex.split(re.search(r"evaluate on the sample tasks, offline: (.*)$", message).group(1))
    assert command == ["python", "-m", "eval", *argv, "--samples"]

    capsys.readouterr()
    cli.main(command[3:])
    printed = capsys.readouterr()
    record = json.loads((tmp_path / "results.json").read_text())
    assert format_table(record["results"]) in printed.out and "Generating" not in printed.out + printed.err
    model, _ = load_model(tiny_ckpt)
    # (The CLI's default batch size, so both sides run the same kernels on the same shapes: equal bits.)
    alone = evaluate(Scorer(model, get_tokenizer("byte"), batch_size=16, show_progress=False),
                     tasks_named("copa,lambada_openai"),
                     data_dir=datasets_home / "nanomerit_eval_samples")
    assert timeless(record["results"]) == timeless(alone["results"])
    assert record["eval_config"]["samples"] is True


def timeless(results: dict) -> dict:
    return {task: {k: v for k, v in summary.items() if k != "seconds"} for task, summary in results.items()}


def test_samples_results_go_apart_from_the_checkpoints_results(tiny_ckpt, tmp_path, datasets_home, capsys):
    """Without --out, --samples writes results_samples_<step>.json beside the checkpoint: sample
    numbers never merge into the real results_<step>.json."""
    ckpt = tmp_path / "run" / "ckpt.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(tiny_ckpt.read_bytes())
    cli.main(["--ckpt", str(ckpt), "--tasks", "copa", "--samples"])
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["ckpt.pt", "results_samples_00000000.json"]
    assert "wrote " + str(ckpt.parent / "results_samples_00000000.json") in capsys.readouterr().out


def test_a_hugging_face_folders_results_go_beside_its_model(tiny_ckpt, tmp_path, datasets_home, monkeypatch, capsys):
    """``--hf FOLDER`` without --out writes into FOLDER, wherever the command runs from."""
    folder = export(tiny_ckpt, tmp_path / "hf")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cli.main(["--hf", str(folder), "--tasks", "copa", "--samples"])
    assert "wrote " + str(folder / "results_samples.json") in capsys.readouterr().out
    assert list(elsewhere.iterdir()) == []
    assert json.loads((folder / "results_samples.json").read_text())["hf"] == str(folder)


def test_a_results_file_that_cannot_be_written_is_refused_before_evaluating(tiny_ckpt, tmp_path):
    """(A path under a file: a folder without write permission is refused alike, but not to root.)"""
    note = tmp_path / "notes.txt"
    note.write_text("a file")
    with pytest.raises(SystemExit, match=re.escape(f"cannot write the results file {note / 'r.json'}: {note} is not a "
                                                   f"writable folder; choose another --out")):
        cli.main(["--ckpt", str(tiny_ckpt), "--tasks", "copa", "--data-dir", str(tmp_path / "no tasks"),
                  "--out", str(note / "r.json")])  # (its tasks' files are missing: refused before they are read)
