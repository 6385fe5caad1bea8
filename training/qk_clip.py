"""QK-Clip (Kimi K2, 2025): the largest attention logit capped in weight space after each step
(docs/optimizers.md, "QK-Clip").

During the step's training forwards every attention layer hands each head's largest causal
pre-softmax logit q.k * scale to a hook (model.py, ``register_logit_max_hook``); S_max is its maximum
over the step's micro-batches and the ranks (a MAX all-reduce). After the optimizer step, each head
with S_max > tau has its query and key rows of ``c_attn`` (weights and biases) scaled by
sqrt(tau / S_max), so that logit would have been tau; every other weight is untouched. It acts on
the weights, so it composes with every optimizer and layout: under FSDP2 each rank scales the
rows it holds. All of it stays on the device: no host sync.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
from torch import Tensor

from model import GPT
from optim.sharding import Shards, local
from training import distributed
from training.distributed import Distributed
from training.instruments import layer_key


class QKClip:
    def __init__(self, model: GPT, tau: float, ctx: Distributed):
        if model.config.qk_norm is not None:  # (a config says why: configs/__init__.py, qk_clip_tau)
            raise ValueError("QK-Clip scales W_q and W_k, which QK-Norm's normalisation undoes")
        self.tau, self.ctx = tau, ctx
        self.attentions = [block.attn for block in model.transformer.h]
        self.n_embd, self.n_head = model.config.n_embd, model.config.n_head
        self.max_logits: Tensor | None = None  # (n_layer, n_head): the last measured step's S_max
        self._record: dict[str, Tensor] = {}

    @contextmanager
    def measuring(self):
        """Around a step's training forwards and backwards: every layer's hook keeps each head's
        largest logit over them; ``max_logits`` holds the maxima afterwards (this rank's)."""
        device = self.attentions[0].c_attn.weight.device
        running = [torch.full((self.n_head,), float("-inf"), device=device) for _ in self.attentions]

        def keep_larger(layer: int, maxima: Tensor) -> None:
            running[layer] = torch.maximum(running[layer], maxima)

        handles = [attention.register_logit_max_hook(partial(keep_larger, layer))
                   for layer, attention in enumerate(self.attentions)]
        try:
            yield
            self.max_logits = torch.stack(running)
        finally:
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def apply(self, kept: Tensor, record: bool = False) -> None:
        """Scale the query and key rows of every head whose S_max (over the ranks too) exceeded tau,
        after a kept step (``kept``: a 0-d bool tensor; a dropped step changed no weight, and its
        logits may not be finite). ``record``: keep this step's statistics for ``pop``."""
        maxima = distributed.all_reduce_max(self.max_logits, self.ctx)
        clipped = kept & maxima.isfinite() & (maxima > self.tau)
        factors = torch.where(clipped, (self.tau / maxima).sqrt(), torch.ones_like(maxima))
        head_dim = self.n_embd // self.n_head
        for attention, layer_factors in zip(self.attentions, factors):
            per_row = layer_factors.repeat_interleave(head_dim)
            rows = torch.cat([per_row, per_row, torch.ones_like(per_row)])  # q, k, v (v untouched)
            for tensor in (attention.c_attn.weight, attention.c_attn.bias):
                if tensor is not None:
                    scaled = rows[_local_rows(tensor)]
                    part = local(tensor)
                    part.mul_(scaled.view(-1, *([1] * (part.ndim - 1))).to(part.dtype))
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
