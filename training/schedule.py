"""Learning-rate schedules: linear warmup, then cosine decay, warmup-stable-decay (WSD) or the peak
held ("constant", for an optimizer that averages instead of decaying: Schedule-Free AdamW), in tokens.

A schedule runs in training tokens, so that a batch schedule (training/batch_schedule.py) does not
stretch it. Its landmarks are step boundaries of the run: the warmup ends after the run's warmup
steps, and WSD's decay begins ``int(decay_fraction x steps)`` steps before the end. With a fixed
batch every quantity is the step-counted schedule's times the tokens a step, so the lr of each
step is the same float as the step-counted schedule's (a ratio of integers is rounded once,
whatever their common factor; the warmup's product is taken in the step's units, as in steps).
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LrSchedule:
    total: int  # the run's training tokens
    warmup: int  # the tokens of the warmup steps
    decay_start: int  # WSD: the tokens before the decay steps
    lr: float  # the peak
    min_lr: float  # where it decays to
    kind: str = "cosine"  # "cosine", "wsd" or "constant"

    def __call__(self, tokens: int, step_tokens: int, scale: float = 1.0) -> float:
        """The lr of the optimizer step over the tokens [tokens, tokens + step_tokens), with lr and
        min_lr multiplied by ``scale`` (a batch schedule's lr rule)."""
        lr, min_lr = self.lr * scale, self.min_lr * scale
        if tokens < self.warmup:  # lr x (step + 1) / warmup steps, in this step's units (the same float)
            return lr * ((tokens + step_tokens) / step_tokens) / (self.warmup / step_tokens)
        if self.kind == "constant":
            return lr
        if self.kind == "cosine":
            progress = (tokens - self.warmup) / max(1, self.total - self.warmup)
            return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))
        # wsd: hold the peak, then decay linearly to min_lr over the last decay steps
        if tokens < self.decay_start:
            return lr
        progress = (tokens - self.decay_start + step_tokens) / max(1, self.total - self.decay_start)
        return lr + (min_lr - lr) * min(progress, 1.0)


def decay_steps(total_steps: int, decay_fraction: float) -> int:
    """WSD's decay: the last ``decay_fraction`` of the run's steps."""
    return int(decay_fraction * total_steps)
