"""How a run lays the model and the optimizer state out over its ranks (README, "Scaling out").

=========  ==============================  =================================================
strategy   parameters and gradients        optimizer state
=========  ==============================  =================================================
single     one process                     whole
ddp        replicated; DDP all-reduces     replicated
zero1      replicated; DDP all-reduces     sharded by whole parameters (optim/zero.py)
fsdp       sharded by rows (FSDP2)         sharded by rows, like its parameter (optim/sharding.py)
=========  ==============================  =================================================

``Layout`` is the one place that knows which: the training loop asks it to wrap the model, to
reduce gradients on the last accumulation micro-step only, and to gather a plain model for the
work that does not run on every rank in step (the probe, samples, zero-shot evaluation); the
loop otherwise reads like a single-process loop.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT
from optim.sharding import local
from training.distributed import Distributed


@dataclass(frozen=True)
class Layout:
    strategy: str  # "single", "ddp", "zero1" or "fsdp"
    ctx: Distributed

    @staticmethod
    def of(zero_stage: int, fsdp: bool, ctx: Distributed) -> Layout:
        """The strategy a config asks for on ``ctx``'s ranks (one process: "single" whatever it asks)."""
        if not ctx.enabled:
            return Layout("single", ctx)
        return Layout("fsdp" if fsdp else "zero1" if zero_stage == 1 else "ddp", ctx)

    @property
    def shards_parameters(self) -> bool:
        return self.strategy == "fsdp"

    @property
    def shards_optimizer_state(self) -> bool:
        return self.strategy in ("zero1", "fsdp")

    def shard(self, model: GPT, param_dtype: torch.dtype) -> None:
        """FSDP2: shard every transformer block and then the rest (embeddings, final norm, the tied
        LM head) in place, before the optimizer sees the parameters. ``param_dtype`` other than
        float32: FSDP2's mixed precision (parameters gathered and computed in it, gradients
        reduced and master weights kept in float32)."""
        if not self.shards_parameters:
            return
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=None if param_dtype == torch.float32 else param_dtype,
                                      reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the training steps run: DDP around it for ddp and zero1; FSDP2's sharded
        model runs as it is."""
        if self.strategy in ("ddp", "zero1"):
            device = self.ctx.device
            return DDP(model, device_ids=[self.ctx.local_rank] if device.type == "cuda" else None)
        return model

    def gradient_sync(self, train_model: nn.Module, sync: bool):
        """The context of one accumulation micro-step: gradients reduced across the ranks only when
        ``sync`` (the last micro-step); DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``."""
        if self.strategy in ("ddp", "zero1") and not sync:
            return train_model.no_sync()
        if self.shards_parameters:
            train_model.set_requires_gradient_sync(sync)
        return nullcontext()

    def plain_model(self, model: GPT, on_every_rank: bool = False) -> GPT | None:
        """A plain (unsharded) GPT with ``model``'s weights, for work that does not run on every
        rank in step (the probe, samples, zero-shot evaluation): ``model`` itself unless FSDP2
        shards it; then a copy on rank 0, or on every rank with ``on_every_rank`` (None on the
        others), filled one gathered parameter at a time (a collective: every rank calls it), so
        it costs one model and one parameter beyond the shards."""
        if not self.shards_parameters:
            return model
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
        """The whole of ``t`` (a sharded DTensor gathered: every rank calls it)."""
        return t.full_tensor() if self.shards_parameters and hasattr(t, "full_tensor") else t

    def all_finite(self, tensors) -> bool:
        """Whether every element of ``tensors`` on every rank is finite (one host sync)."""
        finite = torch.stack([torch.isfinite(local(t)).all() for t in tensors]).all()
        if self.shards_parameters:
            finite = finite.to(torch.int32)
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        return bool(finite)
