"""The mini study's setting (scripts/mini_study.py; docs/study.md): a small GPT on Shakespeare's
byte tokens, each run trained on the same TOKENS tokens; what follows from a run's batch
(``schedule``); and the paper preset's optimizers with the lr grid around each one's centre
(``OPTIMIZERS``, ``lr_grid``). The studies built on it (scripts/cbs_study.py,
scripts/replica_study.py) and scripts/bench_batch.py's small batches start from the same."""

DATA = "cache/data/shakespeare-byte"
BLOCK = 64
TOKENS = 1_048_576  # 16 x 65,536: every batch of the study divides it
BASE = {
    "data_dir": DATA, "tokenizer": "byte",
    "model": "nano", "n_layer": 4, "n_head": 4, "n_embd": 64, "block_size": BLOCK, "dropout": 0.0,
    "lr_schedule": "cosine", "grad_clip": 1.0,
    "val_tokens": 16_384, "heldout_tokens": 32_768, "probe_batch_size": 8, "sample_tokens": 0,
}
REFERENCE_BATCH = 128
OPTIMIZERS = {  # name: (config changes, grid centre at REFERENCE_BATCH, its exponent in the batch)
    "adamw": ({"optimizer": "adamw"}, 3e-3, 0.0),
    "lamb": ({"optimizer": "lamb"}, 3e-2, 0.25),
    "merit": ({"optimizer": "merit"}, 3e-2, 0.5),
    "muon": ({"optimizer": "muon"}, 2e-2, 0.5),
}
LR_FACTOR = 3.0


def schedule(batch: int, tokens: int, block: int, micro_steps: int = 2) -> dict:
    """What follows from the batch: ``micro_steps`` accumulation micro-steps (two, so that the
    gradient noise scale is measured; the small_batch preset's one: a batch of one sequence cannot
    be split, and accumulation is what it is compared against, so it measures no noise scale), a
    warmup of 5% of the steps (at least 5), 8 evaluations and 16 log steps."""
    steps = tokens // (batch * block)
    return {"max_tokens": tokens, "batch_size": batch, "micro_batch_size": batch // micro_steps,
            "warmup_steps": max(5, round(0.05 * steps)), "eval_interval": max(1, steps // 8),
            "log_interval": max(1, steps // 16)}


def lr_grid(centre: float, exponent: float, batch: int, factor: float = LR_FACTOR, points: int = 3) -> list[float]:
    """``points`` lrs (an odd number: 3, or 1, the centre alone) a ``factor`` apart around ``centre``
    (the lr at REFERENCE_BATCH) scaled to ``batch`` by (batch ratio) ** ``exponent``, rounded."""
    if points % 2 == 0:
        raise ValueError(f"lr_grid: points={points}: an odd number, so that the centre is one of them")
    lr = centre * (batch / REFERENCE_BATCH) ** exponent
    return [round_lr(lr * factor ** i) for i in range(-(points // 2), points // 2 + 1)]


def round_lr(lr: float) -> float:
    """``lr`` to 3 significant digits (the grid's lrs, and the lrs it grows by)."""
    return float(f"{lr:.3g}")
