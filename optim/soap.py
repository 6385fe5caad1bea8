"""SOAP (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam"), docs/optimizers.md "SOAP".

Adam in the eigenbasis of Shampoo's preconditioner, in the order of the authors' code
(github.com/nikhilvyas/SOAP, ``soap.py``). For a weight matrix W (rows x cols) with gradient G,
Shampoo's statistics L (rows x rows) and R (cols x cols), their eigenbases Q_L and Q_R, and t
Adam's step:

    G' = Q_L^T G Q_R                                     # the gradient in the eigenbasis
    m = b1*m + (1-b1)*G'                                  # Adam's moments, in the eigenbasis
    v = b2*v + (1-b2)*G'*G'
    W = W - lr * sqrt(1-b2^t)/(1-b1^t) * Q_L (m / (sqrt(v) + eps)) Q_R^T
    W = W - lr*wd * W                                     # decoupled decay, after the update
    L = sb*L + (1-sb)*G G^T;   R = sb*R + (1-sb)*G^T G    # sb: shampoo_beta (negative: b2)
    if t % precondition_frequency == 0, for (Q, S) in ((Q_L, L), (Q_R, R)):
        order Q's columns, and v's rows (resp. columns), by diag(Q^T S Q), descending
        Q = qr(S Q).Q                                     # one step of power iteration
    and m is rotated into the new basis: m = Q_L'^T (Q_L m Q_R^T) Q_R'

The first step only sets L and R from its gradient and Q_L, Q_R to their eigenvectors (eigh, by
eigenvalue descending), and moves nothing: the authors skip it "so that we never use the current
gradients in the projection"; t counts from the second step. A side longer than
``max_precond_dim`` (10,000: the embedding's vocabulary side) has no statistic, its Q is the
identity. Vectors (biases, norms' gains) take Adam, their first step skipped too.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import sharding
from .base import Optimizer, step_counter
from .muon import matrix_rows
from .protocol import ADAM_BETAS

# A matrix's two sides: (its statistic, its eigenbasis, the dim of a block it spans).
SIDES = (("L", "Q_L", -2), ("R", "Q_R", -1))


class SOAP(Optimizer):
    """SOAP on every parameter: matrices preconditioned, vectors by Adam.

    Defaults are the authors' (lr 3e-3, betas (0.95, 0.95), weight decay 0.01, eps 1e-8,
    shampoo_beta -1: b2, precondition_frequency 10, max_precond_dim 10,000, correct_bias on: Adam's
    bias correction). A config gets the 2025 benchmark's settings (optim/published.py). The
    authors' merge_dims, precondition_1d, normalize_grads and data_format (for convolutions and
    ablations; off in the authors' defaults and the benchmark's runs) are not offered.

    GPT-2's fused ``c_attn`` weight is three matrices, q, k and v (``matrix_rows``), each with its
    own L, R and eigenbases, as the benchmark's Llama with its separate q, k and v projections
    preconditions them (one statistic over the fused 3C rows would couple q, k and v).

    State per parameter: "step" (a float32 0-d counter of the steps taken, the first included, so
    Adam's t is step - 1); "exp_avg" and "exp_avg_sq" (m, v: the parameter's shape, in the
    eigenbasis); per matrix of k blocks (3 for c_attn, else 1) of rows x cols, for each side no
    longer than max_precond_dim, "L" (k, rows, rows) and "Q_L", "R" (k, cols, cols) and "Q_R", in
    the parameter's dtype: float32 (the authors' eigh and QR run in float32) or float64.
    Diagnostics (requested steps), per parameter: ``update_rms``, the RMS of the applied update per
    unit lr (0 on the first step, which moves nothing).

    One departure from the authors' operation order: their code rotates m back to the parameter's
    basis and into the eigenbasis after every step; between refreshes that round trip is the
    identity but for rounding, so here m is rotated at a refresh only (4 matrix products per matrix
    and step fewer).

    Sharded: under ZeRO-1 a rank holds whole parameters, nothing more to do. Under FSDP2 a rank
    holds rows: the gradient is gathered whole (one all-gather per parameter), and every rank keeps
    the whole state, updates it and computes the whole update, of which it applies its rows, so the
    parameters are one process's. The state is one process's on every rank (plain tensors: DCP
    writes one copy and loads it on any number of ranks). A step with a non-finite gradient is
    dropped on the host (``step_unless`` reads the flag): the refresh every precondition_frequency
    kept steps is a host decision.
    """

    BATCH_DECAYS = ADAM_BETAS  # (shampoo_beta -1, the default, follows beta2)
    USES_FUSED_OPERATIONS = False  # torch code: matrix products, eigh and QR
    FLAGS = ("correct_bias",)

    def __init__(self, params, lr: float = 3e-3, betas: tuple[float, float] = (0.95, 0.95), shampoo_beta: float = -1.0,
                 eps: float = 1e-8, weight_decay: float = 0.01, precondition_frequency: int = 10,
                 max_precond_dim: int = 10000, correct_bias: bool = True, *, backend: str = "auto"):
        super().__init__(params, {"lr": lr, "betas": betas, "shampoo_beta": shampoo_beta, "eps": eps,
                                  "weight_decay": weight_decay, "precondition_frequency": precondition_frequency,
                                  "max_precond_dim": max_precond_dim, "correct_bias": correct_bias},
                         backend=backend)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim > 2 or p.dtype not in (torch.float32, torch.float64):
                    raise ValueError(f"SOAP steps float32 or float64 vectors and matrices, got a {p.dtype} parameter "
                                     f"of shape {tuple(p.shape)}")

    def check_options(self, h: dict) -> None:
        if not h["shampoo_beta"] < 1.0:
            raise ValueError(f"Invalid shampoo_beta: {h['shampoo_beta']} (must be in [0, 1), or negative for betas[1])")
        for key in ("precondition_frequency", "max_precond_dim"):
            if not (isinstance(h[key], int) and h[key] >= 1):
                raise ValueError(f"Invalid {key}: {h[key]!r} (must be an int >= 1)")

    def init_state(self, p: Tensor) -> dict:
        # Whole on every rank, also for a parameter FSDP2 shards (the class docstring).
        device = sharding.local(p).device
        state = {"step": step_counter(), "exp_avg": torch.zeros(p.shape, dtype=p.dtype, device=device),
                 "exp_avg_sq": torch.zeros(p.shape, dtype=p.dtype, device=device)}
        if p.ndim == 2:
            group, index = next((group, i) for group in self.param_groups for i, q in enumerate(group["params"])
                                if q is p)
            blocks = _blocks(group, index, p.shape[0])
            for statistic, basis, dim in SIDES:
                n = (p.shape[0] // blocks, p.shape[1])[dim]
                if n <= group["max_precond_dim"]:
                    state[statistic] = torch.zeros(blocks, n, n, dtype=p.dtype, device=device)
                    state[basis] = torch.zeros_like(state[statistic])
        return state

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        whole = grad if shards is None else shards.gather_rows(grad)  # (FSDP2: every rank the whole gradient)
        g = whole if whole.ndim < 2 else whole.reshape(_blocks(group, index, whole.shape[0]), -1, whole.shape[1])
        beta1, beta2 = group["betas"]
        shampoo_beta = group["shampoo_beta"] if group["shampoo_beta"] >= 0 else beta2
        step = int(state["step"])  # (a CPU counter: no device sync)
        if step == 1:  # the statistics and their eigenbases, no update
            _accumulate(g, state, shampoo_beta)
            for statistic, basis, _ in SIDES:
                if basis in state:
                    state[basis].copy_(eigenbasis(state[statistic]))
            if self.diagnostics_requested:
                self.record_diagnostics(group, index, update_rms=torch.zeros((), device=p.device))
            return
        t = step - 1
        m, v = state["exp_avg"].view_as(g), state["exp_avg_sq"].view_as(g)
        rotated = to_eigenbasis(g, state)
        m.mul_(beta1).add_(rotated, alpha=1.0 - beta1)
        v.mul_(beta2).add_(rotated.square(), alpha=1.0 - beta2)
        denom = v.sqrt().add_(group["eps"])
        correction = (1.0 - beta2 ** t) ** 0.5 / (1.0 - beta1 ** t) if group["correct_bias"] else 1.0
        step_size = group["lr"] * correction
        update = from_eigenbasis(m / denom, state).view_as(whole)
        p.add_(update if shards is None else update[shards.first_row:shards.first_row + p.shape[0]], alpha=-step_size)
        if group["weight_decay"] > 0.0:
            p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        _accumulate(g, state, shampoo_beta)
        if t % group["precondition_frequency"] == 0:
            _refresh(state, m, v)
        if self.diagnostics_requested:
            self.record_diagnostics(group, index, update_rms=update.square().mean().sqrt() * correction)


def _blocks(group: dict, index: int, rows: int) -> int:
    """How many matrices parameter ``group["params"][index]`` of ``rows`` rows stacks (3: q, k, v)."""
    name = group["names"][index] if "names" in group else ""
    blocks = len(matrix_rows(name, rows))
    if rows % blocks:
        raise ValueError(f"SOAP preconditions q, k and v of {name} apart, but its {rows} rows do not divide by 3")
    return blocks


def to_eigenbasis(x: Tensor, state: dict) -> Tensor:
    """Q_L^T x Q_R for the blocks ``x`` (k, rows, cols), each side where it is preconditioned (x if none)."""
    if "Q_L" in state:
        x = state["Q_L"].mT @ x
    if "Q_R" in state:
        x = x @ state["Q_R"]
    return x


def from_eigenbasis(x: Tensor, state: dict) -> Tensor:
    """Q_L x Q_R^T: ``to_eigenbasis`` undone."""
    if "Q_L" in state:
        x = state["Q_L"] @ x
    if "Q_R" in state:
        x = x @ state["Q_R"].mT
    return x


def eigenbasis(statistic: Tensor) -> Tensor:
    """The eigenvectors of each symmetric (k, n, n) block, by eigenvalue descending: as the authors,
    eigh of the statistic plus 1e-30 I (retried in float64 where it does not converge), columns
    flipped from eigh's ascending order."""
    shifted = statistic + 1e-30 * torch.eye(statistic.shape[-1], dtype=statistic.dtype, device=statistic.device)
    try:
        vectors = torch.linalg.eigh(shifted).eigenvectors
    except torch.linalg.LinAlgError:
        vectors = torch.linalg.eigh(shifted.double()).eigenvectors.to(statistic.dtype)
    return vectors.flip(-1)


def _accumulate(g: Tensor, state: dict, shampoo_beta: float) -> None:
    """L = sb*L + (1-sb)*G G^T and R = sb*R + (1-sb)*G^T G, as the authors' lerp_."""
    if "L" in state:
        state["L"].lerp_(g @ g.mT, 1.0 - shampoo_beta)
    if "R" in state:
        state["R"].lerp_(g.mT @ g, 1.0 - shampoo_beta)


def _refresh(state: dict, m: Tensor, v: Tensor) -> None:
    """One power-iteration step per eigenbasis (the authors' ``get_orthogonal_matrix_QR``): its columns
    ordered by their estimated eigenvalues, descending, v's coordinates moved with them; then m
    rotated from the old basis into the new one."""
    m_in_parameter_basis = from_eigenbasis(m, state)
    for statistic, basis, dim in SIDES:
        if basis in state:
            S, Q = state[statistic], state[basis]
            order = (Q.mT @ S @ Q).diagonal(dim1=-2, dim2=-1).argsort(dim=-1, descending=True)
            v.copy_(v.take_along_dim(order.unsqueeze(-1) if dim == -2 else order.unsqueeze(-2), dim=dim))
            Q.copy_(torch.linalg.qr(S @ Q.take_along_dim(order.unsqueeze(-2), dim=-1)).Q)
    m.copy_(to_eigenbasis(m_in_parameter_basis, state))
