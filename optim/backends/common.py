"""What the kernel backends (cpp.py, triton.py) share: the tensors their kernels take, the form of
pass 2's factors the kernels read, and the one warning a backend that cannot be made ready gives.
"""
import functools
import warnings

import torch
from torch import Tensor

# The dtypes the kernels take; they compute in ``compute_dtype`` of each.
DTYPES = (torch.float32, torch.bfloat16, torch.float64)
ADAFACTOR_EPSILON = 1e-30  # optax's, added to g*g in Adafactor's second moment (the authors leave it)


def takes(tensors: list[Tensor], *, matrix: bool, device_types: tuple[str, ...], empty: bool = True) -> bool:
    """Whether kernels for tensors on ``device_types`` take ``tensors`` (p first): p of one of
    ``DTYPES``, 2-D if ``matrix``, not empty unless ``empty``; every tensor contiguous, of p's dtype
    and on p's device."""
    p = tensors[0]
    return (p.device.type in device_types and p.dtype in DTYPES and (empty or p.numel() > 0)
            and (p.dim() == 2 or not matrix)
            and all(t.dtype == p.dtype and t.device == p.device and t.is_contiguous() for t in tensors))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute in for tensors of ``dtype``: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def kernel_factors(p: Tensor, rows: Tensor | None, cols: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The kernels' form of pass 2's factors: in the compute dtype, ``rows`` None as a 0-d one."""
    compute = compute_dtype(p.dtype)
    if rows is None:
        rows = torch.ones((), dtype=p.dtype, device=p.device)
    return rows.to(compute), None if cols is None else cols.to(compute)


@functools.cache
def warn_once(message: str) -> None:
    """Warn once per process per message (a backend's fallback to the reference is said once, not
    at every optimizer created)."""
    # stacklevel 5: past load, prepare and Optimizer.__init__, the optimizer subclass's __init__.
    warnings.warn(message, RuntimeWarning, stacklevel=5)
