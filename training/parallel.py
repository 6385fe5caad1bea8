"""How a run lays the model and the optimizer state out over its ranks (docs/scaling_out.md).

=========  ==============================  =================================================
strategy   parameters and gradients        optimizer state
=========  ==============================  =================================================
single     one process                     whole
ddp        replicated; DDP all-reduces     replicated
zero1      replicated; DDP all-reduces     sharded by whole parameters (optim/zero.py)
fsdp       sharded by rows (FSDP2)         sharded by rows, like its parameter (optim/sharding.py)
replicas   replicated; DDP over the job's   replicated (one of several replica groups on torchft,
           ranks, torchft across groups     training/replicas.py, averaging every step)
fsdp_      sharded by rows over the job's   sharded by rows; the same rank of every group holds
replicas   ranks, torchft across groups     the same shard
=========  ==============================  =================================================

``Layout`` and its subclasses, one a strategy, are the one place that knows which: the training loop
asks it to wrap the model, to reduce gradients on the last accumulation micro-step only, to gather a
plain model for the work that does not run on every rank in step (the probe, samples, zero-shot
evaluation), and which checkpoint writer saves and loads the run's state (training/checkpoint/:
inline, the ZeRO-1 state consolidated on rank 0, or every rank's shards with DCP). The loop
otherwise reads like a single-process loop. What the reductions carry and cost, and the hooks that
compress them, are training/communication.py's.
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT
from optim.sharding import local
from training.checkpoint.writers import ConsolidatingWriter, InlineWriter, ShardedWriter
from training.communication import Traffic, compression_hook, mean_across_groups, nbytes
from training.distributed import Distributed

if TYPE_CHECKING:
    from training.replicas import ReplicaMembership


class Layout:
    """One process: nothing replicated, nothing sharded. The base of the strategies below, each a
    subclass that overrides what it does otherwise.

    A layout spans two groups of ranks, as torchtitan's ``ParallelDims`` names them: ``replicate``,
    the ranks that hold whole copies of the parameters and average their gradients (DDP), and
    ``shard``, the ranks that split the parameters (FSDP2) or the optimizer state (ZeRO-1, FSDP2)
    between them. Within one torchrun job each is every rank or none (None: a group of one)."""

    strategy = "single"
    replicate: dist.ProcessGroup | None = None
    shard: dist.ProcessGroup | None = None
    shards_parameters = False
    zero_redundancy = False  # whether the optimizer is wrapped in ZeRO-1 (``optim.build(..., zero_redundancy=)``)
    checkpoint_writer = InlineWriter  # how its checkpoints are written and read (training/checkpoint/writers.py)
    sync_bytes = 0  # what a rank hands a reduction that DDP or FSDP2 runs without a hook: the whole gradient

    def __init__(self, ctx: Distributed, membership: ReplicaMembership | None = None, comm_hook: str = "",
                 powersgd_rank: int = 1):
        self.ctx = ctx
        # torchft's side of a run that is one of several replica groups (training/replicas.py), else None
        self.membership = membership
        self.comm_hook, self.powersgd_rank = comm_hook, powersgd_rank  # (DDP's communication hook)
        self.traffic = Traffic()  # what this rank handed the reductions so far (training/communication.py)

    @staticmethod
    def of(config, ctx: Distributed) -> Layout:
        """The layout ``config`` (a TrainConfig) asks for on ``ctx``'s ranks (one process: ``Layout``
        whatever it asks, with a warning that it shards nothing). One of several replica groups
        joins them first (torchft's lighthouse): with local steps its ranks train as any job's and
        meet the other groups every H steps; without, every gradient is averaged across the groups."""
        zero_stage, fsdp = config.zero_stage, config.fsdp
        membership = None
        if config.replica_groups:
            from training.replicas import ReplicaMembership  # (torchft: imported by the runs that use it)
            membership = ReplicaMembership.join(config, ctx)
            if not config.local_steps:
                return (FullyShardedAcrossReplicaGroups if fsdp and ctx.enabled else AcrossReplicaGroups)(ctx,
                                                                                                        membership)
        hook = dict(comm_hook=config.comm_hook, powersgd_rank=config.powersgd_rank)
        if not ctx.enabled:
            if zero_stage or fsdp:
                asked = "fsdp=True" if fsdp else f"zero_stage={zero_stage}"
                warnings.warn(f"{asked} on one process shards nothing: this run is unsharded, and so is its "
                              f"checkpoint (resume it without {asked.split('=')[0]}, or launch with torchrun "
                              f"--nproc_per_node=N to shard)")
            if config.comm_hook:
                warnings.warn(f"comm_hook={config.comm_hook!r} on one process compresses nothing: it reduces no "
                              f"gradients (launch with torchrun --nproc_per_node=N)")
            return Layout(ctx, membership, **hook)
        return (FullyShardedDataParallel if fsdp else ZeRO1 if zero_stage == 1 else DataParallel)(ctx, membership,
                                                                                                **hook)

    @property
    def data_rank(self) -> int:
        """This rank's share of each global batch (the training loader's rank): its rank among
        every replica group's ranks."""
        membership = self.membership
        return self.ctx.rank + (membership.replica_id * self.ctx.world_size if membership else 0)

    @property
    def data_ranks(self) -> int:
        """The ranks the global batch splits over: this job's, times the replica groups."""
        return self.ctx.world_size * (self.membership.group_count if self.membership else 1)

    @property
    def measures_gradient_noise(self) -> bool:
        """Whether a rank sees its own gradients and the job's mean (the gradient noise scale needs
        both): not under FSDP2 (sharded), nor across replica groups (the mean is torchft's), nor
        through a communication hook (which holds DDP's one hook, and approximates the mean)."""
        return not (self.shards_parameters or self.membership or self.comm_hook)

    @property
    def gradient_copies(self) -> int:
        """Copies of the gradients a rank holds: DDP's buckets are a second one."""
        return 1

    def measures_optimizer(self) -> bool:
        """Whether this rank measures the optimizer's diagnostics and the update statistics at a log
        step: the main rank of a replicated state; with a sharded one every rank, for its share."""
        return self.ctx.is_main or self.shard is not None

    def shard_model(self, model: GPT, param_dtype: torch.dtype) -> None:
        """Split the model's parameters over ``shard`` in place, before the optimizer sees them."""

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the training steps run."""
        return model

    def gradient_sync(self, train_model: nn.Module, sync: bool):
        """The context of one accumulation micro-step: gradients reduced across the ranks only when
        ``sync`` (the last micro-step)."""
        return nullcontext()

    def plain_model(self, model: GPT, on_every_rank: bool = False) -> GPT | None:
        """A plain (unsharded) GPT with ``model``'s weights, for work that does not run on every
        rank in step (the probe, samples, zero-shot evaluation): ``model`` itself unless it is sharded."""
        return model

    def full_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """The whole of ``t`` (a sharded DTensor gathered: every rank calls it)."""
        return t

    def all_finite(self, tensors) -> bool:
        """Whether every element of ``tensors`` on every rank is finite (one host sync)."""
        return bool(self._finite(tensors))

    @staticmethod
    def _finite(tensors) -> torch.Tensor:
        return torch.stack([torch.isfinite(local(t)).all() for t in tensors]).all()

    def allreduce_across_groups(self, tensor: torch.Tensor) -> torch.futures.Future:
        """``tensor`` averaged over the replica groups of the step's quorum (its bytes counted)."""
        self.traffic.count(nbytes([tensor]), across_groups=True)
        return self.membership.allreduce(tensor)


class DataParallel(Layout):
    """``ddp``: parameters, gradients and optimizer state replicated on every rank; DDP all-reduces
    the gradients over ``replicate``."""

    strategy = "ddp"

    def __init__(self, ctx: Distributed, *args, **kwargs):
        super().__init__(ctx, *args, **kwargs)
        self.replicate = dist.group.WORLD

    @property
    def gradient_copies(self) -> int:
        return 2

    def wrap(self, model: nn.Module) -> nn.Module:
        device = self.ctx.device
        ddp = DDP(model, device_ids=[self.ctx.local_rank] if device.type == "cuda" else None,
                  process_group=self.replicate)
        if self.comm_hook:  # (which counts its own bytes)
            ddp.register_comm_hook(*compression_hook(self))
        else:
            self.sync_bytes = nbytes(p for p in model.parameters() if p.requires_grad)
        return ddp

    def gradient_sync(self, train_model: nn.Module, sync: bool):
        if sync:
            self.traffic.count(self.sync_bytes)
        return nullcontext() if sync else train_model.no_sync()  # DDP's


class ZeRO1(DataParallel):
    """``zero1``: DDP's replicated parameters and gradients, the optimizer state split over
    ``shard`` (every rank) by whole parameters (optim/zero.py); its checkpoint consolidates the
    state on rank 0 into the plain optimizer's format."""

    strategy = "zero1"
    zero_redundancy = True
    checkpoint_writer = ConsolidatingWriter

    def __init__(self, ctx: Distributed, *args, **kwargs):
        super().__init__(ctx, *args, **kwargs)
        self.shard = dist.group.WORLD


class AcrossReplicaGroups(DataParallel):
    """``replicas``: one of several replica groups (torchft) that average every gradient across
    each other. DDP computes each bucket's mean over this job's ranks (``replicate``; a group of one
    process has none), then torchft's manager the mean over the groups that take part in the step
    (training/replicas.py); a step the groups cannot agree on is dropped (``Step.committed``)."""

    strategy = "replicas"

    def __init__(self, ctx: Distributed, membership: ReplicaMembership):
        super().__init__(ctx, membership)
        self.replicate = dist.group.WORLD if ctx.enabled else None

    def wrap(self, model: nn.Module) -> nn.Module:
        # DDP over a dummy group (nothing broadcast: the weights start equal by the seed, or from a
        # peer), its buckets reduced by the hook below. find_unused_parameters keeps the buckets as
        # first built, as torchft's own DDP does: a rejoining group's must match its peers'.
        from training.torchft_adapter import dummy_group
        device = self.ctx.device
        ddp = DDP(model, device_ids=[self.ctx.local_rank] if device.type == "cuda" else None,
                  process_group=dummy_group(), find_unused_parameters=True)
        ddp.register_comm_hook(self, mean_across_groups)  # (training/communication.py)
        return ddp


class FullyShardedDataParallel(Layout):
    """``fsdp``: parameters, gradients and optimizer state split by rows over ``shard`` (FSDP2;
    optim/sharding.py completes the trust ratios across it); every rank writes its shards of the
    checkpoint with DCP (training/checkpoint/sharded.py)."""

    strategy = "fsdp"
    shards_parameters = True
    checkpoint_writer = ShardedWriter

    def __init__(self, ctx: Distributed, *args, **kwargs):
        super().__init__(ctx, *args, **kwargs)
        self.shard = dist.group.WORLD

    def shard_model(self, model: GPT, param_dtype: torch.dtype) -> None:
        """Every transformer block and then the rest (embeddings, final norm, the tied LM head).
        ``param_dtype`` other than float32: FSDP2's mixed precision (parameters gathered and
        computed in it, gradients reduced and master weights kept in float32)."""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=None if param_dtype == torch.float32 else param_dtype,
                                      reduce_dtype=torch.float32)
        mesh = DeviceMesh.from_group(self.shard, self.ctx.device.type)
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)

    def wrap(self, model: nn.Module) -> nn.Module:
        # (what a rank hands the reduce-scatter: the whole gradient)
        self.sync_bytes = nbytes(p for p in model.parameters() if p.requires_grad)
        return model

    def gradient_sync(self, train_model: nn.Module, sync: bool):
        train_model.set_requires_gradient_sync(sync)  # FSDP2's
        if sync:
            self.traffic.count(self.sync_bytes)
        return nullcontext()

    def plain_model(self, model: GPT, on_every_rank: bool = False) -> GPT | None:
        """A copy on rank 0, or on every rank with ``on_every_rank`` (None on the others), filled
        one gathered parameter at a time (a collective: every rank calls it), so it costs one
        model and one parameter beyond the shards."""
        copy = GPT(model.config).to(self.ctx.device) if on_every_rank or self.ctx.is_main else None
        sharded_params = list(model.parameters())
        # (The same class: the same parameters in the same order, the tied embedding once.)
        targets = list(copy.parameters()) if copy is not None else [None] * len(sharded_params)
        with torch.no_grad():
            for sharded, target in zip(sharded_params, targets, strict=True):
                whole = self.full_tensor(sharded)
                if target is not None:
                    target.copy_(whole)
        return None if copy is None else copy.train(model.training)

    def full_tensor(self, t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    def all_finite(self, tensors) -> bool:
        finite = self._finite(tensors).to(torch.int32)
        dist.all_reduce(finite, op=dist.ReduceOp.MIN, group=self.shard)
        return bool(finite)


class FullyShardedAcrossReplicaGroups(FullyShardedDataParallel):
    """``fsdp_replicas``: one of several replica groups (torchft) that average every gradient across
    each other, FSDP2 inside each: every FSDP2 module's reduce-scattered gradient shard (the mean
    over the job's ranks) is averaged across the groups by torchft's manager in FSDP2's all-reduce
    hook (as torchtitan's fault tolerance does), the same rank of every group holding the same shard."""

    strategy = "fsdp_replicas"

    def shard_model(self, model: GPT, param_dtype: torch.dtype) -> None:
        super().shard_model(model, param_dtype)
        from torch.distributed.fsdp import FSDPModule
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_all_reduce_hook(self.allreduce_across_groups)
