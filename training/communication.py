"""The gradients' communication: what a reduction carries and what it costs, in one place.

* ``Traffic``: the bytes this rank handed collectives, counted here only, by ``count``: within
  the job (the gradient reductions of DDP, ZeRO-1 and FSDP2, compressed or not: ``comm/``) and
  across replica groups (torchft's all-reduces of gradients, pseudo-gradients or weights:
  ``replicas/bytes_allreduced``).
* ``compression_hook``: torch's DDP communication hooks the config names (``comm_hook``: bf16,
  PowerSGD), counting what each bucket really carries.
* ``mean_across_groups``: DDP's hook for replica groups (the job's mean, then torchft's across
  the groups).
* ``Communication``: the ``comm/`` part, the bytes over the run and per token, checkpointed.

The layouts (training/parallel.py) decide which of these a run uses; scripts/comm_model.py
projects the measured bytes onto other links.
"""
from __future__ import annotations

import torch.distributed as dist

from training.parts import Part


def nbytes(tensors) -> int:
    """The bytes of ``tensors`` as they travel: every element in its dtype."""
    return sum(t.numel() * t.element_size() for t in tensors)


class Traffic:
    """The bytes this rank handed collectives so far: ``within`` the job's gradient reductions,
    ``across`` replica groups."""

    def __init__(self):
        self.within = self.across = 0

    def count(self, nbytes: int, across_groups: bool = False) -> None:
        if across_groups:
            self.across += nbytes
        else:
            self.within += nbytes


def compression_hook(layout) -> tuple:
    """(state, hook) of torch's DDP communication hook ``layout.comm_hook`` (``layout``: a
    training/parallel.py layout), counting the bytes it hands the all-reduce:

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
        layout.traffic.count(bucket.buffer().numel() * 2)
        return default_hooks.bf16_compress_hook(group, bucket)

    def power(state, bucket):
        layout.traffic.count(_powersgd_bytes(state, bucket))
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
        return nbytes([buffer])
    elements = 0
    for gradient in bucket.gradients():
        rows = gradient.shape[0] if gradient.ndim > 1 else 0
        if rows and _should_compress(rows, gradient.numel() // rows, state.matrix_approximation_rank,
                                     state.min_compression_rate)[0]:
            elements += (rows + gradient.numel() // rows) * state.matrix_approximation_rank
        else:
            elements += gradient.numel()
    return elements * buffer.element_size()


def mean_across_groups(layout, bucket):
    """DDP's communication hook across replica groups: the dist.GradBucket's mean over this job's
    ranks, then over the groups taking part (``layout.allreduce_across_groups``); a future of it.
    (Not annotated: DDP checks the annotations, which the module's ``from __future__ import
    annotations`` would make strings.)"""
    buffer = bucket.buffer()
    if layout.replicate is not None:
        layout.traffic.count(nbytes([buffer]))
        dist.all_reduce(buffer, group=layout.replicate)
        buffer /= layout.ctx.world_size
    return layout.allreduce_across_groups(buffer)


class Communication(Part):
    """The bytes this rank handed the gradient reductions (``comm/``): over the run, and per token
    of the global batches; in a run of several ranks. Checkpointed, so a resumed run counts on from
    the uninterrupted one's (every rank's count is the same: the whole gradient a reduction)."""

    name = "communication"
    metric_keys = ("comm/",)

    def __init__(self, run):
        self.run = run

    @classmethod
    def build(cls, run) -> Communication | None:
        return cls(run) if run.ctx.enabled else None

    def measure(self, step) -> dict:
        sent = self.run.layout.traffic.within
        return {"comm/gradient_bytes": sent, "comm/gradient_bytes_per_token": sent / self.run.state.tokens}

    def state_dict(self) -> dict:
        return {"gradient_bytes": self.run.layout.traffic.within}

    def load_state_dict(self, state: dict) -> None:
        self.run.layout.traffic.within = state["gradient_bytes"]


