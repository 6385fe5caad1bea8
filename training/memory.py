"""Memory per rank: what the model, its gradients, the optimizer state and the activations take,
against the measured peak (docs/scaling_out.md).

The first three are counted from the tensors this rank holds (its shards under FSDP2, its
partition's state under ZeRO-1; DDP's all-reduce buckets are a second copy of the gradients).
Activations are an estimate, after Korthikanti et al. (2022, "Reducing activation recomputation
in large transformer models", activations without recomputation): per layer ``s*b*h*(34 + 5*a*s/h)`` bytes at 16-bit
precision, scaled to the compute dtype, with the ``5*a*s/h`` attention-matrix term dropped where
SDPA's fused kernels never store it (CUDA), plus the LM head's logits and their gradient in
float32. The peak is CUDA's ``max_memory_allocated`` or, on CPU, the process's peak RSS (which
includes the Python runtime and torch itself, and memory the allocator keeps after freeing it),
both measured from the end of setup (``reset_peak``).

As a part of a run (``Memory``, training/parts.py) it is logged at every log step and printed
after the first step of each invocation, when the optimizer state exists: each number the largest
over the ranks, the first to run out.
"""
from __future__ import annotations

import resource
import sys

import torch
from torch import nn
from tqdm import tqdm

from optim.sharding import local
from training import distributed
from training.parts import Part, Step

MIB = 2 ** 20


def tensor_bytes(tensors) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor's local shard)."""
    return sum(local(t).numel() * t.element_size() for t in tensors)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """This rank's optimizer state (ZeRO-1: its partition's; FSDP2: its rows')."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's optimizer of this rank
    return tensor_bytes(t for state in inner.state.values() for t in state.values() if isinstance(t, torch.Tensor))


def activation_bytes(n_layer: int, n_head: int, n_embd: int, vocab_size: int, micro_batch: int, block: int,
                     compute_dtype: torch.dtype, fused_attention: bool) -> int:
    s, b, h, a = block, micro_batch, n_embd, n_head
    per_layer = s * b * h * 34 + (0 if fused_attention else 5 * a * s * s * b)
    scale = torch.finfo(compute_dtype).bits / 16
    return int(n_layer * per_layer * scale) + 2 * b * s * vocab_size * 4


def reset_peak(device: torch.device) -> None:
    """Start measuring the peak afresh (after setup: building the whole model before FSDP2 shards
    it is not training's memory). On Linux the kernel resets the process's peak RSS (VmHWM) when
    "5" is written to /proc/self/clear_refs; elsewhere on a CPU the peak is the process's."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/status") as f:  # Linux: VmHWM, the peak RSS since the last reset
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def report(model: nn.Module, optimizer: torch.optim.Optimizer, *, gradient_copies: int, micro_batch: int,
           compute_dtype: torch.dtype, device: torch.device) -> dict[str, float]:
    """This rank's memory as metrics (MiB): ``memory/params``, ``memory/grads``,
    ``memory/optimizer_state``, ``memory/activations_estimate``, ``memory/peak``.
    ``gradient_copies``: 2 where DDP's buckets hold a second copy of the gradients
    (``Layout.gradient_copies``)."""
    config = model.config
    params = tensor_bytes(model.parameters())
    grads = params * gradient_copies
    activations = activation_bytes(config.n_layer, config.n_head, config.n_embd, config.vocab_size, micro_batch,
                                   config.block_size, compute_dtype,
                                   # (a soft-capped attention keeps its T x T weights: SDPA cannot cap)
                                   fused_attention=device.type == "cuda" and config.attn_logit_softcap is None)
    values = {"params": params, "grads": grads, "optimizer_state": optimizer_state_bytes(optimizer),
              "activations_estimate": activations, "peak": peak_bytes(device)}
    return {f"memory/{key}": value / MIB for key, value in values.items()}


class Memory(Part):
    metric_keys = ("memory/",)

    def __init__(self, run):
        self.run = run
        self.print_due = False

    def start(self) -> None:
        reset_peak(self.run.device)  # the reported peak is training's, from here on
        self.print_due = True

    def after_step(self, step: Step) -> None:
        if self.print_due:  # the optimizer state exists from the first step on
            self.print_due = False
            largest = self.measure(step)
            if self.run.ctx.is_main:
                sizes = ", ".join(f"{key.removeprefix('memory/')} {value:.1f}" for key, value in largest.items())
                tqdm.write(f"memory per rank ({self.run.layout.strategy}, the largest of {self.run.ctx.world_size}, "
                           f"MiB): {sizes}")

    def measure(self, step: Step) -> dict[str, float]:
        """This rank's ``report``, each number the largest over the ranks (every rank calls it)."""
        run = self.run
        mine = report(run.model, run.optimizer, gradient_copies=run.layout.gradient_copies,
                      micro_batch=run.config.micro_batch_size, compute_dtype=run.dtype, device=run.device)
        ranks = distributed.all_gather_objects(mine, run.ctx)
        return {key: max(rank[key] for rank in ranks) for key in mine}
