"""Adafactor as Marek et al. 2025 run it (docs/optimizers.md, "Adafactor").

"Small Batch Size Training for Language Models" (martin-marek/batch-size, ``pretraining/optimizer.py``
and ``factorized.py``) composes optax's transformations::

    chain(scale_by_factored_rms(decay_rate, min_dim_size_to_factor=128),   # state in float32
          clip_by_block_rms(1.0), scale_by_learning_rate(lr), scale_by_param_block_rms())

For a parameter p with gradient g at step t (1-based), in the order of optax's code:

    beta = 1 - t ** -decay_rate                # a float32, as optax's
    s = g*g + 1e-30
    matrix R x C, min(R, C) >= min_dim_size_to_factor (factored):
        r = beta*r + (1-beta) * mean_cols(s)    # (R,), a mean per row
        c = beta*c + (1-beta) * mean_rows(s)    # (C,), a mean per column
        u = g * (r / mean(r))^-1/2 [:, None] * c^-1/2 [None, :]    if R <= C
        u = g * (c / mean(c))^-1/2 [None, :] * r^-1/2 [:, None]    if R > C
    else (vectors, scalars, matrices with a side below min_dim_size_to_factor):
        v = beta*v + (1-beta) * s;  u = g * v^-1/2
    u = u / max(1, rms(u) / clipping_threshold)          # rms over the whole tensor
    p = p - lr * u * max(rms(p), param_rms_floor)        # p before this step

(optax normalises the statistic along the shorter side, the second-largest dim of its
``_factored_dims``, by its mean; both means are mean(s)'s average, so only rounding tells the two
forms apart.) No first moment, no weight decay (the authors assert weight_decay == 0: a nonzero one
is refused). The state is float32 for float32, bfloat16 and float16 parameters (the authors' change
to optax, which keeps it in the parameter's dtype) and float64 for float64 ones; the update is
computed in that dtype (a bfloat16 gradient upcast first) and added to p in it, then rounded to
p's dtype.

The step runs through the fused operations of optim/backends/ (the C++ kernels on CPU tensors,
Triton's on CUDA ones, the torch reference elsewhere): u needs the whole tensor's rms of u and of p,
so it is computed twice and never stored. A factored matrix takes three sweeps (its row means and
column sums of g*g + 1e-30; the two sums of squares; the write of p), a vector two (v and the sums;
the write): fewer bytes than fused AdamW's one sweep over p, g, m and v. The kernels round each
element's operations as the reference does; their sums are taken in double, so the rms (and with
them the update) differ from the reference's by rounding.

``torch.optim.Adafactor`` is another algorithm (docs/optimizers.md says how it differs).

Sharded: under ZeRO-1 a rank holds whole parameters. Under FSDP2 a rank holds rows: the unfactored
v shards with them; the factored r and c are kept whole on every rank (R + C floats: plain tensors,
as SOAP's state), from one all-reduce of this rank's row means (at its rows, zeros elsewhere: exact)
and column sums; the two rms are completed by a second all-reduce of the sums of squares (the
summation order is the only difference from one process).
"""
import functools

import torch
import torch.distributed as dist
from torch import Tensor

from . import sharding
from .base import Optimizer, step_counter


class Adafactor(Optimizer):
    """Adafactor, Marek et al.'s composition of optax (the module docstring has the rule).

    Defaults are optax's (decay_rate 0.8, min_dim_size_to_factor 128, clipping_threshold 1.0,
    param_rms_floor 1e-3: ``scale_by_param_block_rms``'s min_scale); a config gets the authors'
    GPT-2 setting (optim/published.py: decay_rate 0.9999). ``clipping_threshold=None`` clips
    nothing (the authors' option). Steps scalars, vectors and matrices (the models' parameters:
    optax factors a tensor of more dims over its two largest, which is not offered here).
    State per parameter: "step" (float32, 0-d), and "exp_avg_sq_row" (R,) and "exp_avg_sq_col" (C,)
    for a factored matrix, else "exp_avg_sq" (p's shape). No diagnostics of its own.
    """

    # decay_rate is the exponent of the step count in beta = 1 - t ** -decay_rate, not a per-step
    # decay: a batch change (beta' = beta ** (B'/B)) has none of Adafactor's decays to scale.
    BATCH_DECAYS: dict[str, tuple[str, int | None]] = {}

    def __init__(self, params, *, lr: float, weight_decay: float = 0.0, decay_rate: float = 0.8,
                 min_dim_size_to_factor: int = 128, clipping_threshold: float | None = 1.0,
                 param_rms_floor: float = 1e-3, backend: str = "auto"):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "decay_rate": decay_rate,
                                  "min_dim_size_to_factor": min_dim_size_to_factor,
                                  "clipping_threshold": clipping_threshold, "param_rms_floor": param_rms_floor},
                         backend=backend)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim > 2 or not p.is_floating_point():
                    raise ValueError(f"Adafactor steps floating-point scalars, vectors and matrices, got a {p.dtype} "
                                     f"parameter of shape {tuple(p.shape)}")

    def check_options(self, h: dict) -> None:
        if h["weight_decay"] != 0.0:
            raise ValueError(f"Invalid weight_decay value: {h['weight_decay']}: Adafactor as Marek et al. run it has "
                             f"no weight decay; set weight_decay 0 (or leave it unset: the published 0)")
        if not 0.0 < h["decay_rate"] <= 1.0:
            raise ValueError(f"Invalid decay_rate: {h['decay_rate']} (must be in (0, 1]: the exponent of the step "
                             f"count in beta2 = 1 - t ** -decay_rate; the authors' GPT-2 value is 0.9999)")
        if not (isinstance(h["min_dim_size_to_factor"], int) and h["min_dim_size_to_factor"] >= 1):
            raise ValueError(f"Invalid min_dim_size_to_factor: {h['min_dim_size_to_factor']!r} (must be an int >= 1)")
        if h["clipping_threshold"] is not None and not h["clipping_threshold"] > 0.0:
            raise ValueError(f"Invalid clipping_threshold: {h['clipping_threshold']} (must be > 0, or None: no "
                             f"clipping)")
        if not h["param_rms_floor"] >= 0.0:
            raise ValueError(f"Invalid param_rms_floor: {h['param_rms_floor']} (must be >= 0)")

    def init_state(self, p: Tensor) -> dict:
        dtype = _state_dtype(p)
        if not _factored(p.shape, self.group_of(p)["min_dim_size_to_factor"]):
            return {"step": step_counter(),
                    "exp_avg_sq": torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)}
        # Whole on every rank, also for a parameter FSDP2 shards (the module docstring).
        device = sharding.local(p).device
        rows, cols = p.shape
        return {"step": step_counter(), "exp_avg_sq_row": torch.zeros(rows, dtype=dtype, device=device),
                "exp_avg_sq_col": torch.zeros(cols, dtype=dtype, device=device)}

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        # (A CPU counter: no device sync. It counts kept steps: a flagged first step, whose writes
        # are all dropped, reads 0 and takes step 1's decay.)
        beta, w = _decay(max(int(state["step"]), 1), group["decay_rate"])
        ops = self.implementation(group, p, grad)  # (the sums are completed over the ranks here)
        if "exp_avg_sq" in state:
            sums = ops.adafactor_unfactored_sums(p, grad, state["exp_avg_sq"], beta=beta, w=w, skip=skip)
        else:
            row, col, rows_first = self._factors(ops, grad, state, (beta, w), skip, shards)
            sums = ops.adafactor_factored_sums(p, grad, row, col, rows_first=rows_first)
        # The whole tensor's sums of squares of u and p (p before the step), completed over the ranks.
        if shards is not None:
            sums = shards.all_reduce(sums, dist.ReduceOp.SUM)
        numel = p.numel() if shards is None else shards.numel
        u_rms, p_rms = (sums / numel).sqrt().unbind()
        divisor = None if group["clipping_threshold"] is None else torch.clamp(u_rms / group["clipping_threshold"],
                                                                                min=1.0)
        scale = torch.clamp(p_rms, min=group["param_rms_floor"])
        if "exp_avg_sq" in state:
            ops.adafactor_unfactored_apply(p, grad, state["exp_avg_sq"], divisor=divisor, lr=group["lr"], scale=scale,
                                           skip=skip)
        else:
            ops.adafactor_factored_apply(p, grad, row, col, rows_first=rows_first, divisor=divisor, lr=group["lr"],
                                         scale=scale, skip=skip)

    @staticmethod
    def _factors(ops, g: Tensor, state: dict, decay: tuple[float, float], skip: Tensor | None,
                 shards: sharding.Shards | None) -> tuple[Tensor, Tensor, bool]:
        """The factored statistics r and c updated from this step's ``g`` (this rank's rows;
        ``decay`` is (beta, 1 - beta)), and u's factors from them: (this rank's rows' factors, the
        columns', whether the rows' comes first: optax's order, the shorter side's factor,
        normalised, first)."""
        r, c = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
        rows, first = r.shape[0], 0 if shards is None else shards.first_row
        local = slice(first, first + g.shape[0])
        row_means, col_sums = ops.adafactor_statistics(g)
        if shards is not None:  # one collective: the row means at their rows (zeros elsewhere), the column sums
            both = row_means.new_zeros(rows + col_sums.shape[0])
            both[local] = row_means
            both[rows:] = col_sums
            shards.all_reduce(both, dist.ReduceOp.SUM)
            row_means, col_sums = both[:rows], both[rows:]
        for statistic, value in ((r, row_means), (c, col_sums / rows)):
            new = statistic if skip is None else statistic.clone()
            new.mul_(decay[0]).add_(value, alpha=decay[1])
            if skip is not None:  # (kept on the device where the step is dropped: no host sync)
                torch.where(skip == 0, new, statistic, out=statistic)
        if rows <= c.shape[0]:
            return (r / r.mean()).rsqrt()[local].contiguous(), c.rsqrt(), True
        return r.rsqrt()[local].contiguous(), (c / c.mean()).rsqrt(), False


def _factored(shape: torch.Size, min_dim_size_to_factor: int) -> bool:
    """optax's ``_factored_dims`` for at most two dims: a matrix whose sides both reach the size."""
    return len(shape) == 2 and min(shape) >= min_dim_size_to_factor


def _state_dtype(p: Tensor) -> torch.dtype:
    """float32, or float64 for a float64 parameter (module docstring)."""
    return torch.float64 if p.dtype == torch.float64 else torch.float32


@functools.lru_cache(maxsize=8)
def _decay(step: int, decay_rate: float) -> tuple[float, float]:
    """(beta, 1 - beta), beta = 1 - step ** -decay_rate, each a float32, as optax's
    ``_decay_rate_pow`` and ``scale_by_factored_rms`` compute them, also for float64 state. Here beta
    is float64's value rounded to float32, the same on every machine; XLA's float32 pow is not
    correctly rounded, so optax's beta is one float32 ulp away at some steps (t = 5 of decay_rate
    0.8; 102 of the first 200,000 steps)."""
    beta = _float32(1.0 - step ** -decay_rate)
    return beta, _float32(1.0 - beta)  # (1 - beta exact in float64: the float32 difference, rounded once)


def _float32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()
