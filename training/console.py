"""The console as a part of a run (training/parts.py): what the run is at the start, a progress
bar, the run-level numbers of every record (per-parameter series go to the metrics log only) with
the max attention logit per layer, and at the end the final numbers and, if asked, a sample. Only
the main rank writes. With a soft-cap on the attention logits (``attn_logit_softcap``) the max
attention logits printed are the raw ones (what QK-Clip and MERIT act on: they may lie above the
cap), labelled so, and the capped ones (what the softmax saw) beside them, as the metrics log has both."""
from __future__ import annotations

import torch
from tqdm import tqdm

from training.instruments import is_layer_key
from training.parts import Part, Step

RUN_LEVEL = ("train/", "val/", "heldout/", "zero_shot/")  # the prefixes of the series a record line shows


class Console(Part):
    def __init__(self, run):
        self.run = run
        self.latest = {}  # the last value of every logged metric, for the final summary
        self.progress = tqdm(disable=True)  # (the run's bar from the start)

    def start(self) -> None:
        run = self.run
        if run.ctx.is_main:
            self.describe()
        self.progress = tqdm(total=run.schedule.total_steps, initial=run.step, disable=not run.ctx.is_main, unit="step",
                             dynamic_ncols=True)

    def describe(self) -> None:
        run, c, m = self.run, self.run.config, self.run.model_config
        lines = [
            f"run folder {run.run_dir}: config.json, metrics.jsonl, checkpoints",
            f"model {c.model}: {m.n_layer} layers, {m.n_head} heads, {m.n_embd} dims, block {m.block_size}, "
            f"vocab {m.vocab_size}, {run.model.num_params() / 1e6:.2f}M parameters",
            f"optimizer {c.optimizer} lr {c.lr}{'' if c.lr_schedule == 'constant' else f' -> {c.min_lr}'} "
            f"({c.lr_schedule}, warmup {run.schedule.warmup_steps}); "
            f"global batch {run.schedule.batch_schedule.phase(run.step).batch} x {m.block_size} tokens = micro "
            f"{c.micro_batch_size} x {run.layout.data_ranks} ranks x {run.schedule.accumulation} accumulation; "
            f"{run.schedule.total_steps} steps "
            f"on {run.device} ({run.layout.strategy})",
            f"optimizer {c.optimizer} hyper-parameters: {run.optimizer_settings}",
            f"optimizer implementation (optim_backend {c.optim_backend!r}):\n{run.optimizer.describe()}"]
        if len(run.schedule.batch_schedule.phases) > 1:
            lines.append("batch schedule: " + ", ".join(f"{p.batch} from step {p.step} ({p.tokens:,} tokens)"
                                                        for p in run.schedule.batch_schedule.phases)
                         + f"; lr x {c.batch_lr_scaling}(B / {run.schedule.batch_schedule.reference})"
                         + (f", {c.batch_half_life_betas} ** (B / {run.schedule.batch_schedule.reference})"
                            if c.batch_half_life_betas else ""))
        for line in lines:
            tqdm.write(line)

    def after_step(self, step: Step) -> None:
        self.progress.update(self.run.step - self.progress.n)  # (a replica group that took a peer's state jumps to it)

    def record(self, metrics: dict) -> None:
        self.latest.update(metrics)
        tqdm.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()
                            if "/" not in k or k.startswith(RUN_LEVEL)))
        max_logits, capped = per_layer(metrics, "max_logit"), per_layer(metrics, "max_logit_capped")
        if max_logits:
            tqdm.write(f"  max attention logit per layer: {self.max_logits_text(max_logits, capped)}")
        if "train/loss" in metrics and max_logits:
            self.progress.set_postfix(loss=f"{metrics['train/loss']:.4f}", max_logit=f"{max(max_logits):.1f}",
                                      **({"max_logit_capped": f"{max(capped):.1f}"} if capped else {}))

    def max_logits_text(self, raw: list[float], capped: list[float]) -> str:
        """The max attention logit of each layer; with a soft-cap (``capped`` not empty) the raw ones,
        so labelled, and the capped ones."""
        raw_text, capped_text = (" ".join(f"{v:.2f}" for v in values) for values in (raw, capped))
        if not capped:
            return raw_text
        return f"raw {raw_text}, capped by attn_logit_softcap={self.run.config.attn_logit_softcap:g}: {capped_text}"

    def finish(self) -> None:
        """The final numbers and a sample (every rank: FSDP2 gathers the model for the sample)."""
        run = self.run
        sampler = run.layout.plain_model(run.evaluated_model()) if run.config.sample_tokens else None
        self.progress.close()
        if not run.ctx.is_main:
            return
        max_logits = self.max_logits_text(*(per_layer(self.latest, stat) for stat in ("max_logit", "max_logit_capped")))
        print(f"finished {run.step} steps ({run.state.tokens:,} tokens): val loss {self.latest['val/loss']:.4f}, "
              f"max attention logit per layer {max_logits}")
        if sampler is not None:
            print(f"sample:\n{self.sample(sampler, run.config.sample_tokens)}")

    def sample(self, model, max_new_tokens: int) -> str:
        run = self.run
        start = torch.tensor([[run.tokenizer.eot_token]], device=run.device)
        generator = torch.Generator(run.device).manual_seed(run.config.seed)
        with run.autocast:
            out = model.generate(start, max_new_tokens, temperature=0.8, top_k=200, generator=generator,
                                 n_vocab=run.tokenizer.n_vocab)
        return run.tokenizer.decode(out[0, 1:].tolist())

    def close(self) -> None:
        self.progress.close()


def per_layer(metrics: dict, stat: str) -> list[float]:
    """The per-layer values of ``stat`` in ``metrics`` (``max_logit/layer_00``, ...), in layer order."""
    return [metrics[k] for k in sorted(metrics) if is_layer_key(k, stat)]
