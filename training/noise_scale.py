"""The gradient noise scale B_simple = tr(Sigma) / |G|^2, estimated live (McCandlish et al. 2018,
"An Empirical Model of Large-Batch Training", appendix A).

Sigma is the per-token gradient covariance and G the true gradient. A mini-batch of B tokens has
E|G_B|^2 = |G|^2 + tr(Sigma) / B, so squared gradient norms measured at two batch sizes
b < B give unbiased estimates

    |G|^2     = (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) = (|G_b|^2 - |G_B|^2) / (1/b - 1/B).

Training computes both for free: the small batch b is one micro-batch, whose gradient each rank
holds before any all-reduce; the big one B is the global batch, whose gradient every rank holds
after it. A micro-batch gradient is read

* after each accumulation micro-step that is not all-reduced (all of them on one rank, all but the
  last under DDP), as the difference of the accumulated gradient across the micro-step;
* in DDP's communication hook, before the all-reduce, when there is no accumulation.

One rank without accumulation has one batch size only: there is nothing to estimate. The small
norms are averaged over micro-steps and ranks (one all-reduce of a few scalars per log step). Both
estimates are noisy, and |G|^2 can come out negative; B_simple is the ratio of their EMAs over log
steps (the paper's advice), for all parameters and for the attention q/k rows alone.

As a part of a run (training/parts.py) it measures the log steps' gradients, logs its estimates
with them and keeps its EMAs in the checkpoint; it is off where it cannot measure: one rank
without accumulation, and FSDP2, under which no rank holds a whole micro-batch gradient.
"""
import math

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from training import distributed
from training.parts import Part, Step

# A group of parameter slices: (parameter, the rows of it in the group).
Group = list[tuple[Tensor, slice]]


def gpt_groups(model) -> dict[str, Group]:
    """"all" parameters, and "attn_qk": the q and k rows of every block (weights and biases; of
    GPT-2's fused c_attn, Llama's q_proj and k_proj)."""
    qk = [pair for block in model.transformer.h for name, pairs in block.attn.projection_rows().items()
          if name in ("q", "k") for pair in pairs]
    return {"all": [(p, slice(None)) for p in model.parameters()], "attn_qk": qk}


class GradientNoiseScale(Part):
    name = "noise_scale"
    metric_keys = ("noise_scale/",)

    def __init__(self, groups: dict[str, Group], micro_tokens: int, grad_accum: int, world_size: int,
                 ema: float = 0.9):
        self.names = list(groups)
        self.params = list({id(p): p for group in groups.values() for p, _ in group}.values())
        self._slices: dict[int, list[tuple[int, slice]]] = {}  # id(parameter) -> (group index, rows)
        for index, group in enumerate(groups.values()):
            for p, rows in group:
                self._slices.setdefault(id(p), []).append((index, rows))
        self.small_tokens, self.world_size = micro_tokens, world_size
        self.follow(grad_accum)  # (in_comm_hook: where the micro-batch gradient is seen)
        self.ema = ema
        self.measuring = False
        self.ema_grad_sq = [0.0] * len(self.names)
        self.ema_trace = [0.0] * len(self.names)

    @staticmethod
    def possible(grad_accum: int, world_size: int) -> bool:
        return grad_accum * world_size > 1

    # --- as a part of a run ---
    @classmethod
    def build(cls, run) -> "GradientNoiseScale | None":
        world_size = run.ctx.world_size
        accumulations = {run.schedule.batch_schedule.accumulation(phase.step, run.config.micro_batch_size, world_size)
                         for phase in run.schedule.batch_schedule.phases}  # (a batch schedule's phases may differ)
        if not (any(cls.possible(a, world_size) for a in accumulations) and run.layout.measures_gradient_noise):
            return None
        part = cls(gpt_groups(run.model), run.config.micro_batch_size * run.model_config.block_size,
                   run.schedule.accumulation, world_size, run.config.noise_scale_ema)
        part.run, part.hooked = run, world_size > 1 and 1 in accumulations
        return part

    def start(self) -> None:
        if self.hooked:  # a phase without accumulation: read in DDP's communication hook
            self.run.train_model.register_comm_hook(None, self.comm_hook)

    def before_step(self, step: Step) -> None:
        if step.log:
            self.follow(self.run.schedule.accumulation)
            self.measured = self.possible(self.grad_accum, self.world_size)  # (not in a phase of one micro-batch)
            if self.measured:
                self.begin(self.run.scaler.get_scale())  # (1.0 without float16)

    def measure(self, step: Step) -> dict[str, float]:
        return self.estimate(self.run.ctx) if self.measured else {}

    def follow(self, grad_accum: int) -> None:
        """Measure with ``grad_accum`` micro-steps a step (a batch schedule changes them)."""
        self.grad_accum, self.big_tokens = grad_accum, self.small_tokens * grad_accum * self.world_size
        self.in_comm_hook = self.world_size > 1 and grad_accum == 1

    # --- measuring one optimizer step (on every rank) ---
    def begin(self, loss_scale: float = 1.0) -> None:
        """Measure the coming step, whose micro-batch losses are scaled by ``loss_scale`` (float16)
        and divided by the accumulation steps."""
        self.measuring = True
        self._factor = (self.grad_accum / loss_scale) ** 2  # squared norms of a micro-batch's true gradient
        self._small = torch.zeros(len(self.names), dtype=torch.float64, device=self.params[0].device)
        self._small_count = 0
        self._accumulated = None  # the gradient accumulated before the current micro-step

    def after_backward(self, micro_step: int) -> None:
        """After micro-step ``micro_step``'s backward: read its gradient if no all-reduce touched it."""
        if not self.measuring or not (micro_step < self.grad_accum - 1 or self.world_size == 1):
            return
        grads = [p.grad for p in self.params]
        own = grads if self._accumulated is None else torch._foreach_sub(grads, self._accumulated)
        self._add_small(dict(zip(map(id, self.params), own)))
        if micro_step + 1 < self.grad_accum:
            self._accumulated = [g.clone() for g in grads]

    def comm_hook(self, process_group, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's communication hook (``register_comm_hook(None, hook)``): the default all-reduce, after
        reading the bucket's local gradients on a measured step. (DDP checks the annotations, which
        is why this module does not postpone them.)"""
        if self.measuring:
            self._add_small({id(p): g for p, g in zip(bucket.parameters(), bucket.gradients())}, count=False)
        return allreduce_hook(process_group, bucket)

    def after_reduce(self) -> None:
        """After the global gradient is complete (all-reduced, unscaled, not clipped)."""
        if not self.measuring:
            return
        if self.in_comm_hook:
            self._small_count += 1  # the hook saw the micro-batch bucket by bucket
        self._big = self._squared_norms({id(p): p.grad for p in self.params})
        self._accumulated = None
        self.measuring = False

    def _add_small(self, grads: dict[int, Tensor], count: bool = True) -> None:
        self._small += self._squared_norms(grads) * self._factor
        self._small_count += count

    def _squared_norms(self, grads: dict[int, Tensor]) -> Tensor:
        """Per group, the squared norm of the given gradients' slices (float64)."""
        pieces, owners = [], []
        for key, grad in grads.items():
            for index, rows in self._slices.get(key, ()):
                pieces.append(grad[rows])
                owners.append(index)
        sums = torch.zeros(len(self.names), dtype=torch.float64, device=self.params[0].device)
        if pieces:
            norms = torch.stack(torch._foreach_norm(pieces)).double()
            sums.index_add_(0, torch.tensor(owners, device=sums.device), norms.square())
        return sums

    # --- the estimate (at log steps, on every rank) ---
    def estimate(self, ctx: distributed.Distributed) -> dict[str, float]:
        """The measured step's estimates and the updated B_simple, as metric keys. Every rank calls
        it (the small norms are averaged over ranks). A non-finite measurement is left out."""
        small = distributed.all_reduce_mean(self._small / self._small_count, ctx)
        b, B = self.small_tokens, self.big_tokens
        grad_sq = (B * self._big - b * small) / (B - b)
        trace = (small - self._big) / (1 / b - 1 / B)
        grad_sq, trace = torch.stack([grad_sq, trace]).tolist()
        record = {"noise_scale/batch_tokens": B}
        for i, name in enumerate(self.names):
            suffix = "" if name == "all" else f"_{name}"
            if not (math.isfinite(grad_sq[i]) and math.isfinite(trace[i])):
                continue
            self.ema_grad_sq[i] = self.ema * self.ema_grad_sq[i] + (1 - self.ema) * grad_sq[i]
            self.ema_trace[i] = self.ema * self.ema_trace[i] + (1 - self.ema) * trace[i]
            record[f"noise_scale/grad_sq{suffix}"] = grad_sq[i]
            record[f"noise_scale/trace_cov{suffix}"] = trace[i]
            # The EMAs' start-up bias is the same factor in both: it cancels in the ratio.
            if self.ema_grad_sq[i] > 0:
                record[f"noise_scale/b_simple{suffix}"] = self.ema_trace[i] / self.ema_grad_sq[i]
        return record

    def state_dict(self) -> dict:
        return {"ema_grad_sq": list(self.ema_grad_sq), "ema_trace": list(self.ema_trace)}

    def load_state_dict(self, state: dict) -> None:
        self.ema_grad_sq, self.ema_trace = list(state["ema_grad_sq"]), list(state["ema_trace"])
