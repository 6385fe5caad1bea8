"""Train a GPT-2 with the optimizer a config file names.

    python train.py configs/default.py                    # one process (CPU or one GPU)
    torchrun --nproc_per_node=8 train.py configs/X.py     # DDP: NCCL on GPUs, gloo on CPUs
    torchrun ... train.py configs/X.py --zero_stage=1     # optimizer state sharded (ZeRO-1), or --fsdp (FSDP2)
    python train.py configs/X.py --lr=3e-4 --resume       # overrides are Python literals

The config gives the GLOBAL batch; gradient accumulation follows from the micro-batch and the
number of ranks, so the same config optimizes identically on 1 or 64 GPUs.
"""

from __future__ import annotations

import math
import signal
import sys
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch.profiler import record_function
from tqdm import tqdm

import optim
from configs import TrainConfig, key_reference, load_config, save_config
from data.loader import ShardTokenError, TokenLoader
from data.shards import verify_manifest
from data.tokenizer import get_tokenizer
from model import GPT
from optim.protocol import LossFn
from training import distributed, memory, run_folder
from training.checkpoint import load_latest
from training.instruments import UpdateStatistics, is_layer_key, probe_record
from training.metrics import MetricsLogger, peak_bf16_flops
from training.noise_scale import GradientNoiseScale, gpt_groups
from training.nonfinite import NonFiniteError, NonFiniteSteps, recovery_advice
from training.parallel import Layout
from training.qk_clip import QKClip
from training.run_config import RunConfig, resolve_config
from training.schedule import learning_rate
from training.state import LossWindow, RankRNG, RunState

# The parts of a training step (Trainer.phase). Gradient reduction runs inside "backward" (DDP's
# and FSDP2's hooks).
PHASES = ("data", "forward", "backward", "clip", "optimizer", "qk_clip", "extra_pass", "instruments")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if use_bf16 else torch.float32
    return getattr(torch, name)


def peak_flops(config: TrainConfig, device: torch.device) -> float | None:
    if config.peak_flops is not None or device.type != "cuda":
        return config.peak_flops
    return peak_bf16_flops(torch.cuda.get_device_name(device))


class Trainer:
    """The training loop of one run, from its resolved config (training/run_config.py)."""

    def __init__(self, run: RunConfig):
        # The resolved config is what the run trains with and records (config.json, checkpoints, wandb).
        self.config = config = run.config
        self.optimizer_settings = run.optimizer_settings
        self.ctx = distributed.setup(config.device)
        self.device = self.ctx.device
        self.layout = Layout.of(config.zero_stage, config.fsdp, self.ctx)
        self.run_dir = Path(config.out_dir) / config.run_name
        # Every input is checked before anything is written: the run folder is locked last (end of
        # __init__) and prepared in train().
        folder_seen = run_folder.fingerprint(self.run_dir)
        self.resuming, self.stale_files = run_folder.claim(self.run_dir, config.resume, config.overwrite)
        verify_manifest(config.data_dir, config.tokenizer)
        if config.zero_shot_tasks:
            from eval.tasks import check_zero_shot  # (the evaluator only for runs that evaluate)
            check_zero_shot(config.zero_shot_tasks, config.zero_shot_data_dir, config.zero_shot_limit, fetch=True)
        self.grad_accum = config.grad_accum_steps(self.ctx.world_size)

        self.dtype = dtype = resolve_dtype(config.dtype, self.device)
        self.autocast = (torch.autocast(self.device.type, dtype=dtype) if dtype != torch.float32 else nullcontext())
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=dtype == torch.float16)

        self.tokenizer = get_tokenizer(config.tokenizer)
        torch.manual_seed(config.seed)  # identical initial weights on every rank
        self.model_config = config.model_config(self.tokenizer.n_vocab)
        self.model = GPT(self.model_config).to(self.device)
        self.layout.shard(self.model, dtype)  # FSDP2: in place, before the optimizer sees the parameters
        try:
            self.optimizer = optim.build(
                config.optimizer, self.model, **run.optimizer_kwargs, decay_embeddings=config.decay_embeddings,
                batch_tokens=config.batch_size * self.model_config.block_size, backend=config.optim_backend,
                zero_redundancy=self.layout.zero_redundancy)
        except ValueError as error:  # a hyper-parameter out of its range: say which key sets it
            settings = ", ".join(f"{key} {value}" for key, value in run.optimizer_kwargs.items())
            raise ValueError(f"optimizer={config.optimizer!r} refuses its settings ({settings}): {error}; betas are "
                             f"set by beta1 and beta2, lr, weight_decay and eps by their keys, the others in "
                             f"optimizer_options") from error
        # QK-Clip (training/qk_clip.py): off unless qk_clip_tau is set.
        self.qk_clip = QKClip(self.model, config.qk_clip_tau, self.ctx) if config.qk_clip_tau is not None else None
        torch.manual_seed(config.seed + self.ctx.rank)  # each rank its own dropout noise
        # The instruments measured at log steps besides the probe (training/instruments.py, noise_scale.py).
        self.update_statistics = UpdateStatistics(self.model)
        # (Not under FSDP2: a rank never holds a whole micro-batch gradient there.)
        self.noise_scale = (GradientNoiseScale(gpt_groups(self.model), config.micro_batch_size * self.model_config.block_size,
                                               self.grad_accum, self.ctx.world_size, config.noise_scale_ema)
                            if GradientNoiseScale.possible(self.grad_accum, self.ctx.world_size)
                            and self.layout.holds_whole_gradients else None)

        block = self.model_config.block_size
        # Every loader checks the shards' tokens against the tokenizer and cuts its sequences alike.
        loader_options = dict(align_documents=config.align_documents, eot_token=self.tokenizer.eot_token,
                              vocab_size=self.tokenizer.n_vocab)
        self.train_loader = TokenLoader(config.data_dir, "train", config.micro_batch_size, block, rank=self.ctx.rank,
                                        world_size=self.ctx.world_size, seed=config.data_seed, **loader_options)
        self.val_loader = TokenLoader(config.data_dir, "val", config.micro_batch_size, block, rank=self.ctx.rank,
                                      world_size=self.ctx.world_size, **loader_options)
        tokens_per_val_step = config.micro_batch_size * block * self.ctx.world_size
        self.val_steps = max(1, config.val_tokens // tokens_per_val_step)
        self.heldout_steps = config.heldout_tokens // tokens_per_val_step
        needed = (self.val_steps + self.heldout_steps) * tokens_per_val_step + 1
        if self.heldout_steps and self.val_loader.split_tokens < needed:
            raise ValueError(f"heldout_tokens={config.heldout_tokens:,} after val_tokens={config.val_tokens:,} needs "
                             f"{needed:,} validation tokens, but the 'val' split of {config.data_dir} has "
                             f"{self.val_loader.split_tokens:,}: lower heldout_tokens or val_tokens")
        # A fixed batch for the probe (attention logits and entropies): the first validation sequences.
        probe_tokens = config.probe_batch_size * block + 1
        if self.val_loader.split_tokens < probe_tokens:
            raise ValueError(f"probe_batch_size={config.probe_batch_size} needs {probe_tokens:,} validation tokens "
                             f"(probe_batch_size x block_size {block} + 1), but the 'val' split of {config.data_dir} "
                             f"has {self.val_loader.split_tokens:,}: lower probe_batch_size")
        self.probe_batch = TokenLoader(config.data_dir, "val", config.probe_batch_size, block, prefetch=False,
                                       **loader_options).next_batch()[0]
        self.total_steps, self.warmup_steps = config.steps(block)
        self.tokens_per_step = config.batch_size * block
        self.peak_flops = peak_flops(config, self.device)

        self.latest = {}  # the last value of every logged metric, for the final summary
        self.loss_window = LossWindow(self.ctx)  # the train loss since the last log step
        self.nonfinite = NonFiniteSteps(config.nonfinite, config.max_skipped_steps, self.device)
        # Everything a checkpoint holds (training/state.py); the layout saves and loads it.
        self.state = RunState(self.model, self.optimizer, config=config.to_dict(), tokens_per_step=self.tokens_per_step,
                              scaler=self.scaler, train_loader=self.train_loader, train_window=self.loss_window,
                              noise_scale=self.noise_scale, rng=RankRNG(self.ctx))
        self.last_checkpoint_step = None
        self.checkpoint_steps = []  # of this invocation's checkpoints (and the resumed one), oldest first
        if self.resuming:
            self.restore()
            if self.step > self.total_steps:
                raise ValueError(f"the checkpoint in {self.run_dir} is at step {self.step}, past this config's "
                                 f"{self.total_steps} steps: raise max_steps (or max_tokens) to continue the run")
            if 0 < config.stop_at_step <= self.step:
                raise ValueError(f"stop_at_step={config.stop_at_step} is not past the checkpoint's step {self.step}: "
                                 f"nothing would train; raise stop_at_step or leave it out")
        # Compile and wrap after restoring, so checkpoints always hold the plain module's names.
        self.train_model = self.layout.wrap(torch.compile(self.model) if config.compile else self.model)
        if self.noise_scale and self.noise_scale.in_comm_hook:
            self.train_model.register_comm_hook(None, self.noise_scale.comm_hook)
        # Each part of a step (PHASES) runs in ``with self.phase(name)``: a torch.profiler range, so a
        # trace shows the parts; scripts/bench_train puts a timer here instead.
        self.phase = record_function
        self.stop_signal = None  # the name of a signal that asked the run to save and stop
        # (Restored by close(): a Trainer run inside another program leaves its handlers as they were.)
        self.saved_handlers = {sig: signal.signal(sig, handler) for sig, handler in
                               ((signal.SIGTERM, self._on_sigterm), (signal.SIGINT, self._on_sigint))}
        self.run_lock = run_folder.lock(self.run_dir, folder_seen, self.ctx)
        memory.reset_peak(self.device)  # the reported peak is training's, from here on

    @property
    def step(self) -> int:
        """Optimizer steps taken (``self.state`` counts them)."""
        return self.state.step

    # --- the loop ---
    def train(self):
        config, ctx = self.config, self.ctx
        if self.step == self.total_steps:
            if ctx.is_main:
                print(f"the run in {self.run_dir} already finished its {self.total_steps} steps: nothing to do "
                      f"(raise max_steps to train on)")
            return
        if ctx.is_main:
            run_folder.prepare(self.run_dir, self.stale_files)
            save_config(config, self.run_dir / "config.json")
            self.metrics = MetricsLogger(self.run_dir, config.to_dict(), wandb_mode=config.wandb_mode,
                                         project=config.wandb_project, entity=config.wandb_entity,
                                         group=config.wandb_group, resume_step=self.step if self.resuming else None)
            self.describe()
            self.metrics.log_run_info({"optim_backend": config.optim_backend, **self.optimizer.backends()})
        progress = tqdm(total=self.total_steps, initial=self.step, disable=not ctx.is_main, unit="step",
                        dynamic_ncols=True)
        interval_start, interval_steps = time.perf_counter(), 0
        last_step = min(self.total_steps, config.stop_at_step or self.total_steps)
        first_step = self.step
        if self.step == 0:
            self.log(self.validation())  # the starting point of the loss curve
        while self.step < last_step:
            log_step = (self.step + 1) % config.log_interval == 0 or self.step + 1 == self.total_steps
            loss, finite = self.train_step(log_step)
            self.loss_window.add(loss, finite)
            self.state.step += 1  # a skipped step counts: its batch is consumed and the schedule moves on
            interval_steps += 1
            self.after_step(finite, log_step)  # QK-Clip, an optimizer's extra pass (Sophia-G's Hessian)
            progress.update()
            if self.step == first_step + 1:  # the optimizer state exists from the first step on
                report = self.memory_report()
                if ctx.is_main:
                    tqdm.write(f"memory per rank ({self.layout.strategy}, the largest of {ctx.world_size}, MiB): "
                               + ", ".join(f"{key.removeprefix('memory/')} {value:.1f}" for key, value in report.items()))
            final = self.step == self.total_steps
            if log_step:
                elapsed = self._synchronize_time(interval_start)
                with self.phase("instruments"):
                    self.log_train(self.loss_window.pop_mean(), interval_steps, elapsed, progress)
                interval_start, interval_steps = time.perf_counter(), 0
            if self.step % config.eval_interval == 0 or final:
                self.log(self.validation())
            # Ranks agree on a SIGTERM at log steps only: the agreement is a host sync.
            stop = log_step and distributed.any_rank(self.stop_signal is not None, ctx)
            interval = config.checkpoint_interval and self.step % config.checkpoint_interval == 0
            if self.step == last_step or stop or interval:
                self.save_checkpoint()
            if config.zero_shot_tasks and (final or config.zero_shot_interval
                                           and self.step % config.zero_shot_interval == 0):
                self.zero_shot()
            if stop:
                tqdm.write(f"rank {ctx.rank}: {self.stop_signal or 'SIGTERM'} received, saved step {self.step}, exiting")
                break
        progress.close()
        if self.step == self.total_steps:
            self.summarize()
        if ctx.is_main:
            self.metrics.close()

    def train_step(self, log_step: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over the global batch. Returns the mean loss and whether the gradient
        was finite (0-d tensors: no host sync; nonfinite="skip" drops a non-finite update on the
        device, "stop" raises at the next check).
        log_step: measure this step (noise scale on every rank; the optimizer's diagnostics and the
        update statistics on the main rank), for log_train to read."""
        lr = learning_rate(self.step, total=self.total_steps, warmup=self.warmup_steps, lr=self.config.lr,
                           min_lr=self.config.min_lr, schedule=self.config.lr_schedule,
                           decay_fraction=self.config.decay_fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        z_loss = self.config.z_loss
        with self.qk_clip.measuring() if self.qk_clip else nullcontext():  # (the logits QK-Clip caps)
            total_loss = self.forward_backward(lambda model, x, y, offset: model(x, y, z_loss=z_loss, logits=False)[1],
                                               measure=log_step and self.noise_scale is not None)
        # (FSDP2: the norm of the sharded gradient, a replicated DTensor; made a plain tensor.)
        with self.phase("clip"):
            self.grad_norm = self.layout.full_tensor(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip or math.inf))
        # The norm of the all-reduced gradient: the same verdict on every rank. With float16 an
        # overflowed gradient is the GradScaler's to skip; only a non-finite loss counts then.
        finite = total_loss.isfinite() if self.scaler.is_enabled() else self.grad_norm.isfinite()
        self.nonfinite.record(self.step + 1, finite)
        diagnose = log_step and self.layout.measures_optimizer()
        if diagnose:
            self.optimizer.request_diagnostics()
        with self.phase("optimizer"), self.update_statistics.measured() if diagnose else nullcontext():
            if self.config.nonfinite == "skip" and not self.scaler.is_enabled():
                self.optimizer.step_unless(~finite)  # on the device: no host sync
            else:
                self.scaler.step(self.optimizer)  # (float16: the scaler drops an overflowed step itself)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        return total_loss, finite

    def after_step(self, finite: torch.Tensor, log_step: bool = False) -> None:
        """What acts after an optimizer step, before anything reads the weights: weight interventions
        (QK-Clip caps each head's attention logit on this step's batch), then an optimizer's extra
        pass, a forward and backward of its own (Sophia-G's Hessian estimate, every 10 steps)."""
        if self.qk_clip:
            with self.phase("qk_clip"):
                self.qk_clip.apply(finite, record=log_step)
        if self.optimizer.extra_pass_due(self.step):
            with self.phase("extra_pass"):
                self.optimizer.extra_pass(self.gradients, self.config.seed)

    def check_finite(self):
        """Apply the non-finite policy where the loop syncs anyway (log steps, checkpoints): "stop"
        raises at the first non-finite gradient, before anything is saved; "skip" reports the
        skipped steps and stops after max_skipped_steps in a row. Never save parameters that are
        not finite (whatever made them so)."""
        skipped = self.nonfinite.check(self._recovery_advice)
        if skipped and self.ctx.is_main:
            tqdm.write(skipped)
        if not self.layout.all_finite(p.detach() for p in self.model.parameters()):
            raise NonFiniteError(f"the parameters are not finite at step {self.step}: stopping without saving. "
                                 f"{self._recovery_advice(self.nonfinite.first.item())}")

    def _recovery_advice(self, first_nonfinite: int = -1) -> str:
        return recovery_advice(self.run_dir, self.last_checkpoint_step, self.checkpoint_steps, first_nonfinite)

    def forward_backward(self, loss_fn: LossFn, measure: bool = False) -> torch.Tensor:
        """Accumulate the gradient of loss_fn(model, x, y, stream offset of x) over the global
        batch's micro-batches, unscaled and all-reduced; returns the mean loss.
        measure: read the gradient noise scale's norms on the way."""
        if measure:
            self.noise_scale.begin(self.scaler.get_scale())  # (1.0 without float16)
        total_loss = torch.zeros((), device=self.device)
        for micro_step in range(self.grad_accum):
            with self.phase("data"):
                offset = self.train_loader.next_offset
                x, y = (t.to(self.device, non_blocking=True) for t in self.train_loader.next_batch())
            # Gradients are reduced across the ranks only on the last micro-step.
            last = micro_step == self.grad_accum - 1
            with self.phase("forward"), self.layout.gradient_sync(self.train_model, last), self.autocast:
                loss = loss_fn(self.train_model, x, y, offset) / self.grad_accum
            with self.phase("backward"):
                self.scaler.scale(loss).backward()
            total_loss += loss.detach()
            if measure:
                self.noise_scale.after_backward(micro_step)
        self.scaler.unscale_(self.optimizer)
        if measure:
            self.noise_scale.after_reduce()
        return total_loss

    @contextmanager
    def gradients(self, loss_fn: LossFn):
        """An ``optim.GradientFn``: inside, the gradient of loss_fn over the next global batch (for
        an optimizer's extra pass); yields the model's parameters."""
        self.forward_backward(loss_fn)
        yield list(self.model.parameters())
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    # --- measurements ---
    def log_train(self, mean_loss: torch.Tensor, steps: int, elapsed: float, progress):
        self.check_finite()  # at a log step the loop syncs anyway
        loss = distributed.all_reduce_mean(mean_loss, self.ctx).item()
        noise_scale = self.noise_scale.estimate(self.ctx) if self.noise_scale else {}
        diagnostics = self.optimizer.pop_diagnostics()  # (ZeRO-1: gathered from the ranks that own the state)
        update_statistics = self.update_statistics.pop()
        qk_clip = self.qk_clip.pop() if self.qk_clip else {}
        probe_model = self.layout.plain_model(self.model)  # (FSDP2: gathered, a collective)
        memory_report = self.memory_report()
        if not self.ctx.is_main:
            return
        tokens_per_s = steps * self.tokens_per_step / elapsed
        record = {"train/loss": loss, "lr": self.optimizer.param_groups[0]["lr"],
                  "grad_norm": self.grad_norm.item(), "tokens_per_s": tokens_per_s}
        if self.config.nonfinite == "skip":
            record["skipped_steps"] = self.nonfinite.skipped
        record.update(diagnostics)
        record.update(update_statistics)
        record.update(qk_clip)
        record.update(noise_scale)
        record.update(memory_report)
        if self.peak_flops:
            per_device = tokens_per_s / self.ctx.world_size
            record["mfu"] = self.model.estimate_mfu(per_device, self.peak_flops)
        with self.autocast:
            probed = probe_record(probe_model, self.probe_batch.to(self.device))
        record.update(probed)
        progress.set_postfix(loss=f"{loss:.4f}", max_logit=f"{max(v for k, v in probed.items() if is_layer_key(k, 'max_logit')):.1f}")
        self.log(record)

    def validation(self) -> dict[str, float]:
        """``val/loss`` on the first val_tokens of the val split, and ``heldout/loss`` on the
        heldout_tokens after them where there are any."""
        self.val_loader.reset()
        losses = {"val/loss": self.mean_loss(self.val_steps)}
        if self.heldout_steps:
            losses["heldout/loss"] = self.mean_loss(self.heldout_steps)  # (the loader goes on where val ended)
        return losses

    @torch.no_grad()
    def mean_loss(self, steps: int) -> float:
        """The mean loss of the model over the val loader's next ``steps`` global micro-batches."""
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for _ in range(steps):
            x, y = (t.to(self.device) for t in self.val_loader.next_batch())
            with self.autocast:
                total += self.model(x, y)[1].float()
        self.model.train()
        return distributed.all_reduce_mean(total / steps, self.ctx).item()

    def log(self, record: dict):
        if self.ctx.is_main:
            record = {"step": self.step, "tokens": self.step * self.tokens_per_step, **record}
            self.metrics.log(record)
            self.latest.update(record)
            # The console gets the run-level numbers; per-parameter series go to the logs only.
            tqdm.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()
                                if "/" not in k or k.startswith(("train/", "val/", "heldout/", "zero_shot/"))))
            if any(is_layer_key(k, "max_logit") for k in record):
                tqdm.write("  max attention logit per layer: " + " ".join(
                    f"{record[k]:.2f}" for k in sorted(record) if is_layer_key(k, "max_logit")))

    def memory_report(self) -> dict[str, float]:
        """Memory per rank (MiB, training/memory.py), each the largest over the ranks (the first
        to run out): parameters, gradients, optimizer state, an activation estimate and the
        measured peak. Every rank calls it."""
        mine = memory.report(self.model, self.optimizer, gradient_copies=self.layout.gradient_copies,
                             micro_batch=self.config.micro_batch_size, compute_dtype=self.dtype, device=self.device)
        ranks = distributed.all_gather_objects(mine, self.ctx)
        return {key: max(report[key] for report in ranks) for key in mine}

    def summarize(self):
        """The final numbers and a sample (every rank calls it: FSDP2 gathers the model)."""
        sampler = self.layout.plain_model(self.model) if self.config.sample_tokens else None
        if not self.ctx.is_main:
            return
        max_logits = [f"{self.latest[k]:.2f}" for k in sorted(self.latest) if is_layer_key(k, "max_logit")]
        print(f"finished {self.step} steps ({self.step * self.tokens_per_step:,} tokens): "
              f"val loss {self.latest['val/loss']:.4f}, max attention logit per layer {' '.join(max_logits)}")
        if sampler is not None:
            print(f"sample:\n{self.sample(sampler, self.config.sample_tokens)}")

    def sample(self, model: GPT, max_new_tokens: int) -> str:
        start = torch.tensor([[self.tokenizer.eot_token]], device=self.device)
        generator = torch.Generator(self.device).manual_seed(self.config.seed)
        with self.autocast:
            out = model.generate(start, max_new_tokens, temperature=0.8, top_k=200, generator=generator,
                                 n_vocab=self.tokenizer.n_vocab)
        return self.tokenizer.decode(out[0, 1:].tolist())

    def describe(self):
        c, m = self.config, self.model_config
        print(f"run folder {self.run_dir}: config.json, metrics.jsonl, checkpoints")
        print(f"model {c.model}: {m.n_layer} layers, {m.n_head} heads, {m.n_embd} dims, block {m.block_size}, "
              f"vocab {m.vocab_size}, {self.model.num_params() / 1e6:.2f}M parameters")
        print(f"optimizer {c.optimizer} lr {c.lr} -> {c.min_lr} ({c.lr_schedule}, warmup {self.warmup_steps}); "
              f"global batch {c.batch_size} x {m.block_size} tokens = micro {c.micro_batch_size} x "
              f"{self.ctx.world_size} ranks x {self.grad_accum} accumulation; {self.total_steps} steps "
              f"on {self.device} ({self.layout.strategy})")
        print(f"optimizer {c.optimizer} hyper-parameters: " + ", ".join(
            f"{key} {value} ({source})" for key, (value, source) in self.optimizer_settings.items()))
        print(f"optimizer implementation (optim_backend {c.optim_backend!r}):\n{self.optimizer.describe()}")
        if c.qk_clip_tau is not None:
            print(f"QK-Clip: after every step, each head's largest attention logit on the step's batch capped at "
                  f"{c.qk_clip_tau:g}")

    # --- checkpoints ---
    def save_checkpoint(self):
        self.check_finite()
        self.layout.save(self.state, self.run_dir, self.config.keep_checkpoints,
                         self.config.permanent_checkpoint_interval)
        self.last_checkpoint_step = self.step
        self.checkpoint_steps.append(self.step)

    def zero_shot(self):
        """Run the configured zero-shot tasks (eval/) on the current weights, each rank scoring its
        share of the examples, and log every metric as zero_shot/<task>/<metric>. A task the model
        cannot score (a continuation longer than its window) is skipped with a warning: the run and
        the other tasks' results go on."""
        from eval import evaluate
        from eval.scorer import Scorer
        from eval.tasks import tasks_named
        scorer = Scorer(self.layout.plain_model(self.model, on_every_rank=True), self.tokenizer,
                        batch_size=self.config.micro_batch_size, device=self.device, show_progress=False)
        record = {}
        for task in tasks_named(self.config.zero_shot_tasks):
            try:
                output = evaluate(scorer, [task], data_dir=self.config.zero_shot_data_dir,
                                  limit=self.config.zero_shot_limit, rank=self.ctx.rank, world_size=self.ctx.world_size,
                                  gather=lambda obj: distributed.all_gather_objects(obj, self.ctx))
            except ValueError as error:  # (every rank together: evaluate agrees on a refusal)
                if self.ctx.is_main:
                    warnings.warn(f"zero-shot evaluation at step {self.step} skips {error}")
                continue
            record.update({f"zero_shot/{task.name}/{metric}": value for metric, value in output["results"][task.name].items()
                           if metric not in ("version", "n", "seconds") and value is not None})
        self.model.train()  # the scorer puts the model in eval mode
        self.log(record)

    def restore(self):
        checkpoint, path = load_latest(self.run_dir, fall_back=self.config.resume == "auto")
        checkpoint.check_compatible(vars(self.model_config), self.config.to_dict(), path)
        self.layout.load(self.state, checkpoint, path)
        self.last_checkpoint_step = self.step
        self.checkpoint_steps.append(self.step)
        if self.ctx.is_main:
            print(f"resumed {path} at step {self.step} (written by code {checkpoint.code_version})")

    def close(self):
        """Stop the loaders' prefetch threads, give the run folder up, restore the signal handlers
        and leave the process group."""
        for sig, handler in self.saved_handlers.items():
            signal.signal(sig, handler)
        if self.run_lock is not None:
            self.run_lock.release()
        self.train_loader.close()
        self.val_loader.close()
        distributed.teardown(self.ctx)

    def _on_sigterm(self, signum, frame):
        self.stop_signal = "SIGTERM"  # acted on at the next log step, on all ranks together

    def _on_sigint(self, signum, frame):
        """Ctrl-C: the first saves at the next log step and exits, as SIGTERM; a second stops at once."""
        if self.stop_signal is not None:
            raise KeyboardInterrupt
        self.stop_signal = "Ctrl-C"
        if self.ctx.is_main:
            tqdm.write("Ctrl-C: saving at the next log step, then exiting (Ctrl-C again to stop at once)")

    def _synchronize_time(self, start: float) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start


def usage() -> str:
    return (f"usage: python train.py CONFIG [--key=value ...]\n"
            f"       torchrun --nproc_per_node=N train.py CONFIG [--key=value ...]\n\n"
            f"{__doc__.strip()}\n\nThe config keys (a config file assigns them as Python names; "
            f"--key=value overrides them):\n\n{key_reference()}")


def main(argv: list[str]):
    if "-h" in argv or "--help" in argv:
        print(usage())
        return
    if not argv:
        sys.exit("train.py: no config given: python train.py configs/default.py (a config file), with "
                 "--key=value overrides if you like; python train.py --help lists the keys")
    config_path = argv[0] if not argv[0].startswith("--") else None
    try:
        config = load_config(config_path, argv[1:] if config_path else argv)
        trainer = Trainer(resolve_config(config))
    except (ValueError, OSError) as error:  # a bad config, run folder, data folder or checkpoint
        distributed.fail(f"train.py: {error}")
    try:
        trainer.train()
    except (NonFiniteError, ShardTokenError, OSError) as error:
        distributed.fail(f"train.py: {error}")
    finally:
        trainer.close()
    if trainer.ctx.is_main and trainer.last_checkpoint_step is not None:
        print(run_folder.guide(trainer.run_dir, trainer.last_checkpoint_step, trainer.total_steps, trainer.config,
                               distributed.launcher(), argv))


if __name__ == "__main__":
    main(sys.argv[1:])
