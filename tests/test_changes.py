"""A resumed run is the same run (training/checkpoint/format.py, Checkpoint.changes_on_resume): a setting
that defines what is trained and differs from the checkpoint's is refused, every one named, unless
the config names it in allow_changes; an allowed change applies for real from the resumed step
(the weights equal a run that made the change by hand at that step) and is recorded in the
checkpoint, config.json (the start settings and the changes), metrics.jsonl, and the study leaves
such a run out with a note."""
import argparse
import json
import re

import pytest
import torch

from configs import load_config
from helpers import TINY_RUN, read_metrics, train_here
from study.runs import study_runs
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.parts import Part, Step

CHANGED_AT = 4


class ChangeByHand(Part):
    """After step CHANGED_AT, what the resumed run's allowed changes do: weight decay 0.5 on the
    decayed groups, MERIT's maxLAMB on."""

    def __init__(self, run):
        self.optimizer = run.optimizer

    def after_step(self, step: Step) -> None:
        if step.number == CHANGED_AT:
            for group in self.optimizer.param_groups:
                group["maxlamb"] = True
                if group["weight_decay"]:
                    group["weight_decay"] = 0.5


def args(byte_shards, out, *extra):
    return [*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={out}", "--run_name=run", "--optimizer=merit",
            "--max_steps=8", "--batch_size=4", "--micro_batch_size=2", "--log_interval=2", "--lr=1e-2",
            "--weight_decay=0.01", "--eval_interval=4", *extra]


CHANGES = ["--weight_decay=0.5", "--optimizer_options={'maxlamb': True}"]


def test_a_change_is_refused_with_every_key_named_until_the_config_names_it(byte_shards, tmp_path):
    train_here(*args(byte_shards, tmp_path, f"--stop_at_step={CHANGED_AT}"))
    before = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    refused = train_here(*args(byte_shards, tmp_path, "--resume", *CHANGES, "--z_loss=0.1"), check=False)
    assert refused.returncode == 1
    assert (f"at step {CHANGED_AT} would change what the run trains (optimizer_options: checkpoint {{'maxlamb': "
            f"False, ") in refused.stderr
    assert "weight_decay: checkpoint 0.01, now 0.5; z_loss: checkpoint 0.0, now 0.1" in refused.stderr
    assert "--allow_changes=optimizer_options,weight_decay,z_loss" in refused.stderr
    partly = train_here(*args(byte_shards, tmp_path, "--resume", *CHANGES, "--z_loss=0.1",
                              "--allow_changes=weight_decay,optimizer_options"), check=False)
    assert partly.returncode == 1 and "(z_loss: checkpoint 0.0, now 0.1)" in partly.stderr
    assert "--allow_changes=optimizer_options,weight_decay,z_loss" in partly.stderr
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == before  # refused before anything is written
    fixed = train_here(*args(byte_shards, tmp_path, "--resume", "--seed=7", "--allow_changes=seed"), check=False)
    assert fixed.returncode == 1 and "does not match this config (seed: checkpoint 1337, now 7)" in fixed.stderr


def test_an_allowed_change_applies_from_the_resumed_step_and_is_recorded(byte_shards, tmp_path):
    by_hand = tmp_path / "by_hand"
    train_here(*args(byte_shards, by_hand, "--extra_parts=test_changes:ChangeByHand"))
    resumed = tmp_path / "resumed"
    train_here(*args(byte_shards, resumed, f"--stop_at_step={CHANGED_AT}"))
    result = train_here(*args(byte_shards, resumed, "--resume", *CHANGES,
                              "--allow_changes=weight_decay,optimizer_options"))
    assert "weight_decay 0.01 -> 0.5 from here on" in result.stdout

    # Applied for real: the weights and the losses of the run that made the change by hand.
    mine, theirs = (Checkpoint.load(folder / "run" / CHECKPOINT_NAME) for folder in (resumed, by_hand))
    assert all(torch.equal(mine.model[key], theirs.model[key]) for key in theirs.model)
    losses = [[(r["step"], r["train/loss"]) for r in read_metrics(folder / "run") if "train/loss" in r]
              for folder in (resumed, by_hand)]
    assert losses[0] == losses[1] and len(losses[0]) == 4

    # Recorded: the checkpoint, config.json (the start settings, then the changes), the log's event.
    assert [(c["step"], c["key"], c["from"], c["to"]) for c in mine.changes] == [
        (CHANGED_AT, "optimizer_options", {**mine.changes[0]["from"], "maxlamb": False},
         {**mine.changes[0]["from"], "maxlamb": True}),
        (CHANGED_AT, "weight_decay", 0.01, 0.5)]
    assert mine.config["weight_decay"] == 0.5 and mine.config["optimizer_options"]["maxlamb"] is True
    recorded = json.loads((resumed / "run" / "config.json").read_text())
    assert recorded["weight_decay"] == 0.01 and recorded["optimizer_options"]["maxlamb"] is False
    assert recorded["changes"] == mine.changes
    events = [r["event"] for r in read_metrics(resumed / "run") if "event" in r]
    assert events == [{"changes": mine.changes}]
    with pytest.warns(UserWarning, match=r"records 2 setting\(s\) changed when its run resumed \(optimizer_options"):
        start = load_config(str(resumed / "run" / "config.json"))
    assert start.weight_decay == 0.01  # a config.json is the run's start

    # Resumed again with the changed settings: nothing new to name, the record kept.
    train_here(*args(byte_shards, resumed, "--resume", *CHANGES, "--max_steps=10", "--allow_changes=max_steps",
                     "--log_interval=1"))
    again = json.loads((resumed / "run" / "config.json").read_text())
    assert [c["key"] for c in again["changes"]] == ["optimizer_options", "weight_decay", "max_steps"]
    assert again["max_steps"] == 8 and again["changes"][-1] == {"step": 8, "key": "max_steps", "from": 8, "to": 10}

    # The study: a run whose settings changed is no point's, and says so.
    selected = study_runs(argparse.Namespace(paths=[tmp_path], select_on="val/loss"), "report")
    assert [r.folder for r in selected] == [by_hand / "run"]


def test_an_unknown_name_in_allow_changes_is_refused_with_its_likely_key_and_never_suggested(byte_shards, tmp_path):
    train_here(*args(byte_shards, tmp_path, f"--stop_at_step={CHANGED_AT}"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    for names, unknown, meant in (("wieght_decay", "wieght_decay", "weight_decay"),
                                  ("weight_decay, z_los", "z_los", "z_loss")):
        refused = train_here(*args(byte_shards, tmp_path, "--resume", "--weight_decay=0.5", "--z_loss=0.1",
                                   f"--allow_changes={names}"), check=False)
        assert refused.returncode == 1
        assert (f"allow_changes={names!r}: {unknown!r} is not a config key; did you mean {meant!r}?"
                in refused.stderr), refused.stderr
        assert not re.search(rf"--allow_changes=\S*{unknown}", refused.stderr)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == before
