"""A part of a run defined here, outside train.py (training/parts.py): a config adds it
(``extra_parts``), the loop tells it about every step, its metric is logged and its state is
checkpointed, so a run stopped and resumed logs and saves what an uninterrupted one does. No line
of train.py names it."""
import math
import re

import pytest
import torch

from helpers import ROOT, TINY_RUN, read_metrics, train_here
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.parts import Part, Step


class GradNormEMA(Part):
    """An exponential moving average of the clipped step's gradient norm (a metric with state),
    kept on the device: no host sync on an ordinary step."""

    name = "grad_norm_ema"
    decay = 0.75

    def __init__(self, run):
        self.run = run
        self.ema = torch.zeros((), dtype=torch.float64)
        self.steps = 0

    def after_step(self, step: Step) -> None:
        self.ema = self.decay * self.ema + (1 - self.decay) * self.run.grad_norm.double()
        self.steps += 1

    def measure(self, step: Step) -> dict[str, float]:
        return {"test/grad_norm_ema": self.ema.item(), "test/steps_seen": self.steps}

    def state_dict(self) -> dict:
        return {"ema": self.ema.clone(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.ema, self.steps = state["ema"].clone(), state["steps"]


def run_args(byte_shards, out, *extra):
    return [*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={out}", "--run_name=run", "--max_steps=8",
            "--batch_size=4", "--micro_batch_size=2", "--log_interval=1", "--lr=1e-2",
            f"--extra_parts={__name__}:GradNormEMA", *extra]


def test_a_part_defined_here_is_trained_logged_and_resumed_bitwise(byte_shards, tmp_path):
    train_here(*run_args(byte_shards, tmp_path / "whole"))
    train_here(*run_args(byte_shards, tmp_path / "halves", "--stop_at_step=4"))
    train_here(*run_args(byte_shards, tmp_path / "halves", "--resume"))

    whole = [r for r in read_metrics(tmp_path / "whole" / "run") if "train/loss" in r]
    # Its metric, at every log step, is the EMA of the logged gradient norms (float64, written out).
    expected = 0.0
    for record in whole:
        expected = GradNormEMA.decay * expected + (1 - GradNormEMA.decay) * record["grad_norm"]
        assert record["test/steps_seen"] == record["step"]
        assert math.isclose(record["test/grad_norm_ema"], expected, rel_tol=1e-6)
    assert len(whole) == 8

    # Resumed from its state: the same records (but the speed; each invocation writes its run_info)
    # and the same checkpoint, bitwise.
    def series(run):
        return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "memory/peak")}
                for r in read_metrics(run) if "step" in r]
    assert series(tmp_path / "halves" / "run") == series(tmp_path / "whole" / "run")
    saved, resumed = (Checkpoint.load(tmp_path / run / "run" / CHECKPOINT_NAME) for run in ("whole", "halves"))
    assert saved.parts["grad_norm_ema"]["steps"] == 8
    assert torch.equal(saved.parts["grad_norm_ema"]["ema"], resumed.parts["grad_norm_ema"]["ema"])
    assert all(torch.equal(saved.model[k], resumed.model[k]) for k in saved.model)

    assert "GradNormEMA" not in (ROOT / "train.py").read_text()


@pytest.mark.parametrize("name, error", [
    ("no_such_module:Part", r"extra_parts='no_such_module:Part': 'no_such_module:Part' cannot be imported"),
    ("helpers:ROOT", r"'helpers:ROOT' is not a subclass of training.parts.Part"),
])
def test_an_extra_part_that_cannot_be_used_is_a_clear_error(byte_shards, tmp_path, name, error):
    result = train_here(*run_args(byte_shards, tmp_path), f"--extra_parts={name}", check=False)
    assert result.returncode == 1
    assert re.search(error, result.stderr), result.stderr[-2000:]
    assert not (tmp_path / "run").exists()  # refused before anything is written
