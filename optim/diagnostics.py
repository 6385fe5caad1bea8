"""Optimizer diagnostics, computed only on the steps that ask for them.

The training loop calls ``request_diagnostics()`` before the step of a log interval and
``pop_diagnostics()`` after it. Between requests an optimizer computes nothing extra and causes
no host synchronisation; on a requested step it records 0-d tensors per parameter, and
``pop_diagnostics`` moves them to the host in one transfer.

Keys are ``"<statistic>/<parameter name>"`` (e.g. ``"clip_fraction/transformer.h.3.attn.c_attn.weight"``),
so a dashboard shows each statistic as one panel group with a curve per layer.
"""
import math
from contextlib import contextmanager

import torch
from torch import Tensor


class DiagnosticsMixin:
    """Mix into a torch.optim.Optimizer; its step() checks ``diagnostics_requested``."""

    _diagnostics_requested = False

    def request_diagnostics(self) -> None:
        self._diagnostics_requested = True
        self._diagnostics = {}

    @property
    def diagnostics_requested(self) -> bool:
        return self._diagnostics_requested

    def record_diagnostics(self, group: dict, index: int, **stats: Tensor) -> None:
        """Record statistics of parameter ``group["params"][index]`` for this step."""
        name = group["names"][index] if "names" in group else f"group{self.param_groups.index(group)}.{index}"
        for stat, value in stats.items():
            self._diagnostics[f"{stat}/{name}"] = value.detach().float().reshape(())

    def pop_diagnostics(self) -> dict[str, float]:
        """This step's statistics as floats (one device-to-host copy); {} if none were requested."""
        self._diagnostics_requested = False
        records, self._diagnostics = getattr(self, "_diagnostics", {}), {}
        if not records:
            return {}
        values = torch.stack([v.to(next(iter(records.values())).device) for v in records.values()]).tolist()
        return dict(zip(records, values))


@contextmanager
def update_rms_recorded(optimizer: DiagnosticsMixin):
    """Record ``update_rms`` (RMS of each parameter's change) over the enclosed step.

    Generic, so it measures what the step really did (decay included, after rounding). It costs a
    copy of the parameters, which is why optimizers enter it on requested steps only.
    """
    params = [p.detach() for group in optimizer.param_groups for p in group["params"]]
    before = [torch.empty_like(p) for p in params]
    torch._foreach_copy_(before, params)
    yield
    norms = iter(torch._foreach_norm(torch._foreach_sub(params, before)))
    for group in optimizer.param_groups:
        for index, p in enumerate(group["params"]):
            norm = next(norms)
            if p.grad is not None:  # parameters without a gradient were not stepped
                optimizer.record_diagnostics(group, index, update_rms=norm / math.sqrt(p.numel()))
