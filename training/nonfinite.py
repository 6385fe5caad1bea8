"""The non-finite policy's bookkeeping (config ``nonfinite``): which steps had a NaN/inf gradient.

A step records its verdict, a 0-d device tensor, and nothing more (no device operation, no host
sync); the counts are made from the verdicts where the loop syncs anyway (log steps, checkpoints),
through ``check``, in one host read: the verdicts held meanwhile are those of the steps since the
last check (log_interval's at most). With
"skip" the optimizer drops a flagged update on the device (``step_unless``), so a run of skipped
steps is noticed at the next log step: by then nothing was applied, only compute was spent. A
stop names the checkpoint to go back to (``recovery_advice``), from the steps the run saved.
"""
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from training.checkpoint import CHECKPOINT_NAME, numbered


class NonFiniteError(RuntimeError):
    """Training met a NaN or inf it may not go on with (config.nonfinite)."""


class NonFiniteSteps:
    def __init__(self, policy: str, max_in_a_row: int, run_dir: Path, checkpoint_steps: list[int]):
        """``checkpoint_steps``: the steps of the checkpoints the run writes (and the one it
        resumed), oldest first; the run appends to it."""
        self.policy, self.max_in_a_row = policy, max_in_a_row
        self.run_dir, self.checkpoint_steps = run_dir, checkpoint_steps
        # The counts of the steps up to the last check:
        self.first = -1             # the first non-finite step ("stop" raises at it)
        self.last = -1              # the latest one
        self.total = 0              # skipped steps in all ("skip")
        self.in_a_row = 0           # ending at the last step counted
        self.limit_reached_at = -1  # the step where in_a_row first reached max_in_a_row
        self.reported = 0           # skipped steps already reported on the console
        self.pending: list[tuple[int, Tensor]] = []  # (step, finite) recorded since

    def record(self, step: int, finite: Tensor, committed: bool = True) -> None:
        """Step ``step`` (1-based) had a finite gradient or not (a 0-d bool tensor); a step that was
        not ``committed`` (replica groups dropped it) trained nothing, and is not recorded."""
        if committed:
            self.pending.append((step, finite))

    def count(self) -> None:
        """The pending steps counted (one host read)."""
        if not self.pending:
            return
        steps = [step for step, _ in self.pending]
        verdicts = torch.stack([finite for _, finite in self.pending]).tolist()
        self.pending = []
        for step, finite in zip(steps, verdicts):
            if not finite:
                self.first = step if self.first < 0 else self.first
                self.last, self.total = step, self.total + 1
            self.in_a_row = 0 if finite else self.in_a_row + 1
            if self.limit_reached_at < 0 and self.in_a_row >= self.max_in_a_row:
                self.limit_reached_at = step

    def check(self, step: int, parameters_finite: Callable[[], bool] = lambda: True,
              on_stop: Callable[[dict], None] = lambda event: None) -> str | None:
        """Raise NonFiniteError if the policy says stop, or if ``parameters_finite()`` says the
        parameters are not (whatever made them so: never save them), naming the checkpoint to go
        back to, after handing ``on_stop`` the event for the run's record ({"nonfinite": {"step",
        "error"}}); else a line about the steps skipped since the last check (None if there were
        none). One host read, and the parameters' check."""
        self.count()
        first, last, total, limit_at = self.first, self.last, self.total, self.limit_reached_at
        last_good = recovery_advice(self.run_dir, self.checkpoint_steps, first)
        error = None
        if self.policy == "stop" and first >= 0:
            error = (f"non-finite gradient at step {first}: stopping without saving. {last_good}. To drop such steps "
                     f"instead, set nonfinite='skip'")
        elif self.policy == "skip" and limit_at >= 0:
            error = (f"{self.max_in_a_row} steps in a row had a non-finite gradient (the last at step {limit_at}); "
                     f"stopping. {last_good}")
        elif not parameters_finite():
            error = f"the parameters are not finite at step {step}: stopping without saving. {last_good}"
        if error:
            on_stop({"nonfinite": {"step": step, "error": error}})
            raise NonFiniteError(error)
        if self.policy == "stop":
            return None
        new, self.reported = total - self.reported, total
        if not new:
            return None
        return (f"non-finite gradient on {new} step{'s' if new > 1 else ''} since the last check (the last at step "
                f"{last}): update{'s' if new > 1 else ''} skipped, {total} in all")

    @property
    def skipped(self) -> int:
        """Skipped steps in all (a host read)."""
        self.count()
        return self.total


def recovery_advice(run_dir: Path, checkpoint_steps: list[int], first_nonfinite: int = -1) -> str:
    """Which checkpoint of ``run_dir`` to go back to (``checkpoint_steps``: this invocation's, and the
    resumed one, oldest first). A checkpoint written after a skipped (non-finite) step holds
    weights the steps around it may have driven off (|w| of 1e5 after an lr of 1e6 is finite):
    the one before the first non-finite step is named too."""
    if not checkpoint_steps:
        return "No checkpoint was written yet"
    last_checkpoint_step = checkpoint_steps[-1]
    newest = (f"The last good checkpoint is {run_dir / CHECKPOINT_NAME} at step {last_checkpoint_step}: "
              f"resume it with --resume, e.g. with a lower lr")
    if first_nonfinite < 0 or last_checkpoint_step < first_nonfinite:
        return newest
    before = [step for step in checkpoint_steps if step < first_nonfinite]
    kept = [path for path in numbered(run_dir) if before and path.name.startswith(f"ckpt_{before[-1]:08d}.")]
    earlier = (f"the last one before it is {kept[0]} (step {before[-1]}): point {CHECKPOINT_NAME} at it "
               f"(ln -sfn {kept[0].name} {run_dir / CHECKPOINT_NAME}) and resume with --resume" if kept else
               "no checkpoint from before it is kept (keep more with keep_checkpoints or "
               "permanent_checkpoint_interval)")
    return (f"The newest checkpoint, {run_dir / CHECKPOINT_NAME} at step {last_checkpoint_step}, was "
            f"written after the first non-finite step {first_nonfinite}, so its weights may be damaged though "
            f"finite; {earlier}")
