"""The fused operations as Triton kernels (optim/backends/triton_kernels.py) for CUDA tensors:
when they apply, and how they are launched.

Per MERIT/LAMB tensor a step launches pass 1, one or two small reductions, the trust-ratio
kernel and pass 2, and nothing waits on the host. Memory: the state only, plus per step
O(rows + cols) norms and P x cols column partials (P <= 4 programs per multiprocessor).
``load`` imports Triton (it comes with PyTorch's CUDA builds). In Triton's CPU interpreter
(``TRITON_INTERPRET=1`` when Triton is first imported) the kernels take CPU tensors too: that is
how the tests run them without a GPU, with ``optim_backend="triton"`` ("auto" never picks the
interpreter); scripts/check_cuda.py runs them on a GPU.
"""
import functools
import math
import os
import sys

import torch
from torch import Tensor

from . import common

NAME = "triton"
TAKES = "contiguous CUDA tensors of one dtype: float32, bfloat16 or float64"

# A program's tile: 2,048 elements of each of p, g, m and v in registers (4 warps: 16 per thread).
_TILE = 2048
_MAX_BLOCK_C = 256
_FLAT_COLS = 2048     # row length when a tensor's norm is taken as a whole
_RATIO_BLOCK = 1024
_STEP_BLOCK = 1024  # the one-sweep steps' elements per program


def takes(tensors: list[Tensor], *, matrix: bool = False) -> bool:
    """Whether the kernels take ``tensors`` (p first, not empty; a 2-D p if ``matrix``): on CUDA,
    or on CPU in Triton's interpreter."""
    return common.takes(tensors, matrix=matrix, device_types=_device_types(), empty=False)


def ready() -> bool:
    """Whether ``load`` has imported the kernels in this process."""
    return _import.cache_info().currsize > 0 and _import()[0] is not None


def load(required: bool) -> bool:
    """Import the kernels (Triton takes a second to import), once per process. Without Triton:
    an error if ``required``, else one warning and False (the reference runs on CUDA tensors)."""
    kernels, error = _import()
    if kernels is not None:
        return True
    message = f"optim: Triton is not available ({error})"
    if required:
        raise RuntimeError(f"{message}: pip install triton, or use optim_backend='auto' or 'torch'") from error
    common.warn_once(f"{message}; the optimizers run their torch reference on CUDA tensors (pip install triton)")
    return False


@functools.cache
def _import():
    """(optim.backends.triton_kernels, None), or (None, the ImportError) without Triton."""
    try:
        from . import triton_kernels
    except ImportError as error:
        return None, error
    mode = " (interpreter)" if _interpreted() else ""
    print(f"optim: Triton kernels ready{mode}", file=sys.stderr, flush=True)
    return triton_kernels, None


def _kernels():
    return _import()[0]


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _device_types() -> tuple[str, ...]:
    return ("cuda", "cpu") if _interpreted() else ("cuda",)


def _launch(kernel, grid: tuple[int, ...], *args, **constexprs) -> None:
    """Every launch goes through here (the tests record them to compile each one for a GPU)."""
    kernel[grid](*args, **constexprs, enable_fp_fusion=False)  # no FMA: products rounded as written


def _compute(dtype: torch.dtype):
    tl = _kernels().tl
    return tl.float64 if dtype == torch.float64 else tl.float32


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _blocks(n_rows: int, n_cols: int) -> tuple[int, int]:
    block_c = min(_MAX_BLOCK_C, max(16, _pow2(n_cols)))
    return min(_TILE // block_c, _pow2(n_rows)), block_c


def _matrix(p: Tensor, rows_cols: bool) -> tuple[int, int]:
    """How the kernels see p: its own (rows, cols), or its flat elements cut into rows."""
    if rows_cols:
        return p.shape[0], p.shape[1]
    n_cols = min(_FLAT_COLS, _pow2(p.numel()))
    return -(-p.numel() // n_cols), n_cols


@functools.cache
def _max_programs(device: torch.device) -> int:
    if device.type == "cuda":
        return 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return 3  # the interpreter: a few, so that programs sweep several row blocks in the tests


def moments_and_ratios(p: Tensor, g: Tensor, m: Tensor, v: Tensor, *, beta1: float, beta2: float,
                       eps: float, wd: float, reduce: str, l2: bool, m_scale: float = 1.0,
                       v_scale: float = 1.0, max_p_norm: float = math.inf,
                       skip: Tensor | None = None) -> tuple[Tensor, ...]:
    k = _kernels()
    rows_cols = reduce == "rows_cols"
    n_rows, n_cols = _matrix(p, rows_cols)
    compute = common.compute_dtype(p.dtype)
    block_r, block_c = _blocks(n_rows, n_cols)
    programs = min(-(-n_rows // block_r), _max_programs(p.device))
    # The norm terms: rows | columns | whole tensor, for p (norms[0]) and u (norms[1]).
    width = n_rows + (n_cols if rows_cols else 0) + 1
    norms = torch.empty(2, width, dtype=compute, device=p.device)
    partials = torch.empty(programs, 2, n_cols, dtype=compute, device=p.device) if rows_cols else norms
    _launch(k.moments_and_norms, (programs,), p, g, m, v, norms, width, partials, _flag(skip, p), n_rows, n_cols,
            p.numel(), 1 - beta1, beta2, 1 - beta2, v_scale / m_scale, eps / m_scale, wd,
            L2=l2, COLS=rows_cols, SKIPS=skip is not None, COMPUTE=_compute(p.dtype), BLOCK_R=block_r,
            BLOCK_C=block_c)
    if reduce == "none":
        return ()
    combine = torch.sum if l2 else torch.amax
    if rows_cols:
        combine(partials, 0, out=norms[:, n_rows:-1])
    combine(norms[:, :n_rows], 1, keepdim=True, out=norms[:, -1:])
    first = 0 if rows_cols else width - 1  # flat rows are pieces of the tensor, not its rows
    ratios = torch.empty(width - first, dtype=p.dtype, device=p.device)
    _launch(k.trust_ratios, (-(-ratios.numel() // _RATIO_BLOCK),), norms[:, first:], width, ratios, ratios.numel(),
            max_p_norm, torch.finfo(p.dtype).max, L2=l2, COMPUTE=_compute(p.dtype), BLOCK=_RATIO_BLOCK)
    if not rows_cols:
        return (ratios[0],)
    return ratios[:n_rows].view(n_rows, 1), ratios[n_rows:-1].view(1, n_cols), ratios[-1]


def apply_update(p: Tensor, u: Tensor, rows: Tensor | None, cols: Tensor | None, *, lr: float,
                 clip: bool, count: bool, skip: Tensor | None = None) -> Tensor | None:
    k = _kernels()
    rows, cols = common.kernel_factors(p, rows, cols)
    n_rows, n_cols = _matrix(p, cols is not None)
    block_r, block_c = _blocks(n_rows, n_cols)
    grid = (-(-n_rows // block_r), -(-n_cols // block_c))
    counts = torch.empty(grid[0] * grid[1], dtype=torch.int32, device=p.device) if count else rows
    _launch(k.apply_update, grid, p, u, rows.contiguous(), rows if cols is None else cols.contiguous(), counts,
            _flag(skip, p), n_rows, n_cols, p.numel(), -lr, COLS=cols is not None, CLIP=clip, COUNT=count,
            SKIPS=skip is not None, COMPUTE=_compute(p.dtype), BLOCK_R=block_r, BLOCK_C=block_c)
    return counts.sum() if count else None


def lion_step(p: Tensor, g: Tensor, m: Tensor, *, lr: float, wd: float, beta1: float, beta2: float,
              skip: Tensor | None = None) -> None:
    _launch(_kernels().lion_step, (-(-p.numel() // _STEP_BLOCK),), p, g, m, _flag(skip, p), p.numel(),
            1 - lr * wd, -lr, 1 - beta1, 1 - beta2, DECAYS=wd != 0, SKIPS=skip is not None,
            COMPUTE=_compute(p.dtype), BLOCK=_STEP_BLOCK)


def sophia_step(p: Tensor, g: Tensor, m: Tensor, h: Tensor, *, lr: float, wd: float, beta1: float,
                scale: float, eps: float, skip: Tensor | None = None) -> None:
    _launch(_kernels().sophia_step, (-(-p.numel() // _STEP_BLOCK),), p, g, m, h, _flag(skip, p), p.numel(),
            1 - lr * wd, -lr, 1 - beta1, scale, eps, DECAYS=wd != 0, SKIPS=skip is not None,
            COMPUTE=_compute(p.dtype), BLOCK=_STEP_BLOCK)


def ademamix_step(p: Tensor, g: Tensor, m1: Tensor, m2: Tensor, v: Tensor, *, lr: float, wd: float, beta1: float,
                  beta2: float, beta3: float, alpha: float, bias_correction1: float, bias_correction2: float,
                  eps: float, skip: Tensor | None = None) -> None:
    _launch(_kernels().ademamix_step, (-(-p.numel() // _STEP_BLOCK),), p, g, m1, m2, v, _flag(skip, p), p.numel(),
            beta1, 1 - beta1, beta3, 1 - beta3, beta2, 1 - beta2, bias_correction1, math.sqrt(bias_correction2), eps,
            alpha, wd, -lr, DECAYS=wd != 0, SKIPS=skip is not None, COMPUTE=_compute(p.dtype), BLOCK=_STEP_BLOCK)


def schedulefree_step(y: Tensor, g: Tensor, z: Tensor, v: Tensor, *, lr: float, y_lr: float, ckp1: float, wd: float,
                      beta2: float, bias_correction2: float, eps: float, skip: Tensor | None = None) -> None:
    _launch(_kernels().schedulefree_step, (-(-y.numel() // _STEP_BLOCK),), y, g, z, v, _flag(skip, y), y.numel(),
            beta2, 1 - beta2, bias_correction2, eps, wd, ckp1, y_lr, -lr, DECAYS=wd != 0, SKIPS=skip is not None,
            COMPUTE=_compute(y.dtype), BLOCK=_STEP_BLOCK)


def mars_correction(g: Tensor, g_prev: Tensor, *, scale: float, skip: Tensor | None = None) -> Tensor:
    programs = -(-g.numel() // _STEP_BLOCK)
    partials = torch.empty(programs, dtype=common.compute_dtype(g.dtype), device=g.device)  # each program's c^2
    _launch(_kernels().mars_correction, (programs,), g, g_prev, partials, _flag(skip, g), g.numel(), scale,
            SKIPS=skip is not None, COMPUTE=_compute(g.dtype), BLOCK=_STEP_BLOCK)
    return partials.sum()


def sgd_step(p: Tensor, g: Tensor, buf: Tensor | None, *, lr: float, momentum: float, wd: float,
             skip: Tensor | None = None) -> None:
    _launch(_kernels().sgd_step, (-(-p.numel() // _STEP_BLOCK),), p, g, p if buf is None else buf, _flag(skip, p),
            p.numel(), wd, momentum, -lr, DECAYS=wd != 0, MOMENTUM=buf is not None, SKIPS=skip is not None,
            COMPUTE=_compute(p.dtype), BLOCK=_STEP_BLOCK)


def adafactor_statistics(g: Tensor) -> tuple[Tensor, Tensor]:
    n_rows, n_cols = g.shape
    block_r, block_c = _blocks(n_rows, n_cols)
    programs = min(-(-n_rows // block_r), _max_programs(g.device))
    compute = common.compute_dtype(g.dtype)
    row_sums = torch.empty(n_rows, dtype=compute, device=g.device)
    partials = torch.empty(programs, n_cols, dtype=compute, device=g.device)
    _launch(_kernels().adafactor_statistics, (programs,), g, row_sums, partials, n_rows, n_cols,
            common.ADAFACTOR_EPSILON, COMPUTE=_compute(g.dtype), BLOCK_R=block_r, BLOCK_C=block_c)
    return row_sums.div_(n_cols), partials.sum(0)


def adafactor_factored_sums(p: Tensor, g: Tensor, row: Tensor, col: Tensor, *, rows_first: bool) -> Tensor:
    return _adafactor_sums(p, g, row, col, None, rows_first=rows_first, beta=0.0, w=0.0, skip=None)


def adafactor_factored_apply(p: Tensor, g: Tensor, row: Tensor, col: Tensor, *, rows_first: bool,
                             divisor: Tensor | None, lr: float, scale: Tensor, skip: Tensor | None = None) -> None:
    _adafactor_apply(p, g, row, col, None, rows_first=rows_first, divisor=divisor, lr=lr, scale=scale, skip=skip)


def adafactor_unfactored_sums(p: Tensor, g: Tensor, v: Tensor, *, beta: float, w: float,
                              skip: Tensor | None = None) -> Tensor:
    return _adafactor_sums(p, g, None, None, v, rows_first=True, beta=beta, w=w, skip=skip)


def adafactor_unfactored_apply(p: Tensor, g: Tensor, v: Tensor, *, divisor: Tensor | None, lr: float,
                               scale: Tensor, skip: Tensor | None = None) -> None:
    _adafactor_apply(p, g, None, None, v, rows_first=True, divisor=divisor, lr=lr, scale=scale, skip=skip)


def _adafactor_sums(p: Tensor, g: Tensor, row: Tensor | None, col: Tensor | None, v: Tensor | None, *,
                    rows_first: bool, beta: float, w: float, skip: Tensor | None) -> Tensor:
    n_rows, n_cols = _matrix(p, v is None)
    block_r, block_c = _blocks(n_rows, n_cols)
    grid = (-(-n_rows // block_r), -(-n_cols // block_c))
    partials = torch.empty(grid[0] * grid[1], 2, dtype=common.compute_dtype(p.dtype), device=p.device)
    _launch(_kernels().adafactor_sums, grid, p, g, *_adafactor_state(p, row, col, v), partials, _flag(skip, p),
            n_rows, n_cols, p.numel(), beta, w, common.ADAFACTOR_EPSILON, FACTORED=v is None,
            ROWS_FIRST=rows_first, SKIPS=skip is not None, COMPUTE=_compute(p.dtype), BLOCK_R=block_r,
            BLOCK_C=block_c)
    return partials.sum(0)


def _adafactor_apply(p: Tensor, g: Tensor, row: Tensor | None, col: Tensor | None, v: Tensor | None, *,
                     rows_first: bool, divisor: Tensor | None, lr: float, scale: Tensor, skip: Tensor | None) -> None:
    n_rows, n_cols = _matrix(p, v is None)
    block_r, block_c = _blocks(n_rows, n_cols)
    grid = (-(-n_rows // block_r), -(-n_cols // block_c))
    _launch(_kernels().adafactor_apply, grid, p, g, *_adafactor_state(p, row, col, v),
            scale if divisor is None else divisor, scale, _flag(skip, p), n_rows, n_cols, p.numel(), -lr,
            FACTORED=v is None, ROWS_FIRST=rows_first, DIVIDES=divisor is not None, SKIPS=skip is not None,
            COMPUTE=_compute(p.dtype), BLOCK_R=block_r, BLOCK_C=block_c)


def _adafactor_state(p: Tensor, row: Tensor | None, col: Tensor | None, v: Tensor | None) -> tuple[Tensor, ...]:
    """The kernels' row, column and v pointers: a factored matrix's two factors (v unread: p), or v
    (the factors unread: v)."""
    return (row, col, p) if v is None else (v, v, v)


def _flag(skip: Tensor | None, p: Tensor) -> Tensor:
    """The kernels' ``skip_ptr``: the flag as float32 on p's device (p itself, unread, without one)."""
    return p if skip is None else skip.to(device=p.device, dtype=torch.float32)
