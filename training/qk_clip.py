"""QK-Clip (Kimi K2, 2025): the largest attention logit capped in weight space after each step
(docs/optimizers.md, "QK-Clip").

During the step's training forwards every attention layer hands each head's largest causal
pre-softmax logit q.k * scale to a hook (model.py, ``register_logit_max_hook``); S_max is its maximum
over the step's micro-batches and the ranks (a MAX all-reduce). After the optimizer step, each head
with S_max > tau has its query and key rows (of GPT-2's fused ``c_attn`` or Llama's ``q_proj`` and
``k_proj``, weights and biases) scaled by sqrt(tau / S_max), so that logit would have been tau; every
other weight is untouched. Llama's rotary positions rotate each (q, k) pair, which commutes with the
scaling: its post-rotary logits scale by tau / S_max too. It acts on
the weights, so it composes with every optimizer and layout: under FSDP2 each rank scales the
rows it holds. All of it stays on the device: no host sync.

As a part of a run (training/parts.py, on when ``qk_clip_tau`` is set) it measures from
``before_step`` to ``after_reduce`` (the training passes; an optimizer's extra pass is not
measured), clips in ``after_step`` and logs its statistics at log steps.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
from torch import Tensor
from tqdm import tqdm

from model import GPT
from optim.sharding import Shards, local
from training import distributed
from training.distributed import Distributed
from training.instruments import layer_key
from training.parts import Part, Step


class QKClip(Part):
    metric_keys = ("qk_clip/",)

    def __init__(self, model: GPT, tau: float, ctx: Distributed):
        self.tau, self.ctx = tau, ctx
        self.attentions = [block.attn for block in model.transformer.h]
        self.n_head, self.head_dim = model.config.n_head, model.config.n_embd // model.config.n_head
        self.max_logits: Tensor | None = None  # (n_layer, n_head): the last measured step's S_max
        self._running: list[Tensor] = []  # per layer, while measuring: each head's largest logit so far
        self._handles = []
        self._record: dict[str, Tensor] = {}

    @classmethod
    def build(cls, run) -> QKClip | None:
        # (configs/__init__.py refuses qk_clip_tau with QK-Norm, whose normalisation undoes the clip)
        return cls(run.model, run.config.qk_clip_tau, run.ctx) if run.config.qk_clip_tau is not None else None

    def start(self) -> None:
        if self.ctx.is_main:
            tqdm.write(f"QK-Clip: after every step, each head's largest attention logit on the step's batch capped at "
                  f"{self.tau:g}")

    def before_step(self, step: Step | None = None) -> None:
        """Measure from here: every layer's hook keeps each head's largest logit."""
        device = self.attentions[0].out_proj.weight.device
        self._running = [torch.full((self.n_head,), float("-inf"), device=device) for _ in self.attentions]
        self._handles = [attention.register_logit_max_hook(partial(self._keep_larger, layer))
                         for layer, attention in enumerate(self.attentions)]

    def _keep_larger(self, layer: int, maxima: Tensor) -> None:
        self._running[layer] = torch.maximum(self._running[layer], maxima)

    def after_reduce(self) -> None:
        """Stop measuring: ``max_logits`` holds this rank's maxima over the passes since ``before_step``."""
        self.max_logits = torch.stack(self._running)
        self.close()

    @contextmanager
    def measuring(self):
        """``before_step`` and ``after_reduce`` around a block of forward and backward passes."""
        self.before_step()
        try:
            yield
        except BaseException:
            self.close()
            raise
        self.after_reduce()

    def after_step(self, step: Step) -> None:
        self.apply(step.finite, record=step.log)

    def measure(self, step: Step) -> dict[str, float]:
        return self.pop()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @torch.no_grad()
    def apply(self, kept: Tensor, record: bool = False) -> None:
        """Scale the query and key rows of every head whose S_max (over the ranks too) exceeded tau,
        after a kept step (``kept``: a 0-d bool tensor; a dropped step changed no weight, and its
        logits may not be finite). ``record``: keep this step's statistics for ``pop``."""
        maxima = distributed.all_reduce_max(self.max_logits, self.ctx)
        clipped = kept & maxima.isfinite() & (maxima > self.tau)
        factors = torch.where(clipped, (self.tau / maxima).sqrt(), torch.ones_like(maxima))
        for attention, layer_factors in zip(self.attentions, factors):
            per_row = layer_factors.repeat_interleave(self.head_dim)
            row_factors = {}  # id(tensor) -> (tensor, a factor per row: the q and k rows', else 1)
            for name in ("q", "k"):
                for tensor, rows in attention.projection_rows()[name]:
                    if id(tensor) not in row_factors:  # (GPT-2's fused c_attn holds both q and k)
                        row_factors[id(tensor)] = (tensor, per_row.new_ones(tensor.shape[0]))
                    row_factors[id(tensor)][1][rows] = per_row
            for tensor, whole in row_factors.values():
                part = local(tensor)
                part.mul_(whole[_local_rows(tensor)].view(-1, *([1] * (part.ndim - 1))).to(part.dtype))
        if record:
            self._record = {"heads_clipped": clipped.sum(dim=1), "min_factor": factors.amin(dim=1),
                            "max_logit": maxima.amax(dim=1)}

    def pop(self) -> dict[str, float]:
        """The recorded step's statistics per layer (one device-to-host copy): ``qk_clip/heads_clipped``,
        ``qk_clip/min_factor`` (1: none clipped) and ``qk_clip/max_logit`` (the training batch's
        S_max before the clip); {} if none was recorded."""
        record, self._record = self._record, {}
        if not record:
            return {}
        values = torch.stack([v.float() for v in record.values()]).tolist()
        return {layer_key(f"qk_clip/{stat}", layer): value
                for stat, per_layer in zip(record, values) for layer, value in enumerate(per_layer)}



def _local_rows(tensor: Tensor) -> slice:
    """The rows of the whole ``tensor`` this rank holds (FSDP2 shards on dim 0; all of them else)."""
    shards = Shards.of(tensor)
    if shards is None:
        return slice(0, tensor.shape[0])
    first = shards.first_row
    return slice(first, first + local(tensor).shape[0])
