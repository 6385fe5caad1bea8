"""AdamW: torch's own implementation (docs/optimizers.md, "AdamW") with the training-loop protocol.

Fused where torch has a fused kernel, else foreach. On torch 2.13 the fused AdamW kernels run on
CPU and CUDA for every floating dtype (fp16, bf16, fp32, fp64; checked on CPU), so "allowed" is
decided by device type and floating-point-ness alone. ``optim_backend`` does not apply: the
kernels are torch's ("auto" and "torch" are accepted, a kernel name is an error).
"""
import torch

from .backends import check_setting
from .protocol import ADAM_BETAS, TrainingHooks

_FUSED_DEVICES = ("cpu", "cuda")


def adamw(params, *, lr: float, weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
          eps: float = 1e-8, backend: str = "auto") -> "AdamW":
    """``AdamW`` with torch's defaults; ``params`` in any form torch accepts."""
    check_setting(backend)
    if backend not in ("auto", "torch"):
        raise ValueError(f"optim_backend={backend!r} does not apply to AdamW, which runs torch's own fused "
                         f"kernels: use 'auto' or 'torch'")
    params = list(params)
    fused = all(p.is_floating_point() and p.device.type in _FUSED_DEVICES for p in _tensors(params))
    return AdamW(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                 fused=fused or None, foreach=None if fused else True)


class AdamW(TrainingHooks, torch.optim.AdamW):
    """``torch.optim.AdamW``, its step untouched (torch's fused kernel); no diagnostics of its own."""

    BATCH_DECAYS = ADAM_BETAS

    def backends(self) -> dict[str, str]:
        return {f"group{i}": "torch (fused)" if group["fused"] else "torch (foreach)"
                for i, group in enumerate(self.param_groups)}


# The registry's factory is the function: it declares what its optimizer does.
adamw.BATCH_DECAYS = AdamW.BATCH_DECAYS


def _tensors(params):
    """The tensors in torch's accepted forms: tensors, (name, tensor) pairs or group dicts."""
    for item in params:
        if isinstance(item, dict):
            group = item["params"]
            yield from _tensors([group] if isinstance(group, torch.Tensor) else group)
        elif isinstance(item, tuple):
            yield item[1]
        else:
            yield item
