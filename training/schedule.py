"""Learning-rate schedules: linear warmup, then cosine decay or warmup-stable-decay (WSD)."""

import math


def learning_rate(step: int, *, total: int, warmup: int, lr: float, min_lr: float,
                  schedule: str = "cosine", decay_fraction: float = 0.2) -> float:
    """The lr of optimizer step `step` (0-based) out of `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "cosine":
        progress = (step - warmup) / max(1, total - warmup)
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))
    # wsd: hold the peak, then decay linearly to min_lr over the last decay_fraction of training
    decay_start = total - int(decay_fraction * total)
    if step < decay_start:
        return lr
    progress = (step - decay_start + 1) / max(1, total - decay_start)
    return lr + (min_lr - lr) * min(progress, 1.0)
