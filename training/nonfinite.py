"""The non-finite policy's bookkeeping (config ``nonfinite``): which steps had a NaN/inf gradient.

Every count lives on the device and is updated there each step, so ordinary steps make no host
sync; the loop reads it where it syncs anyway (log steps, checkpoints) through ``check``. With
"skip" the optimizer drops a flagged update on the device (``step_unless``), so a run of skipped
steps is noticed at the next log step: by then nothing was applied, only compute was spent.
"""
from collections.abc import Callable

import torch
from torch import Tensor


class NonFiniteError(RuntimeError):
    """Training met a NaN or inf it may not go on with (config.nonfinite)."""


class NonFiniteSteps:
    def __init__(self, policy: str, max_in_a_row: int, device: torch.device):
        self.policy, self.max_in_a_row = policy, max_in_a_row
        count = lambda value=0: torch.full((), value, dtype=torch.long, device=device)  # noqa: E731
        self.first = count(-1)           # the first non-finite step ("stop" raises at it)
        self.last = count(-1)            # the latest one
        self.total = count()             # skipped steps in all ("skip")
        self.in_a_row = count()          # ending at the current step
        self.limit_reached_at = count(-1)  # the step where in_a_row first reached max_in_a_row
        self.reported = 0                # skipped steps already reported on the console

    def record(self, step: int, finite: Tensor) -> None:
        """Step ``step`` (1-based) had a finite gradient or not (a 0-d bool tensor)."""
        bad = ~finite
        self.first = torch.where((self.first < 0) & bad, step, self.first)
        self.last = torch.where(bad, step, self.last)
        self.total += bad
        self.in_a_row = (self.in_a_row + 1) * bad
        self.limit_reached_at = torch.where((self.limit_reached_at < 0) & (self.in_a_row >= self.max_in_a_row),
                                            step, self.limit_reached_at)

    def check(self, last_good: Callable[[int], str]) -> str | None:
        """Raise NonFiniteError if the policy says stop, with ``last_good(first non-finite step)``,
        the sentence about which checkpoint to go back to; else a line about the steps skipped
        since the last check (None if there were none). One host read."""
        first, last, total, limit_at = torch.stack([self.first, self.last, self.total,
                                                    self.limit_reached_at]).tolist()
        last_good = last_good(first)
        if self.policy == "stop":
            if first >= 0:
                raise NonFiniteError(f"non-finite gradient at step {first}: stopping without saving. {last_good}. "
                                     f"To drop such steps instead, set nonfinite='skip'")
            return None
        if limit_at >= 0:
            raise NonFiniteError(f"{self.max_in_a_row} steps in a row had a non-finite gradient (the last at step "
                                 f"{limit_at}); stopping. {last_good}")
        new, self.reported = total - self.reported, total
        if not new:
            return None
        return (f"non-finite gradient on {new} step{'s' if new > 1 else ''} since the last check (the last at step "
                f"{last}): update{'s' if new > 1 else ''} skipped, {total} in all")

    @property
    def skipped(self) -> int:
        """Skipped steps in all (a host read)."""
        return int(self.total)
