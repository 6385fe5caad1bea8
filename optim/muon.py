"""Muon with an AdamW part, the hybrid everyone trains with (docs/optimizers.md, "Muon").

Muon (Keller Jordan 2024; ``torch.optim.Muon``) steps the transformer blocks' hidden weight
matrices; AdamW (``torch.optim.AdamW``'s fused kernel) steps everything else: embeddings, the
tied LM head, norms and biases. For each hidden matrix W (rows x cols), G its gradient::

    B = mu*B + (1-mu)*G                             # buf.lerp_(grad, 1 - mu)
    U = G + mu*(B - G) if nesterov else B           # grad.lerp(buf, mu)
    X = U / max(||U||_F, eps), transposed if rows > cols
    5 times: A = X X^T; X = a X + (b A + c A A) X   # (a, b, c) = (3.4445, -4.7750, 2.0315)
    W = W * (1 - lr*wd) - lr_adj * X

with ``lr_adj = lr * sqrt(max(1, rows/cols))`` ("original", Keller Jordan's) or ``lr * 0.2 *
sqrt(max(rows, cols))`` ("match_rms_adamw", Moonlight's: the update's RMS is AdamW's, so Muon
reuses AdamW's lr and weight decay). GPT-2's fused ``c_attn`` weight is three matrices, q, k and
v, each orthogonalised (and its lr adjusted) on its own, as separate Linear layers would be.
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from . import sharding
from .base import zeros_like
from .hybrid import HiddenMatricesAndAdamW
from .protocol import ADAM_BETAS

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
ADJUST_LR = ("original", "match_rms_adamw")
NS_DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32}
# GPT-2's fused attention input projection: q, k and v stacked on dim 0 (model.py, Hugging Face's names).
FUSED_QKV = "attn.c_attn.weight"
# The matrix per layer whose orthogonalised update's singular values are logged (a square one).
SPECTRUM_OF = "attn.c_proj.weight"


class Muon(HiddenMatricesAndAdamW):
    """Muon on the param groups marked ``hidden_matrix`` (``optim.param_groups(...,
    hidden_matrices_apart=True)`` marks them; ``optim.build`` asks for it), AdamW on the others.

    Muon's part (its defaults are ``torch.optim.Muon``'s): ``lr``, ``weight_decay`` (decoupled,
    scaled by lr), ``momentum``, ``nesterov``, ``ns_steps``, ``ns_coefficients``, ``ns_eps`` (the
    Frobenius normalisation's floor), ``adjust_lr`` ("original" or "match_rms_adamw") and
    ``ns_dtype``: the Newton-Schulz iteration's dtype, "bfloat16" (as the references compute it),
    "float32", or "auto": bfloat16 on CUDA and on CPUs with bfloat16 matrix units (AMX, AVX512-BF16:
    there it measured 1.9-2.5x faster than float32, scripts/bench_optim.py), float32 on others.

    AdamW's part (``torch.optim.AdamW``'s defaults): ``betas``, ``eps``, ``adamw_lr`` (None: lr; it
    follows lr's schedule) and ``adamw_weight_decay`` (None: weight_decay) for the groups that
    decay (the shared builder decays no embedding, norm or bias unless ``decay_embeddings``).

    State: "momentum_buffer" per Muon matrix; "step", "exp_avg", "exp_avg_sq" per AdamW tensor, as
    torch's two optimizers keep them. Diagnostics (requested steps), per Muon matrix:
    ``update_rms``, the RMS of the applied update per unit lr (``lr_adj / lr * X``: 0.2 under
    "match_rms_adamw", AdamW's typical RMS), and for each layer's attention output projection the
    orthogonalised update's largest and median singular values (``ns_singular_max``, ``_median``:
    the quintic iteration takes the large ones to about [0.7, 1.2], not to 1; the smallest, of
    directions the gradient hardly has, are left small and are rounding noise, so not logged).

    Under FSDP2 a rank holds rows of each matrix: the update is gathered whole (one all-gather per
    matrix), every rank orthogonalises it and keeps its rows (Moonlight's distributed Muon), so
    the parameters are one process's. ZeRO-1 gives each rank whole matrices: nothing to gather.
    """

    BATCH_DECAYS = {"momentum": ("momentum", None), **ADAM_BETAS}  # (betas: its AdamW part's)
    USES_FUSED_OPERATIONS = False  # torch code; the AdamW part is torch's fused kernel
    NAME = "Muon"
    FLAGS = ("nesterov",)

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                 ns_eps: float = 1e-7, adjust_lr: str = "original", ns_dtype: str = "auto",
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, adamw_lr: float | None = None,
                 adamw_weight_decay: float | None = None, *, backend: str = "auto"):
        super().__init__(params, {"momentum": momentum, "nesterov": nesterov, "ns_steps": ns_steps,
                                  "ns_coefficients": tuple(ns_coefficients), "ns_eps": ns_eps, "adjust_lr": adjust_lr,
                                  "ns_dtype": ns_dtype, "betas": betas, "eps": eps},
                         lr=lr, adamw_lr=adamw_lr, weight_decay=weight_decay, adamw_weight_decay=adamw_weight_decay,
                         backend=backend)

    def check_options(self, h: dict) -> None:
        super().check_options(h)
        if not 0.0 <= h["momentum"] < 1.0:
            raise ValueError(f"Invalid momentum: {h['momentum']} (must be in [0, 1))")
        if not (isinstance(h["ns_steps"], int) and 1 <= h["ns_steps"] < 100):
            raise ValueError(f"Invalid ns_steps: {h['ns_steps']!r} (must be an int in [1, 100))")
        if len(h["ns_coefficients"]) != 3:
            raise ValueError(f"Invalid ns_coefficients: {h['ns_coefficients']!r} (must be three numbers a, b, c)")
        if not h["ns_eps"] > 0.0:
            raise ValueError(f"Invalid ns_eps: {h['ns_eps']} (must be > 0)")
        if h["adjust_lr"] not in ADJUST_LR:
            raise ValueError(f"Invalid adjust_lr: {h['adjust_lr']!r} (must be one of {', '.join(map(repr, ADJUST_LR))})")
        if h["ns_dtype"] not in NS_DTYPES:
            raise ValueError(f"Invalid ns_dtype: {h['ns_dtype']!r} (must be one of {', '.join(map(repr, NS_DTYPES))})")

    def init_state(self, p: Tensor) -> dict:
        return {"momentum_buffer": zeros_like(p)} if self.group_of(p)["hidden_matrix"] else self.adamw_state(p)

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        if group["hidden_matrix"]:
            self._muon_update(p, grad, state, group, index, skip, shards)
        else:
            self.adamw_part(p, grad, state, group, group["betas"], skip)

    def _muon_update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
                     shards: sharding.Shards | None) -> None:
        mu, buf = group["momentum"], state["momentum_buffer"]
        # A step flagged non-finite (skip) leaves p and the buffer as they were: computed aside, then chosen.
        new_buf = buf.lerp_(grad, 1 - mu) if skip is None else buf.lerp(grad, 1 - mu)
        update = grad.lerp(new_buf, mu) if group["nesterov"] else new_buf
        whole = update if shards is None else shards.gather_rows(update)  # (FSDP2: every rank the whole matrix)
        first_row = 0 if shards is None else shards.first_row
        name = group["names"][index] if "names" in group else ""
        new_p = p if skip is None else p.clone()
        new_p.mul_(1 - group["lr"] * group["weight_decay"])
        squares = []
        for rows in matrix_rows(name, whole.shape[0]):
            orthogonalised = newton_schulz(whole[rows], group["ns_coefficients"], group["ns_steps"], group["ns_eps"],
                                           self.ns_dtype(group, p.device))
            lr_adjusted = adjusted_lr(group["lr"], group["adjust_lr"], orthogonalised.shape)
            local, part = _overlap(rows, first_row, p.shape[0])
            new_p[local].add_(orthogonalised[part], alpha=-lr_adjusted)
            if self.diagnostics_requested:
                squares.append((orthogonalised.float().square().sum() * (lr_adjusted / group["lr"]) ** 2
                                if group["lr"] else orthogonalised.new_zeros((), dtype=torch.float32)))
                if name.endswith(SPECTRUM_OF):
                    singular = torch.linalg.svdvals(orthogonalised.float())
                    self.record_diagnostics(group, index, ns_singular_max=singular[0],
                                            ns_singular_median=singular.median())
        if skip is not None:
            kept = skip == 0
            p.copy_(torch.where(kept, new_p, p))
            buf.copy_(torch.where(kept, new_buf, buf))
        if squares:
            self.record_diagnostics(group, index, update_rms=(torch.stack(squares).sum() / whole.numel()).sqrt())

    def ns_dtype(self, group: dict, device: torch.device) -> torch.dtype:
        """The Newton-Schulz dtype of ``group``'s matrices on ``device`` ("auto" resolved)."""
        return NS_DTYPES[group["ns_dtype"]] or default_ns_dtype(device)

    def backends(self) -> dict[str, str]:
        summary = {}
        for i, group in enumerate(self.param_groups):
            if group["hidden_matrix"]:
                dtypes = sorted({str(self.ns_dtype(group, p.device)).removeprefix("torch.") for p in group["params"]})
                summary[f"group{i}"] = f"torch (Muon, Newton-Schulz in {'/'.join(dtypes) or 'no matrices'})"
            else:
                summary[f"group{i}"] = "torch (AdamW, fused)"
        return summary


class DMuon(Muon):
    """D-Muon, the 2025 optimizer benchmark's name (Semenov et al., "Benchmarking Optimizers for Large
    Language Model Pretraining") for Moonlight's Muon (Liu et al. 2025): Muon with the
    "match_rms_adamw" lr rule, its AdamW part at the same lr and weight decay, and weight decay on
    EVERY parameter: embeddings, norms' gains and biases included (``optim.build`` groups a model's
    parameters so; plain Muon recipes leave the AdamW side undecayed). The benchmark found it
    consistent at every scale and much better than Muon without decay. Its options are Muon's but
    ``adjust_lr``, which is Moonlight's rule by definition (Keller Jordan's is ``optimizer="muon"``).
    """

    DECAYS_EVERY_PARAMETER = True  # optim.build groups a model's parameters for it so
    __init__ = functools.partialmethod(Muon.__init__, adjust_lr="match_rms_adamw")

    def check_options(self, h: dict) -> None:
        super().check_options(h)
        if h["adjust_lr"] != "match_rms_adamw":
            raise ValueError(f"Invalid adjust_lr for D-Muon: {h['adjust_lr']!r} (D-Muon is Moonlight's "
                             f"'match_rms_adamw' rule; for Keller Jordan's 'original' use optimizer='muon')")


def matrix_rows(name: str, rows: int) -> list[slice]:
    """The rows of each matrix that parameter ``name`` holds: three (q, k, v) for GPT-2's fused
    ``c_attn`` weight, else one."""
    if name.endswith(FUSED_QKV):
        third = rows // 3
        return [slice(0, third), slice(third, 2 * third), slice(2 * third, rows)]
    return [slice(0, rows)]


def _overlap(rows: slice, first_row: int, local_rows: int) -> tuple[slice, slice]:
    """(this rank's local rows, the part's rows) where the part ``rows`` of the whole matrix meets
    the ``local_rows`` rows from ``first_row`` this rank holds."""
    start, stop = max(rows.start, first_row), min(rows.stop, first_row + local_rows)
    stop = max(start, stop)
    return slice(start - first_row, stop - first_row), slice(start - rows.start, stop - rows.start)


def newton_schulz(update: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> Tensor:
    """The quintic Newton-Schulz iteration on the 2-D ``update`` in ``dtype``, operation for
    operation ``torch.optim.Muon``'s (so in bfloat16 its results are bitwise the reference's)."""
    a, b, c = coefficients
    x = update.to(dtype, copy=True)
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))  # the spectral norm is at most the Frobenius norm: now <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, rule: str, shape: tuple[int, int]) -> float:
    """Muon's lr for a (rows, cols) matrix: Keller Jordan's ("original") or Moonlight's rule."""
    rows, cols = shape
    if rule == "original":
        return lr * math.sqrt(max(1, rows / cols))
    return lr * 0.2 * math.sqrt(max(rows, cols))


def default_ns_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on CUDA and on CPUs with bfloat16 matrix units, float32 elsewhere (where bfloat16
    matmuls are emulated and slower than float32's)."""
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if device.type == "cpu" and _cpu_has_bf16_units() else torch.float32


def _cpu_has_bf16_units() -> bool:
    flags = _cpu_flags()
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
