"""MERIT (Luo et al., ICML 2025) with the paper's ablations (docs/optimizers.md, "MERIT").

Per tensor, two fused passes (optim/backends/):
  pass 1: update m and v, write u into p.grad, return the row, column and weight-wise ratios;
  pass 2: p -= lr * clamp(s * u, -1, 1), s = max(r_i, c_j, b).
"""
import torch
from torch import Tensor

from . import sharding
from .base import Optimizer, step_counter, zeros_like
from .protocol import ADAM_BETAS


class MERIT(Optimizer):
    """MERIT optimizer.

    Defaults are the authors' constructor defaults (lr=1e-3, betas=(0.9, 0.999), eps=1e-6,
    weight_decay=0); their README recommends lr=2e-4, weight_decay=1e-2, betas=(0.9, 0.95).
    ``step`` consumes the gradients (p.grad holds u afterwards).

    The update, with ``u = m / (sqrt(v) + eps) + wd * p`` (no bias correction) and ``N`` a norm:
      matrix (ndim >= 2; rows = dim 0, columns = dim 1, further dims not reduced):
        b    = N(p) / N(u)                       weight-wise ratio
        r_i  = N(row i of p) / N(row i of u)     row-wise ratio
        c_j  = N(col j of p) / N(col j of u)     column-wise ratio
        s_ij = max(r_i, c_j, b), and s_ij = 1 where N of row i or column j of p or u is 0
      vector: s = N(p) / N(u), or 1 if either is 0
      p = p - lr * clamp(s * u, -1, 1)
    All norms use p before this step's update; a ratio that overflows is the largest finite value.

    Ablations of the paper (keyword options, also per param group):
      norm="max"                   N(x) = max |x| (MERIT); "l2": N(x) = ||x||_2 for every ratio
                                   above (rows, columns, whole weight, vectors), zero guards alike.
      weightwise_lower_bound=True  False: s_ij = max(r_i, c_j) (b is not used).
      elementwise_clip=True        False: p = p - lr * s * u (no clip).
      maxlamb=False                True ("maxLAMB"): s = b for every tensor, matrices included (no
                                   element-wise ratio) and no clip: p = p - lr * b * u, b = 1 if
                                   N(p) or N(u) is 0. elementwise_clip is not consulted;
                                   weightwise_lower_bound=False contradicts it and is rejected.

    Diagnostics (on requested steps, per parameter): ``trust_ratio_min/median/max`` of s over
    the elements (median: the lower one, as torch.median) and ``clip_fraction``, the fraction of
    elements with |s * u| > 1 (those the clip changes, or would change without it).
    """

    BATCH_DECAYS = ADAM_BETAS

    FLAGS = ("maxlamb", "elementwise_clip", "weightwise_lower_bound")

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, *, maxlamb: bool = False,
                 elementwise_clip: bool = True, weightwise_lower_bound: bool = True, norm: str = "max",
                 backend: str = "auto"):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "maxlamb": maxlamb, "elementwise_clip": elementwise_clip,
                                  "weightwise_lower_bound": weightwise_lower_bound, "norm": norm},
                         backend=backend)

    def check_options(self, group: dict) -> None:
        if group["norm"] not in ("max", "l2"):
            raise ValueError(f"Invalid norm: {group['norm']!r} (must be 'max' or 'l2')")
        if group["maxlamb"] and not group["weightwise_lower_bound"]:
            raise ValueError("Invalid weightwise_lower_bound: False with maxlamb=True "
                             "(maxlamb uses the weight-wise ratio alone)")

    def init_state(self, p: Tensor) -> dict:
        return {"step": step_counter(), "exp_avg": zeros_like(p), "exp_avg_sq": zeros_like(p)}

    def reduces_rows_cols(self, p: Tensor, group: dict) -> bool:
        return p.ndim >= 2 and not group["maxlamb"]

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        elementwise = self.reduces_rows_cols(p, group)
        (beta1, beta2), m, v = group["betas"], state["exp_avg"], state["exp_avg_sq"]
        ops = self.implementation(group, p, grad, m, v, shards=shards)
        ratios = ops.moments_and_ratios(p, grad, m, v, beta1=beta1, beta2=beta2, eps=group["eps"],
                                        wd=group["weight_decay"], reduce="rows_cols" if elementwise else "tensor",
                                        l2=group["norm"] == "l2", skip=skip)
        if elementwise:
            rows, cols, whole = ratios
            if group["weightwise_lower_bound"]:
                # Fold b into the (short) row factor. NaN propagates through maximum; b is
                # guarded only when every row is.
                rows = torch.maximum(rows, whole)
        else:
            (rows,), cols = ratios, None
        diagnose = self.diagnostics_requested
        clipped = ops.apply_update(p, grad, rows, cols, lr=group["lr"], count=diagnose,
                                   clip=group["elementwise_clip"] and not group["maxlamb"], skip=skip)
        if diagnose:
            numel = p.numel() if shards is None else shards.numel
            if shards is not None and cols is not None:
                rows = shards.gather_rows(rows)  # the statistics are over the whole tensor's s
            self.record_diagnostics(group, index, **_trust_ratio_stats(rows, cols, numel),
                                    clip_fraction=sharding.total(clipped, shards) / numel)


def _trust_ratio_stats(rows: Tensor, cols: Tensor | None, numel: int) -> dict[str, Tensor]:
    """Min, (lower) median and max of s over p's elements, without materialising s.

    s = max(rows_i, cols_j), or 1 where either is NaN (guarded); rows has shape (R, 1, *rest),
    cols (1, C, *rest). The k-th smallest s is the smallest candidate x (a row or column factor,
    or 1) with #{s <= x} >= k, and #{s <= x} = sum over the trailing index of
    #{rows <= x} * #{cols <= x}, plus the guarded elements when x >= 1.
    """
    if cols is None:
        s = rows.nan_to_num(nan=1.0)
        return {"trust_ratio_min": s, "trust_ratio_median": s, "trust_ratio_max": s}
    dtype = torch.promote_types(rows.dtype, torch.float32)
    r = rows.movedim(0, -1).reshape(-1, rows.shape[0]).to(dtype)  # (K, R)
    c = cols.movedim(1, -1).reshape(-1, cols.shape[1]).to(dtype)  # (K, C)
    guarded = numel - ((~r.isnan()).sum(1) * (~c.isnan()).sum(1)).sum()
    candidates = torch.cat([r.flatten(), c.flatten(), r.new_ones(1)]).nan_to_num(nan=1.0)
    per_k = candidates.expand(r.shape[0], -1).contiguous()
    # Guarded factors sort last as inf, so no finite candidate counts them.
    r_sorted, c_sorted = (x.nan_to_num(nan=torch.inf).sort(1).values.contiguous() for x in (r, c))
    at_most = (torch.searchsorted(r_sorted, per_k, right=True)
               * torch.searchsorted(c_sorted, per_k, right=True)).sum(0) + (candidates >= 1) * guarded
    kth = lambda k: torch.where(at_most >= k, candidates, torch.inf).amin()  # noqa: E731
    return {"trust_ratio_min": kth(1), "trust_ratio_median": kth((numel + 1) // 2), "trust_ratio_max": kth(numel)}
