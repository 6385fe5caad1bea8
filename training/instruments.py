"""The instability instruments a log step records besides the loss (docs/architecture.md, "Instruments").

* ``probe_record``: model.py's probe on the fixed probe batch, as metric keys: the max attention
  logit per layer (``max_logit/layer_03``, the max over heads) and per head
  (``max_logit/layer_03/head_07``), the attention entropy per head and its min over heads
  (``attn_entropy/layer_03[/head_07]``, the collapse signal of Zhai et al. 2023), and the LM head's
  ``output/max_abs_logit`` and ``output/log_z`` (Wortsman et al. 2023's output-logit divergence).
* ``UpdateStatistics``: around one optimizer step, per layer, RMS(update) / RMS(weight) of the
  attention q, k, v and output projections and the MLP's two matrices
  (``update_ratio/layer_03/attn_q``), and the max-norm max |W| of Wq and Wk after the step
  (``weight_max_abs/layer_03/attn_q``): the largest of the row maxima MERIT's trust ratios use.

Keys with one "/" are per layer; a per-head key adds a third component. Both are parts of a run
(training/parts.py), measured at log steps: ``Probe``, and ``OptimizerInstruments`` (the update
statistics with the optimizer's own diagnostics).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import Tensor

from data.loader import TokenLoader
from data.shards import list_shards, open_shard
from model import GPT
from training.parts import Part, Step
from optim.sharding import Shards, local


def layer_key(stat: str, layer: int, part: str | None = None) -> str:
    return f"{stat}/layer_{layer:02d}" + (f"/{part}" if part else "")


def is_layer_key(key: str, stat: str) -> bool:
    """Whether ``key`` is a per-layer ``stat`` key (``max_logit/layer_03``, not a per-head one)."""
    head, _, rest = key.partition("/")
    return head == stat and rest.startswith("layer_") and "/" not in rest


@torch.no_grad()
def probe_record(model: GPT, batch: Tensor, chunk_size: int = 256) -> dict[str, float]:
    """The probe's statistics on ``batch`` as metric keys (one device-to-host copy)."""
    stats = model.probe(batch, chunk_size)
    max_logit, entropy = stats["max_logit"], stats["attn_entropy"]
    n_layer, n_head = max_logit.shape
    capped = []  # with a soft-cap, the maxima the softmax saw (per layer; output)
    if "max_logit_capped" in stats:
        capped.append(stats["max_logit_capped"].amax(1))
    if "max_abs_logit_capped" in stats:
        capped.append(stats["max_abs_logit_capped"].reshape(1))
    values = iter(torch.cat([max_logit.amax(1), max_logit.flatten(), entropy.amin(1), entropy.flatten(),
                             stats["max_abs_logit"].reshape(1), stats["log_z"].reshape(1), *capped]).tolist())
    record = {}
    for stat in ("max_logit", "attn_entropy"):
        record.update({layer_key(stat, i): next(values) for i in range(n_layer)})
        record.update({layer_key(stat, i, f"head_{h:02d}"): next(values) for i in range(n_layer) for h in range(n_head)})
    record["output/max_abs_logit"], record["output/log_z"] = next(values), next(values)
    if "max_logit_capped" in stats:
        record.update({layer_key("max_logit_capped", i): next(values) for i in range(n_layer)})
    if "max_abs_logit_capped" in stats:
        record["output/max_abs_logit_capped"] = next(values)
    return record


class UpdateStatistics:
    """Update and weight sizes of each transformer block's matrices over one optimizer step.

    Generic in the optimizer: it compares the weights before and after the step (so it measures
    what the step really did: decay included, after rounding, zero for a skipped step). The copy of
    the block matrices it takes is why the loop measures on log steps only.
    """

    def __init__(self, model: GPT):
        # (layer, matrix name, weight, rows of the weight that are the matrix)
        self.matrices: list[tuple[int, str, Tensor, slice]] = [
            (i, *matrix) for i, block in enumerate(model.transformer.h) for matrix in block.matrices()]
        self.weights = list({id(w): w for _, _, w, _ in self.matrices}.values())
        # FSDP2 shards the weights by rows: each rank measures its rows, and one all-reduce of the
        # sums (and one of the maxima) completes the statistics, with no weight gathered.
        self.shards = {id(w): Shards.of(w) for w in self.weights}  # (None for whole weights)
        self.sharded = next(iter(self.shards.values()))
        self._before: list[Tensor] = []  # the weights' copy while a step is measured
        self._pending: dict[str, Tensor] = {}

    @torch.no_grad()
    def begin(self) -> None:
        """Measure the optimizer step that follows (FSDP2: on every rank) until ``end``."""
        weights = [local(w.detach()) for w in self.weights]
        self._before = [torch.empty_like(w) for w in weights]
        torch._foreach_copy_(self._before, weights)

    @torch.no_grad()
    def end(self) -> None:
        """The step since ``begin`` is taken: ``pop`` returns its statistics."""
        saved, self._before = {id(w): b for w, b in zip(self.weights, self._before)}, []
        squares, maxima, ratio_keys, max_keys = [], [], [], []
        for layer, matrix, weight, rows in self.matrices:
            local_rows = _local(rows, saved[id(weight)].shape[0], self.shards[id(weight)])
            old, new = saved[id(weight)][local_rows], local(weight.detach())[local_rows]
            squares += [(new - old).square().sum(), old.square().sum()]
            ratio_keys.append(layer_key("update_ratio", layer, matrix))
            if matrix in ("attn_q", "attn_k"):
                maxima.append(new.abs().amax() if new.numel() else new.new_zeros(()))
                max_keys.append(layer_key("weight_max_abs", layer, matrix))
        squares, maxima = torch.stack(squares), torch.stack(maxima)
        if self.sharded is not None:  # (one process group shards every weight)
            self.sharded.all_reduce(squares, dist.ReduceOp.SUM)
            self.sharded.all_reduce(maxima, dist.ReduceOp.MAX)
        # The matrices' RMS share one element count: their ratio is the ratio of the norms.
        self._pending = {**dict(zip(ratio_keys, (squares[0::2] / squares[1::2]).sqrt())), **dict(zip(max_keys, maxima))}

    @contextmanager
    def measured(self):
        """``begin`` and ``end`` around the optimizer step taken inside."""
        self.begin()
        yield
        self.end()

    def pop(self) -> dict[str, float]:
        """The last measured step's statistics as floats (one device-to-host copy); {} if none."""
        pending, self._pending = self._pending, {}
        if not pending:
            return {}
        return dict(zip(pending, torch.stack([v.float() for v in pending.values()]).tolist()))


def _local(rows: slice, local_rows: int, shards: Shards | None) -> slice:
    """The part of this rank's ``local_rows`` rows of a weight (all of them if ``shards`` is None)
    that ``rows`` of the whole weight covers, as a slice of the local rows."""
    first, whole = (0, local_rows) if shards is None else (shards.first_row, shards.rows)
    start, stop, _ = rows.indices(whole)
    return slice(min(max(start - first, 0), local_rows), min(max(stop - first, 0), local_rows))


class OptimizerInstruments(Part):
    """A log step's optimizer step, measured: the optimizer's own diagnostics (optim/: trust
    ratios, clipping, ...) and the update statistics, on the ranks that hold the measured state
    (``Layout.measures_optimizer``)."""

    metric_keys = ("update_ratio/", "weight_max_abs/", "*")  # "*": the diagnostics, "<statistic>/<parameter>"

    def __init__(self, optimizer, statistics: UpdateStatistics, measures: bool):
        self.optimizer, self.statistics, self.measures = optimizer, statistics, measures

    @classmethod
    def build(cls, run) -> OptimizerInstruments:
        return cls(run.optimizer, UpdateStatistics(run.model), run.layout.measures_optimizer())

    def before_update(self, step: Step) -> None:
        if step.log and step.committed and self.measures:  # (a dropped step updates nothing to measure)
            self.optimizer.request_diagnostics()
            self.statistics.begin()

    def after_update(self, step: Step) -> None:
        if step.log and step.committed and self.measures:
            self.statistics.end()

    def measure(self, step: Step) -> dict[str, float]:
        # (every rank: ZeRO-1 gathers the diagnostics from the ranks that own the state)
        return {**self.optimizer.pop_diagnostics(), **self.statistics.pop()}


class SecondMoment(Part):
    """At log steps, the second-moment state of an Adam-style optimizer (``exp_avg_sq``, the shape of
    its parameter, for every parameter stepped): the gradient-variance signal of Li, Zhang and He
    2022, whose extreme values precede a loss spike, to read beside the max attention logit. The
    statistics Megatron-DeepSpeed logs for that paper (``--log-optimizer-states-to-tensorboard``),
    over all parameters: ``second_moment/l1`` (its "variance_l1"), ``/l2``, ``/max`` ("abs_max"),
    and of its square root, Adam's denominator, ``/sqrt_l1``, ``/sqrt_l2``, ``/sqrt_max``; taken
    in float64, each rank's share of a sharded state summed (the maxima: the largest) over the
    ranks. Nothing for an optimizer without such a state (SGD, Lion, Adafactor's factored one)."""

    metric_keys = ("second_moment/",)

    def __init__(self, run):
        self.run = run

    def measure(self, step: Step) -> dict[str, float]:
        if not self.run.layout.measures_optimizer():  # (a replicated state: the main rank's is every rank's)
            return {}
        optimizer = getattr(self.run.optimizer, "optim", self.run.optimizer)  # (ZeRO-1: this rank's share)
        # l1, l2 squared, sqrt l1; the states found, and the states without a whole second moment
        sums = torch.zeros(5, dtype=torch.float64, device=self.run.device)
        largest = torch.zeros(1, dtype=torch.float64, device=self.run.device)
        for p, state in optimizer.state.items():
            v = state.get("exp_avg_sq")
            if v is None or local(v).shape != local(p).shape:
                sums[4] += 1
                continue
            v = local(v).detach().double()
            sums[:4] += torch.stack([v.sum(), (v * v).sum(), v.sqrt().sum(), v.new_ones(())])
            if v.numel():  # (an FSDP2 shard may hold no rows)
                largest = torch.maximum(largest, v.max().reshape(1))
        if self.run.layout.shard is not None:  # (every rank, a share each: in step, whatever its share holds)
            dist.all_reduce(sums, group=self.run.layout.shard)
            dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self.run.layout.shard)
        l1, l2_squared, sqrt_l1, found, without, biggest = torch.cat([sums, largest]).tolist()
        if not found or without:
            return {}
        return {"second_moment/l1": l1, "second_moment/l2": l2_squared ** 0.5, "second_moment/max": biggest,
                "second_moment/sqrt_l1": sqrt_l1, "second_moment/sqrt_l2": l1 ** 0.5,
                "second_moment/sqrt_max": biggest ** 0.5}


class Probe(Part):
    """``probe_record`` of the evaluated model (``run.evaluated_model()``) at log steps, on a fixed
    batch: the first ``probe_batch_size`` sequences of the validation split."""

    metric_keys = ("max_logit/", "attn_entropy/", "output/", "max_logit_capped/")

    def __init__(self, run, batch: Tensor):
        self.run, self.batch = run, batch

    @classmethod
    def build(cls, run) -> Probe:
        config, block = run.config, run.model_config.block_size
        needed = config.probe_batch_size * block + 1
        split_tokens = sum(len(open_shard(path)) for path in list_shards(config.data_dir, "val"))
        if split_tokens < needed:
            raise ValueError(f"probe_batch_size={config.probe_batch_size} needs {needed:,} validation tokens "
                             f"(probe_batch_size x block_size {block} + 1), but the 'val' split of {config.data_dir} "
                             f"has {split_tokens:,}: lower probe_batch_size")
        loader = TokenLoader(config.data_dir, "val", config.probe_batch_size, block, prefetch=False,
                             **run.loader_options)
        return cls(run, loader.next_batch()[0])

    def measure(self, step: Step) -> dict[str, float]:
        model = self.run.layout.plain_model(self.run.evaluated_model())  # (FSDP2: gathered, a collective)
        if not self.run.ctx.is_main:
            return {}
        with self.run.autocast:
            return probe_record(model, self.batch.to(self.run.device))
