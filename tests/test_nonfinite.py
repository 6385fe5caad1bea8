"""The non-finite policy: "stop" exits non-zero and never saves a non-finite state over a good
checkpoint; "skip" drops the update (parameters and optimizer state untouched) and goes on."""
import copy

import pytest
import torch

from configs import load_config
from helpers import ROOT, TINY_RUN, no_host_reads, read_metrics, train_here
from train import NonFiniteError, Trainer
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.noise_scale import GradientNoiseScale
from training.nonfinite import NonFiniteSteps
from training.parts import Step
from training.run_config import resolve_config

RUN = [*TINY_RUN, "--batch_size=2", "--micro_batch_size=2", "--lr=0.01", "--min_lr=0.0", "--warmup_steps=0"]


def test_stop_keeps_the_good_checkpoint_when_a_resumed_run_diverges(byte_shards, tmp_path):
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--optimizer=adamw",
              "--log_interval=2", "--checkpoint_interval=2"]
    train_here(*common, "--max_steps=4")
    path = tmp_path / "default" / CHECKPOINT_NAME
    good = path.read_bytes()
    # lr 1e30: step 5's update overflows the weights, step 6's gradient is NaN.
    diverged = train_here(*common, "--max_steps=8", "--resume", "--lr=1e30", "--allow_changes=max_steps,lr",
                          check=False)
    assert diverged.returncode == 1, diverged.stderr[-2000:]
    assert "non-finite gradient at step 6: stopping without saving" in diverged.stderr
    assert f"The last good checkpoint is {path} at step 4" in diverged.stderr
    stopped = [r["event"]["nonfinite"] for r in read_metrics(tmp_path / "default") if "nonfinite" in r.get("event", {})]
    assert [s["step"] for s in stopped] == [6] and "non-finite gradient at step 6" in stopped[0]["error"]  # recorded
    assert path.read_bytes() == good  # never overwritten by the diverged state
    assert all(t.isfinite().all() for t in Checkpoint.load(path).model.values())


def _trainer(byte_shards, tmp_path, *extra):
    return Trainer(resolve_config(load_config(None, [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}",
                                              "--log_interval=1", *extra])))


def _poison(trainer, steps):
    """NaN in one gradient element on the given (1-based) optimizer steps."""
    forward_backward = trainer.forward_backward

    def poisoned(loss_fn, *observers):
        loss = forward_backward(loss_fn, *observers)
        if trainer.step + 1 in steps:
            next(trainer.model.parameters()).grad.view(-1)[0] = float("nan")
        return loss
    trainer.forward_backward = poisoned


def test_skip_leaves_parameters_and_optimizer_state_untouched(byte_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    trainer = _trainer(byte_shards, tmp_path, "--nonfinite=skip", "--max_steps=5", "--optimizer=merit")
    _poison(trainer, {3})
    snapshots = {}
    train_step = trainer.train_step

    def recording(step):
        before = (copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(trainer.optimizer.state_dict()))
        loss = train_step(step)
        snapshots[step.number] = before, step.finite.item()
        return loss
    trainer.train_step = recording
    try:
        trainer.train()
    finally:
        trainer.close()
    (model_before, optim_before), finite = snapshots[3]
    (model_after, optim_after), _ = snapshots[4]  # the state step 4 started from
    assert not finite and trainer.nonfinite.skipped == 1 and trainer.step == 5
    assert all(torch.equal(model_before[k], model_after[k]) for k in model_before)
    for x, y in zip(optim_before["state"].values(), optim_after["state"].values()):
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert not all(torch.equal(snapshots[2][0][0][k], model_before[k]) for k in model_before)  # others did move
    saved = Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME)
    assert saved.step == 5 and all(t.isfinite().all() for t in saved.model.values())


def test_skip_stops_after_max_skipped_steps_in_a_row(byte_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    trainer = _trainer(byte_shards, tmp_path, "--nonfinite=skip", "--max_skipped_steps=3", "--max_steps=20")
    _poison(trainer, {2, 4, 5, 6, 7})
    with pytest.raises(NonFiniteError, match="3 steps in a row had a non-finite gradient \\(the last at step 6\\)"):
        trainer.train()
    trainer.close()
    assert trainer.nonfinite.skipped == 4


# (what runs on CUDA tensors; Triton's interpreter under "stop" in the full suite only: "skip" drops on the device)
@pytest.mark.parametrize("policy,optim_backend", [("stop", "torch"), ("skip", "torch"), ("skip", "triton"),
                                                  pytest.param("stop", "triton", marks=pytest.mark.slow)])
def test_an_ordinary_step_reads_nothing_on_the_host(byte_shards, tmp_path, monkeypatch, policy, optim_backend):
    """No host sync on ordinary steps, under either policy: the verdict, the skip and the
    bookkeeping stay on the device (read at log steps only), with every instrument on (z_loss, and
    the noise scale, which accumulation makes possible on one rank)."""
    monkeypatch.chdir(ROOT)
    trainer = _trainer(byte_shards, tmp_path, f"--nonfinite={policy}", f"--optim_backend={optim_backend}",
                       "--optimizer=merit", "--max_steps=4", "--z_loss=1e-4", "--batch_size=4")
    assert trainer.schedule.accumulation == 2 and trainer.parts.find(GradientNoiseScale) is not None
    _poison(trainer, {2})
    try:
        before = copy.deepcopy(trainer.model.state_dict())
        for _ in range(3):
            with no_host_reads():
                trainer.train_step(Step(trainer.step + 1))
            trainer.state.step += 1
        moved = not all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
        assert moved and len(trainer.nonfinite.pending) == 3  # the verdicts, not read yet
        if policy == "skip":
            assert trainer.nonfinite.skipped == 1
            assert "on 1 step since the last check (the last at step 2)" in trainer.nonfinite.check(trainer.step)
        else:
            with pytest.raises(NonFiniteError, match="non-finite gradient at step 2"):
                trainer.check_finite()
    finally:
        trainer.close()


def test_skip_names_the_checkpoint_from_before_the_first_skipped_step(byte_shards, tmp_path, monkeypatch):
    # Checkpoints at 2 and 4; step 3 is skipped and 5-7 too: the newest (4) came after the first skip.
    monkeypatch.chdir(ROOT)
    trainer = _trainer(byte_shards, tmp_path, "--nonfinite=skip", "--max_skipped_steps=3", "--max_steps=20",
                       "--checkpoint_interval=2", "--keep_checkpoints=3")
    _poison(trainer, {3, 5, 6, 7})
    with pytest.raises(NonFiniteError) as error:
        trainer.train()
    trainer.close()
    run = tmp_path / "default"
    assert (f"The newest checkpoint, {run / CHECKPOINT_NAME} at step 6, was written after the first non-finite step "
            f"3, so its weights may be damaged though finite; the last one before it is {run / 'ckpt_00000002.pt'} "
            f"(step 2)") in str(error.value)


class DeviceCounts:
    """The counts as the device kept them, updated at every step: what the verdicts held until a check must give."""

    def __init__(self, max_in_a_row: int):
        count = lambda value=0: torch.full((), value, dtype=torch.long)  # noqa: E731
        self.max_in_a_row = max_in_a_row
        self.first, self.last, self.limit_reached_at = count(-1), count(-1), count(-1)
        self.total, self.in_a_row = count(), count()

    def record(self, step: int, finite: torch.Tensor) -> None:
        bad = ~finite
        self.first = torch.where((self.first < 0) & bad, step, self.first)
        self.last = torch.where(bad, step, self.last)
        self.total += bad
        self.in_a_row = (self.in_a_row + 1) * bad
        self.limit_reached_at = torch.where((self.limit_reached_at < 0) & (self.in_a_row >= self.max_in_a_row),
                                            step, self.limit_reached_at)


@pytest.mark.parametrize("max_in_a_row", [1, 3, 10])
def test_the_verdicts_counted_at_the_checks_are_the_counts_kept_step_by_step(tmp_path, max_in_a_row):
    steps = NonFiniteSteps("skip", max_in_a_row, tmp_path, [])
    reference = DeviceCounts(max_in_a_row)
    gen = torch.Generator().manual_seed(max_in_a_row)
    for number in range(1, 400):
        finite = torch.rand((), generator=gen) > (0.05 if number < 200 else 0.85)  # long runs of them later
        steps.record(number, finite)
        reference.record(number, finite)
        if number % 23 == 0 or number == 399:  # a log step
            steps.count()
            assert not steps.pending
            assert (steps.first, steps.last, steps.total, steps.in_a_row, steps.limit_reached_at) == tuple(
                int(t) for t in (reference.first, reference.last, reference.total, reference.in_a_row,
                                 reference.limit_reached_at))
    assert steps.limit_reached_at > 0 and steps.skipped == int(reference.total)
