"""The hyper-parameter checks every optimizer of this package shares."""


def check_hyperparameters(h: dict) -> None:
    """ValueError naming the bad value of lr, betas, weight_decay and (when present) eps."""
    # Written as "not (valid)" so that NaN is rejected too.
    if not h["lr"] >= 0.0:
        raise ValueError(f"Invalid learning rate: {h['lr']} (must be >= 0)")
    for i, beta in enumerate(h["betas"]):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta} (must be in [0, 1))")
    if "eps" in h and not h["eps"] >= 0.0:
        raise ValueError(f"Invalid epsilon value: {h['eps']} (must be >= 0)")
    if not h["weight_decay"] >= 0.0:
        raise ValueError(f"Invalid weight_decay value: {h['weight_decay']} (must be >= 0)")
