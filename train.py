"""Train a GPT-2 with the optimizer a config file names.

    python train.py configs/default.py                    # one process (CPU or one GPU)
    torchrun --nproc_per_node=8 train.py configs/X.py     # DDP: NCCL on GPUs, gloo on CPUs
    torchrun ... train.py configs/X.py --zero_stage=1     # optimizer state sharded (ZeRO-1), or --fsdp (FSDP2)
    python train.py configs/X.py --lr=3e-4 --resume       # overrides are Python literals

The config gives the GLOBAL batch; gradient accumulation follows from the micro-batch and the
number of ranks, so the same config optimizes identically on 1 or 64 GPUs.
"""

from __future__ import annotations

import shlex
import sys
from contextlib import contextmanager

import torch
from tqdm import tqdm

from configs import command_line_config, save_config, usage
from data.loader import ShardTokenError, TokenLoader
from data.shards import verify_manifest
from data.tokenizer import get_tokenizer
from eval.during_training import ZeroShot
from model import GPT
from optim.protocol import LossFn
from training import console, distributed, instruments, memory, metrics, noise_scale, qk_clip, run_folder, validation
from training.batch_schedule import BatchSchedule, StepSchedule
from training.checkpoint.checkpointer import Checkpointer
from training.clipping import GradientClip
from training.communication import Communication
from training.float_mode import FloatMode
from training.nonfinite import NonFiniteError, NonFiniteSteps
from training.parallel import Layout
from training.parts import EvaluationInterrupted, Part, Parts, Step, imported
from training.replicas import ReplicaGroups, ReplicasStopped
from training.run_config import RunConfig, precision, resolve_config
from training.signals import StopSignals
from training.state import LossWindow, RankRNG, RunState

# What takes part in a run beside the model and the optimizer (training/parts.py), in the order the loop calls
# them (the speed measured first; the sinks' start-up lines first); then a config's (extra_parts), then the
# replica groups' (LAST_PARTS: their quorum follows every other part's after_step).
PARTS = (metrics.Speed, metrics.TrainLoss, metrics.MetricsLog, console.Console, noise_scale.GradientNoiseScale,
         qk_clip.QKClip, instruments.OptimizerInstruments, instruments.SecondMoment, memory.Memory,
         validation.Validation, instruments.Probe, ZeroShot, Communication)
LAST_PARTS = (ReplicaGroups,)

# The sections of a training step (Trainer.section: a profiler's ranges). Gradient reduction runs inside
# "backward" (DDP's and FSDP2's hooks); "after_step" is the parts' (QK-Clip's clip).
SECTIONS = ("data", "forward", "backward", "clip", "optimizer", "after_step", "extra_pass", "instruments")


class Trainer:
    """The training loop of one run, from its resolved config (training/run_config.py)."""

    def __init__(self, run: RunConfig):
        # The resolved config is what the run trains with and records (config.json, checkpoints, wandb).
        self.config = config = run.config
        self.optimizer_settings = run.optimizer_settings
        self.float_mode = FloatMode(config.flush_denormals)  # (before any computation)
        self.ctx = distributed.setup(config.device)
        self.device = self.ctx.device
        self.layout, self.run_dir = Layout.of(config, self.ctx), config.run_dir  # (replica groups: join torchft's)
        # Every input is checked before anything is written: the folder is locked last, prepared in train().
        folder_seen = run_folder.fingerprint(self.run_dir)
        self.resuming, self.stale_files = run_folder.claim(self.run_dir, config.resume, config.overwrite)
        verify_manifest(config.data_dir, config.tokenizer)
        self.dtype, self.autocast, self.scaler = precision(config.dtype, self.device)
        self.tokenizer = get_tokenizer(config.tokenizer)
        torch.manual_seed(config.seed)  # identical initial weights on every rank
        self.model_config = config.model_config(self.tokenizer.n_vocab)
        block = self.model_config.block_size
        schedule = BatchSchedule.of(config, block)
        self.model = GPT(self.model_config).to(self.device)
        self.layout.shard_model(self.model, self.dtype)  # FSDP2: in place, before the optimizer sees the parameters
        self.optimizer = run.build_optimizer(
            self.model, decay_embeddings=config.decay_embeddings, backend=config.optim_backend,
            batch_tokens=schedule.tokens_per_step(0), run_steps=schedule.lengths(config)[0],
            zero_redundancy=self.layout.zero_redundancy)
        self.schedule = StepSchedule(config, block, self.optimizer, self.layout.data_ranks)  # what follows the batch
        self.schedule.follow(schedule)  # (the run's length; the first step's accumulation and decays)
        torch.manual_seed(config.seed + self.layout.data_rank)  # each rank its own dropout noise
        # Every loader checks the shards' tokens against the tokenizer and cuts its sequences alike.
        self.loader_options = dict(align_documents=config.align_documents, eot_token=self.tokenizer.eot_token,
                                   vocab_size=self.tokenizer.n_vocab)
        self.train_loader = TokenLoader(config.data_dir, "train", config.micro_batch_size, block,
                                        rank=self.layout.data_rank, world_size=self.layout.data_ranks,
                                        seed=config.data_seed, device=self.device, **self.loader_options)
        self.loss_window = LossWindow(self.ctx)  # the train loss since the last log step
        self.checkpoints = Checkpointer(self.layout.checkpoint_writer(self.ctx), self.run_dir, config)
        self.nonfinite = NonFiniteSteps(config.nonfinite, config.max_skipped_steps, self.run_dir,
                                        self.checkpoints.steps)
        self.parts = Parts.build([*PARTS, *imported(config.extra_parts), *LAST_PARTS], self)
        # Everything a checkpoint holds (training/state.py); the layout's checkpoint writer saves and loads it.
        self.state = RunState(self.model, self.optimizer, config=config.to_dict(), batch_schedule=schedule,
                              parts=self.parts, scaler=self.scaler, train_loader=self.train_loader,
                              train_window=self.loss_window, rng=RankRNG(self.ctx))
        self.pending_evaluation: Step | None = None  # the step whose evaluation a stop interrupted
        if self.resuming:
            checkpoint = self.checkpoints.resume(self.state, self.schedule, vars(self.model_config), config.to_dict())
            if self.state.evaluation_pending:  # the evaluations due at that step as it was trained (its final one?)
                self.pending_evaluation = Step(self.step, final=self.schedule.was_final(checkpoint, self.state.changes))
        # Compile and wrap after restoring, so checkpoints always hold the plain module's names.
        self.train_model = self.layout.wrap(torch.compile(self.model) if config.compile else self.model)
        self.clip = GradientClip(self.model.parameters(), config.grad_clip)  # (torch's clip_grad_norm_, its floats)
        # Each section of a step (SECTIONS) runs in ``with self.section(name)``: a profiler's range (or a timer).
        self.section = metrics.section_range
        self.signals = StopSignals(self.ctx.is_main, self.checkpoints, lambda: self.step)
        self.run_lock = self.checkpoints.lock = run_folder.lock(self.run_dir, folder_seen, self.ctx)

    @property
    def step(self) -> int:
        """Optimizer steps taken (``self.state`` counts them)."""
        return self.state.step

    # --- the loop ---
    def train(self):
        config, ctx = self.config, self.ctx
        if self.step == self.schedule.total_steps and not self.state.evaluation_pending:
            if ctx.is_main:
                print(f"the run in {self.run_dir} already finished its {self.schedule.total_steps} steps: nothing to "
                      f"do (raise max_steps to train on)")
            return
        if ctx.is_main:
            run_folder.prepare(self.run_dir, self.stale_files)
            save_config(config, self.run_dir / "config.json", self.state.changes)
        self.parts.call("start")
        last_step = min(self.schedule.total_steps, config.stop_at_step or self.schedule.total_steps)
        if self.step == 0 or self.pending_evaluation:  # the loss curve's start; an evaluation a stop interrupted
            self.evaluate(self.pending_evaluation or Step(0))
            if self.pending_evaluation:
                self.save_checkpoint()  # (the record: the evaluation done, or pending still)
                if self.state.evaluation_pending:  # stopped again: it stays pending, nothing trains before it
                    self.signals.announce_stop(self.ctx.rank, self.step, True)
                    return
        while self.step < last_step:
            number = self.step + 1
            step = Step(number, log=number % config.log_interval == 0 or number == self.schedule.total_steps,
                        final=number == self.schedule.total_steps)
            loss = self.train_step(step)
            if step.committed:  # (a step the replica groups dropped trained nothing: no record says it did)
                self.loss_window.add(loss, step.finite)
            self.state.step += 1  # a skipped or dropped step counts: its batch is consumed, the schedule moves on
            self.after_step(step)  # the parts (QK-Clip), then an optimizer's extra pass (Sophia-G's Hessian)
            if step.log:
                with self.section("instruments"):
                    self.check_finite()  # (the loop syncs at a log step anyway)
                    self.log(self.parts.collect("measure", step))  # the train loss, the speed, every instrument
            self.evaluate(step)
            stop = (step.log or self.state.evaluation_pending) and self.signals.agreed(ctx)  # (a host sync: not always)
            if self.checkpoints.due(self.step, last_step, stop):
                self.save_checkpoint()
            if stop:
                self.signals.announce_stop(self.ctx.rank, self.step, self.state.evaluation_pending)
                break
        if self.step == self.schedule.total_steps and not self.state.evaluation_pending:
            self.parts.call("finish")

    def train_step(self, step: Step) -> torch.Tensor:
        """One optimizer step over the global batch: the mean loss, and ``step.finite`` set (0-d tensors,
        no host sync; nonfinite="skip" drops a non-finite update on the device, "stop" raises later)."""
        self.schedule.before_step(self.step, self.state.tokens)  # the phase's batch and decays, the step's lr
        # The weights back where gradients are taken, if an evaluation moved them: with this phase's decays, as a
        # run resumed with them by hand does (Schedule-Free's y from x and z by beta1).
        self.optimizer.train()
        self.parts.call("before_step", step)
        z_loss = self.config.z_loss
        total_loss = self.forward_backward(lambda model, x, y, offset: model(x, y, z_loss=z_loss, logits=False)[1],
                                           self.parts)
        # (FSDP2: the norm of the sharded gradient, a replicated DTensor; made a plain tensor.)
        with self.section("clip"):
            step.grad_norm = self.layout.full_tensor(self.clip(exact=step.log))
        # The norm of the all-reduced gradient: the same verdict on every rank. With float16 an
        # overflowed gradient is the GradScaler's to skip; only a non-finite loss counts then.
        step.finite = total_loss.isfinite() if self.scaler.is_enabled() else step.grad_norm.isfinite()
        self.parts.call("commit", step)  # (replica groups: whether the groups agreed on the step)
        self.nonfinite.record(step.number, step.finite, step.committed)
        self.parts.call("before_update", step)
        with self.section("optimizer"):
            if step.committed and self.config.nonfinite == "skip" and not self.scaler.is_enabled():
                self.optimizer.step_unless(~step.finite)  # on the device: no host sync
            elif step.committed:  # (replica groups that did not agree on a step drop it: training/replicas.py)
                self.scaler.step(self.optimizer)  # (float16: the scaler drops an overflowed step itself)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        self.parts.call("after_update", step)
        return total_loss

    def after_step(self, step: Step) -> None:
        """After an optimizer step, before anything reads the weights: the parts (QK-Clip's clip on this
        step's batch), then an optimizer's own forward and backward (Sophia-G's Hessian, every 10 steps)."""
        with self.section("after_step"):
            self.parts.call("after_step", step)
        if self.optimizer.extra_pass_due(self.step):
            with self.section("extra_pass"):
                self.optimizer.extra_pass(self.gradients, self.config.seed)

    def check_finite(self):
        """The non-finite policy (training/nonfinite.py), where the loop syncs anyway (log steps,
        checkpoints): a stop raises, skipped steps are reported, non-finite parameters never saved."""
        skipped = self.nonfinite.check(self.step, lambda: self.layout.all_finite(p.detach() for p in
                                                                                  self.model.parameters()),
                                       on_stop=self.parts.find(metrics.MetricsLog).event)  # (the record says why)
        if skipped and self.ctx.is_main:
            tqdm.write(skipped)

    def forward_backward(self, loss_fn: LossFn, observers: list[Part] = ()) -> torch.Tensor:
        """Accumulate the gradient of loss_fn(model, x, y, stream offset of x) over the global
        batch's micro-batches, unscaled and all-reduced; returns the mean loss. ``observers``: the
        parts told of each micro-batch's backward and of the reduced gradient (a training step's)."""
        total_loss, accumulation = None, self.schedule.accumulation
        for micro_step in range(accumulation):
            with self.section("data"):
                offset = self.train_loader.next_offset
                x, y = self.schedule.batch_schedule.cut(*self.train_loader.next_batch(), self.step)  # (on the device)
            last = micro_step == accumulation - 1  # (gradients are reduced across the ranks on the last one only)
            with self.section("forward"), self.layout.gradient_sync(self.train_model, last), self.autocast:
                loss = loss_fn(self.train_model, x, y, offset)
                loss = loss / accumulation if accumulation > 1 else loss  # (x / 1 is x: no node in the backward)
            with self.section("backward"):
                self.scaler.scale(loss).backward()
            total_loss = loss.detach().float() if total_loss is None else total_loss + loss.detach()
            for part in observers:
                part.after_backward(micro_step)
        self.scaler.unscale_(self.optimizer)
        for part in observers:
            part.after_reduce()
        return total_loss

    @contextmanager
    def gradients(self, loss_fn: LossFn):
        """An ``optim.GradientFn``: inside, the gradient of loss_fn over the next global batch (for
        an optimizer's extra pass); yields the model's parameters."""
        self.forward_backward(loss_fn)
        yield list(self.model.parameters())
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def evaluated_model(self) -> GPT:
        """The model at the weights it is evaluated at (validation, the probe, samples, zero-shot,
        checkpoints): ``optimizer.eval()``'s (Schedule-Free AdamW: its average x; the others: the weights
        trained) until the next ``optimizer.train()``. Every rank calls it, in step (ZeRO-1 broadcasts)."""
        self.optimizer.eval()
        return self.model

    def evaluate(self, step: Step) -> None:
        """The parts' evaluations due at ``step``, logged; one a stop interrupts stays pending in the
        run's state (saved with it), and the run runs it first when it resumes."""
        try:
            self.log(self.parts.collect("evaluate", step))
            self.state.evaluation_pending = False
        except EvaluationInterrupted:
            self.state.evaluation_pending = True

    def log(self, metrics: dict):
        """Hand the main rank's ``metrics`` (if any) to the parts that record them, with the step."""
        if metrics and self.ctx.is_main:
            self.parts.call("record", {"step": self.step, "tokens": self.state.tokens, **metrics})

    def save_checkpoint(self):  # the evaluated model (Schedule-Free: x), which export, eval and the Hessian read;
        # a resumed run's first step moves it back, as this run's next does, to the same floats.
        self.evaluated_model()
        self.check_finite()
        with self.signals.deferred():  # (a second Ctrl-C stops once the checkpoint is whole)
            self.checkpoints.save(self.state)

    def close(self):
        """Close the parts and the training loader, give the run folder and the signals up, leave the group."""
        self.parts.call("close")
        self.signals.restore()
        self.run_lock.release()
        self.train_loader.close()
        distributed.teardown(self.ctx)
        self.float_mode.restore()  # (IEEE floats again in the process that ran the run)


def main(argv: list[str]):
    if "-h" in argv or "--help" in argv:
        print(usage(__doc__))
        return
    try:
        trainer = Trainer(resolve_config(command_line_config(argv)))
    except (ValueError, OSError) as error:  # a bad config, run folder, data folder or checkpoint
        distributed.fail(f"train.py: {error}")
    try:
        trainer.train()
    except (NonFiniteError, ShardTokenError, OSError, ReplicasStopped) as error:  # (a lost lighthouse: how to resume)
        resume = getattr(error, "resumable", False) and run_folder.resume_command(distributed.launcher(), argv)
        distributed.fail(f"train.py: {error}" + (f"; resume this group with {shlex.join(resume)}" if resume else ""))
    finally:
        trainer.close()
    if trainer.ctx.is_main and trainer.checkpoints.steps:
        print(run_folder.guide(trainer.run_dir, trainer.checkpoints.steps[-1], trainer.schedule.total_steps,
                               trainer.config, distributed.launcher(), argv, trainer.state.evaluation_pending))


if __name__ == "__main__":
    main(sys.argv[1:])
