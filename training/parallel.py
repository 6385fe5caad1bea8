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
evaluation), and to save and load the run's state (training/state.py) as its checkpoint: inline (one
process, DDP), the ZeRO-1 state consolidated on rank 0 into the inline format, or every rank's
shards with DCP (FSDP2; training/checkpoint.py). The loop otherwise reads like a single-process
loop. The tools that read a checkpoint's model (the evaluator, the lm-eval adapter, the HF export,
the Hessian script) do so with ``load_model``, which tells the two checkpoint layouts apart as
``Layout.load`` does; training/sharded_checkpoint.py, and with it DCP, is imported only where one is
sharded.
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT
from optim.sharding import local
from training import distributed
from training.checkpoint import Checkpoint, save_in
from training.distributed import Distributed
from training.parts import Part
from training.state import RunState

if TYPE_CHECKING:
    from training.replicas import ReplicaGroup


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

    def __init__(self, ctx: Distributed, replica_group: ReplicaGroup | None = None, comm_hook: str = "",
                 powersgd_rank: int = 1):
        self.ctx = ctx
        # torchft's side of a run that is one of several replica groups (training/replicas.py), else None
        self.replica_group = replica_group
        self.comm_hook, self.powersgd_rank = comm_hook, powersgd_rank  # (DDP's communication hook)
        self.gradient_bytes = 0  # what this rank handed the gradient reductions so far (the comm/ metrics)

    @staticmethod
    def of(config, ctx: Distributed) -> Layout:
        """The layout ``config`` (a TrainConfig) asks for on ``ctx``'s ranks (one process: ``Layout``
        whatever it asks, with a warning that it shards nothing). One of several replica groups
        joins them first (torchft's lighthouse): with local steps its ranks train as any job's and
        meet the other groups every H steps; without, every gradient is averaged across the groups."""
        zero_stage, fsdp = config.zero_stage, config.fsdp
        group = None
        if config.replica_groups:
            from training.replicas import ReplicaGroup  # (torchft: imported by the runs that use it)
            group = ReplicaGroup.join(config, ctx)
            if not config.local_steps:
                return (FullyShardedAcrossReplicaGroups if fsdp and ctx.enabled else AcrossReplicaGroups)(ctx, group)
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
            return Layout(ctx, group, **hook)
        return (FullyShardedDataParallel if fsdp else ZeRO1 if zero_stage == 1 else DataParallel)(ctx, group, **hook)

    @property
    def data_rank(self) -> int:
        """This rank's share of each global batch (the training loader's rank): its rank among
        every replica group's ranks."""
        group = self.replica_group
        return self.ctx.rank + (group.replica_id * self.ctx.world_size if group else 0)

    @property
    def data_ranks(self) -> int:
        """The ranks the global batch splits over: this job's, times the replica groups."""
        return self.ctx.world_size * (self.replica_group.groups if self.replica_group else 1)

    @property
    def measures_gradient_noise(self) -> bool:
        """Whether a rank sees its own gradients and the job's mean (the gradient noise scale needs
        both): not under FSDP2 (sharded), nor across replica groups (the mean is torchft's), nor
        through a communication hook (which holds DDP's one hook, and approximates the mean)."""
        return not (self.shards_parameters or self.replica_group or self.comm_hook)

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

    # --- checkpoints ---
    def save(self, state: RunState, run_dir) -> None:
        """Write ``state`` as run_dir's newest checkpoint (ckpt.pt names it once it is whole); every
        rank calls it. Here: the whole state, by rank 0."""
        fields = state.state_dict()  # (collectives: every rank's RNG states and loss sums)
        optimizer = self._optimizer_state(state.optimizer)
        if self.ctx.is_main:
            save_in(run_dir, Checkpoint(model=state.model.state_dict(), optimizer=optimizer, **fields))
        distributed.barrier(self.ctx)

    def _optimizer_state(self, optimizer) -> dict:
        return optimizer.state_dict()

    def load(self, state: RunState, checkpoint: Checkpoint, path) -> None:
        """Continue ``state`` from ``checkpoint`` (read from ``path``); every rank calls it. A
        sharded checkpoint reshards (FSDP2 on any number of ranks, DDP or one process); a whole-model
        file loads anywhere but under FSDP2 (ZeRO-1 keeps its partition's share of the state)."""
        self._check_loads(checkpoint, path)
        # The optimizer's state is the checkpoint's, its hyper-parameters this run's: the same values
        # but where the config changed one on resume (allow_changes), which so applies. (Group keys
        # that are state, GROUP_STATE, such as Schedule-Free's step count, stay the checkpoint's.)
        settings = [{key: value for key, value in group.items()
                     if key != "params" and key not in state.optimizer.GROUP_STATE}
                    for group in state.optimizer.param_groups]
        _load_tensors(checkpoint, path, state.model, state.optimizer)
        for group, own in zip(state.optimizer.param_groups, settings, strict=True):
            group.update(own)
        state.load_state_dict(checkpoint)

    def _check_loads(self, checkpoint: Checkpoint, path) -> None:
        """Refuse a checkpoint this layout cannot continue, saying how to."""


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
        self.sync_bytes = _gradient_bytes(model)
        if self.comm_hook:  # (which counts its own bytes)
            ddp.register_comm_hook(*_communication_hook(self))
        return ddp

    def gradient_sync(self, train_model: nn.Module, sync: bool):
        if sync and not self.comm_hook:
            self.gradient_bytes += self.sync_bytes
        return nullcontext() if sync else train_model.no_sync()  # DDP's


class ZeRO1(DataParallel):
    """``zero1``: DDP's replicated parameters and gradients, the optimizer state split over
    ``shard`` (every rank) by whole parameters (optim/zero.py); its checkpoint consolidates the
    state on rank 0 into the plain optimizer's format."""

    strategy = "zero1"
    zero_redundancy = True

    def __init__(self, ctx: Distributed, *args, **kwargs):
        super().__init__(ctx, *args, **kwargs)
        self.shard = dist.group.WORLD

    def _optimizer_state(self, optimizer) -> dict:
        return optimizer.consolidated_state_dict()  # (a collective)

    def _check_loads(self, checkpoint: Checkpoint, path) -> None:
        if checkpoint.tensors == "dcp":
            raise ValueError(f"checkpoint {path} is sharded (written with fsdp=True): resume it with "
                             f"fsdp=True, or with zero_stage=0")


def _gradient_bytes(model: nn.Module) -> int:
    """The bytes of the gradients a reduction carries: every trained parameter's, in its dtype."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _communication_hook(layout: DataParallel) -> tuple:
    """(state, hook) of torch's DDP communication hook ``layout.comm_hook``, counting the bytes it
    hands the all-reduce into ``layout.gradient_bytes``:

    - "bf16": each rank's gradient rounded to bfloat16 (8 significant bits), divided by the ranks
      and summed in bfloat16, then widened again: the mean to about 2^-8 of each element.
    - "powersgd": Vogels et al. 2019 at rank ``powersgd_rank``, from the third step on (the first
      two all-reduce exactly: torch's earliest start with error feedback): each matrix gradient (as
      rows x the rest) that compresses by more than 2x is all-reduced as two rank-r factors P and Q,
      the rest exactly; the approximation's error is added to the next step's gradient (error
      feedback), so no step applies the mean gradient, and a resume starts the feedback afresh.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    def bf16(group, bucket):  # (no annotations: DDP checks them, and this module's are strings)
        layout.gradient_bytes += bucket.buffer().numel() * 2
        return default_hooks.bf16_compress_hook(group, bucket)

    def power(state, bucket):
        layout.gradient_bytes += _powersgd_bytes(state, bucket)
        return powersgd.powerSGD_hook(state, bucket)

    if layout.comm_hook == "bf16":
        return layout.replicate, bf16
    return powersgd.PowerSGDState(layout.replicate, matrix_approximation_rank=layout.powersgd_rank,
                                  start_powerSGD_iter=2), power


def _powersgd_bytes(state, bucket) -> int:
    """The bytes ``powerSGD_hook`` all-reduces for ``bucket`` at ``state``'s iteration (its rules)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress
    buffer = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        return buffer.numel() * buffer.element_size()
    elements = 0
    for gradient in bucket.gradients():
        rows = gradient.shape[0] if gradient.ndim > 1 else 0
        if rows and _should_compress(rows, gradient.numel() // rows, state.matrix_approximation_rank,
                                     state.min_compression_rate)[0]:
            elements += (rows + gradient.numel() // rows) * state.matrix_approximation_rank
        else:
            elements += gradient.numel()
    return elements * buffer.element_size()


class Communication(Part):
    """The bytes this rank handed the gradient reductions (``comm/``): over the run, and per token
    of the global batches; in a run of several ranks. scripts/comm_model.py projects from them.
    Checkpointed, so a resumed run counts on from the uninterrupted one's (every rank's count is
    the same: the whole gradient a reduction)."""

    name = "communication"
    metric_keys = ("comm/",)

    def __init__(self, run):
        self.run = run

    @classmethod
    def build(cls, run) -> Communication | None:
        return cls(run) if run.ctx.enabled else None

    def measure(self, step) -> dict:
        sent = self.run.layout.gradient_bytes
        return {"comm/gradient_bytes": sent, "comm/gradient_bytes_per_token": sent / self.run.state.tokens}

    def state_dict(self) -> dict:
        return {"gradient_bytes": self.run.layout.gradient_bytes}

    def load_state_dict(self, state: dict) -> None:
        self.run.layout.gradient_bytes = state["gradient_bytes"]


class AcrossReplicaGroups(DataParallel):
    """``replicas``: one of several replica groups (torchft) that average every gradient across
    each other. DDP computes each bucket's mean over this job's ranks (``replicate``; a group of one
    process has none), then torchft's manager the mean over the groups that take part in the step
    (training/replicas.py); a step the groups cannot agree on is dropped (``Step.committed``)."""

    strategy = "replicas"

    def __init__(self, ctx: Distributed, replica_group: ReplicaGroup):
        super().__init__(ctx, replica_group)
        self.replicate = dist.group.WORLD if ctx.enabled else None
        self.sync_bytes = 0  # (within the group: counted by the hook below)

    def wrap(self, model: nn.Module) -> nn.Module:
        # DDP over a dummy group (nothing broadcast: the weights start equal by the seed, or from a
        # peer), its buckets reduced by the hook below. find_unused_parameters keeps the buckets as
        # first built, as torchft's own DDP does: a rejoining group's must match its peers'.
        from torchft.process_group import ProcessGroupDummy
        device = self.ctx.device
        ddp = DDP(model, device_ids=[self.ctx.local_rank] if device.type == "cuda" else None,
                  process_group=ProcessGroupDummy(0, 1), find_unused_parameters=True)
        ddp.register_comm_hook(self, _mean_across_groups)
        return ddp


def _mean_across_groups(layout, bucket):
    """DDP's communication hook across replica groups: the dist.GradBucket's mean over this job's
    ranks, then over the groups taking part (torchft; a failed collective is the manager's to
    report); a future of it. (Not annotated: DDP checks the annotations, which the module's
    ``from __future__ import annotations`` would make strings.)"""
    buffer = bucket.buffer()
    if layout.replicate is not None:
        layout.gradient_bytes += buffer.numel() * buffer.element_size()
        dist.all_reduce(buffer, group=layout.replicate)
        buffer /= layout.ctx.world_size
    return layout.replica_group.allreduce(buffer)


class FullyShardedDataParallel(Layout):
    """``fsdp``: parameters, gradients and optimizer state split by rows over ``shard`` (FSDP2;
    optim/sharding.py completes the trust ratios across it); every rank writes its shards of the
    checkpoint with DCP (training/sharded_checkpoint.py)."""

    strategy = "fsdp"
    shards_parameters = True

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
        self.sync_bytes = _gradient_bytes(model)  # (what a rank hands the reduce-scatter: the whole gradient)
        return model

    def gradient_sync(self, train_model: nn.Module, sync: bool):
        train_model.set_requires_gradient_sync(sync)  # FSDP2's
        self.gradient_bytes += self.sync_bytes if sync else 0
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

    def save(self, state: RunState, run_dir) -> None:
        """Every rank writes its shards (DCP), rank 0 the rest of the state."""
        from training.sharded_checkpoint import save_sharded_in  # (DCP: imported by the runs that use it)
        fields = state.state_dict()  # (collectives)
        checkpoint = Checkpoint(model={}, optimizer={}, **fields) if self.ctx.is_main else None
        save_sharded_in(run_dir, checkpoint, state.model, state.optimizer, state.step)
        distributed.barrier(self.ctx)

    def _check_loads(self, checkpoint: Checkpoint, path) -> None:
        if checkpoint.tensors != "dcp":
            raise ValueError(f"checkpoint {path} is a whole-model file (written without fsdp): resume it without "
                             f"fsdp (DDP or zero_stage=1 shard no parameters), or start a new run_name")


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
                module.set_all_reduce_hook(self.replica_group.allreduce)


def load_model(path, map_location="cpu") -> tuple[GPT, Checkpoint]:
    """(GPT in eval mode on ``map_location``, the checkpoint it came from: step, config, ...), from
    a checkpoint file or a sharded checkpoint's folder."""
    path = Path(path)
    checkpoint = Checkpoint.load(path, map_location=map_location)
    model = GPT(checkpoint.model_config(path))
    _load_tensors(checkpoint, path, model)
    model.eval()
    if isinstance(map_location, (str, torch.device)):
        model.to(map_location)
    return model, checkpoint


def _load_tensors(checkpoint: Checkpoint, path: Path, model: nn.Module,
                  optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load ``checkpoint``'s model (and optimizer) state into ``model`` (``optimizer``): from the
    checkpoint itself, or from the DCP files of its folder (``path``) where it is sharded."""
    if checkpoint.tensors == "dcp":
        from training.sharded_checkpoint import load_sharded_state  # (DCP: imported where a checkpoint needs it)
        load_sharded_state(path, checkpoint, model, optimizer)
    else:
        model.load_state_dict(checkpoint.model)
        if optimizer is not None:
            optimizer.load_state_dict(checkpoint.optimizer)
