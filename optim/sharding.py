"""Optimizers on parameters sharded by rows across ranks (FSDP2's ``fully_shard``), exactly.

FSDP2 holds each parameter as a DTensor sharded on dim 0 (``Shard(0)``): rank r keeps rows
``[r*c, (r+1)*c)`` of R rows, ``c = ceil(R / world)`` (torch.chunk's split, so the last ranks may
hold fewer rows, or none). Element-wise updates (AdamW, Lion, Sophia-G) need nothing more than
the local rows. Trust ratios reduce over whole tensors, rows and columns (docs/optimizers.md,
"Sharded optimizer state"): with whole rows per rank, row norms are local; column norms and the
whole-tensor norm are completed by one all-reduce per tensor, MAX of the local maxima for the
max norm (exact: padding or an empty shard contributes 0, and max is order-free) and SUM of
the local sums of squares for the l2 norm (LAMB; the summation order is the only difference
from one rank). ``Shards`` is that reduction for one parameter; ``completed(ops, shards)`` wraps
a backend (optim/backends/) so that its fused operations see the local rows and its ratios are
the whole tensor's.
"""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from .backends import common, reference


def _dtensor(t: Tensor) -> bool:
    """Whether ``t`` is a DTensor. Looked up, not imported: importing torch.distributed.tensor
    takes half a second of every process's start-up, and until something (FSDP2) has imported it
    no tensor can be one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local(t: Tensor) -> Tensor:
    """This rank's part of ``t`` (its rows, for a row-sharded DTensor; ``t`` itself otherwise),
    sharing t's storage, so in-place updates of it update t."""
    return t.to_local() if _dtensor(t) else t


@dataclass(frozen=True)
class Shards:
    """How one parameter's rows are spread over the ranks of ``group``."""

    group: dist.ProcessGroup
    rows: int         # the whole tensor's rows (dim 0)
    numel: int        # the whole tensor's elements
    world: int
    rank: int

    @staticmethod
    def of(p: Tensor) -> Shards | None:
        """p's row sharding; None when p is whole on this rank (a plain tensor, or replicated)."""
        if not _dtensor(p):
            return None
        if tuple(p.placements) != (sys.modules["torch.distributed.tensor"].Shard(0),):
            raise ValueError(f"a DTensor parameter of shape {tuple(p.shape)} has placements {p.placements}: "
                             f"this package's optimizers step parameters sharded on dim 0 (FSDP2's fully_shard)")
        mesh = p.device_mesh
        return Shards(mesh.get_group(), p.shape[0], p.numel(), mesh.size(), mesh.get_local_rank())

    @property
    def rows_per_rank(self) -> int:
        return -(-self.rows // self.world)

    @property
    def first_row(self) -> int:
        """The whole tensor's index of this rank's first row."""
        return min(self.rank * self.rows_per_rank, self.rows)

    def all_reduce(self, t: Tensor, op: dist.ReduceOp) -> Tensor:
        dist.all_reduce(t, op=op, group=self.group)
        return t

    def gather_rows(self, t: Tensor) -> Tensor:
        """The whole tensor's rows of a per-row quantity ``t`` (local rows first in dim 0)."""
        padded = t.new_zeros((self.rows_per_rank, *t.shape[1:]))
        padded[:t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat(parts)[:self.rows]


def total(t: Tensor, shards: Shards | None) -> Tensor:
    """The sum of the local ``t`` over the ranks p is sharded on (``t`` if p is whole here)."""
    return t if shards is None else shards.all_reduce(t.clone(), dist.ReduceOp.SUM)


def completed(ops, shards: Shards | None):
    """Backend ``ops`` as it steps a parameter with ``shards`` (``ops`` itself when whole)."""
    return ops if shards is None else _Completed(ops, shards)


class _Completed:
    """A backend's fused operations on local rows, with the trust ratios of the whole tensor.

    ``moments_and_ratios`` runs the backend's pass 1 without reductions (m, v and u on the local
    rows), then computes the norms on the local rows, completes the column and whole-tensor ones
    across the ranks and forms the ratios as the torch reference does. An empty shard takes part
    in the reductions (with zeros) and computes nothing."""

    def __init__(self, ops, shards: Shards):
        self.ops, self.shards = ops, shards
        self.NAME = ops.NAME

    def moments_and_ratios(self, p: Tensor, g: Tensor, m: Tensor, v: Tensor, *, reduce: str, l2: bool,
                           max_p_norm: float = math.inf, **options) -> tuple[Tensor, ...]:
        if p.numel():
            self.ops.moments_and_ratios(p, g, m, v, reduce="none", l2=l2, max_p_norm=max_p_norm, **options)
        if reduce == "none":
            return ()
        u = g  # the update direction pass 1 wrote into the gradient's storage
        ratio = functools.partial(reference.ratio, max_p_norm=max_p_norm)
        if reduce == "tensor":
            p_norm, u_norm = self._whole_norms(torch.stack([_partial(p, None, l2), _partial(u, None, l2)]), l2)
            return (ratio(p_norm, u_norm),)
        norm = functools.partial(torch.linalg.vector_norm, ord=2 if l2 else math.inf, dim=1, keepdim=True)
        p_rows, u_rows = norm(p), norm(u)  # whole rows are local: as on one rank
        cols = torch.stack([_partial(p, 0, l2), _partial(u, 0, l2)])
        whole = torch.stack([_partial(p_rows, None, l2), _partial(u_rows, None, l2)])
        # One collective per tensor: the column and whole-tensor partials together.
        reduced = self._whole_norms(torch.cat([cols.flatten(), whole]), l2)
        p_cols, u_cols = reduced[:-2].view_as(cols).unbind()
        return ratio(p_rows, u_rows), ratio(p_cols, u_cols), ratio(reduced[-2], reduced[-1])

    def apply_update(self, p: Tensor, u: Tensor, rows, cols, **options) -> Tensor | None:
        if p.numel():
            return self.ops.apply_update(p, u, rows, cols, **options)
        return torch.zeros((), dtype=torch.long, device=p.device) if options.get("count") else None

    def lion_step(self, p: Tensor, *tensors: Tensor, **options) -> None:
        if p.numel():
            self.ops.lion_step(p, *tensors, **options)

    def sophia_step(self, p: Tensor, *tensors: Tensor, **options) -> None:
        if p.numel():
            self.ops.sophia_step(p, *tensors, **options)

    def ademamix_step(self, p: Tensor, *tensors: Tensor, **options) -> None:
        if p.numel():
            self.ops.ademamix_step(p, *tensors, **options)

    def schedulefree_step(self, y: Tensor, *tensors: Tensor, **options) -> None:
        if y.numel():
            self.ops.schedulefree_step(y, *tensors, **options)

    def mars_correction(self, g: Tensor, *tensors: Tensor, **options) -> Tensor:
        # The local rows' sum of c^2: the optimizer sums the ranks' (sharding.total).
        if g.numel():
            return self.ops.mars_correction(g, *tensors, **options)
        return torch.zeros((), dtype=common.compute_dtype(g.dtype), device=g.device)

    def _whole_norms(self, partials: Tensor, l2: bool) -> Tensor:
        """Norms from the ranks' partials: max of maxima, or the root of the summed squares."""
        reduced = self.shards.all_reduce(partials, dist.ReduceOp.SUM if l2 else dist.ReduceOp.MAX)
        return reduced.sqrt() if l2 else reduced


def _partial(x: Tensor, dim: int | None, l2: bool) -> Tensor:
    """This rank's share of a norm over ``dim`` (None: all dims) of its rows ``x``: the max of
    |x| (max norm) or the sum of x^2 (l2 norm), 0 for no rows; over dim 0 with keepdim."""
    keep = {} if dim is None else {"dim": dim, "keepdim": True}
    if x.shape[0] == 0:
        shape = () if dim is None else (1, *x.shape[1:])
        return x.new_zeros(shape)
    return x.square().sum(**keep) if l2 else torch.linalg.vector_norm(x, ord=math.inf, **keep)
