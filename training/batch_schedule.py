"""The global batch of every optimizer step, and what follows it: a run's batch schedule.

A config's ``batch_schedule`` lists ``(tokens, batch)`` pairs: from each token count on, the
global batch (sequences per optimizer step) is that batch. The first pair is at 0 tokens with
the config's ``batch_size``; each change multiplies or divides the batch by an integer. A change
takes effect at the first optimizer step at or after its token count (steps are whole batches),
so the run's ``Phase`` list says at which step and token count each batch begins. Without a
schedule the run has one phase, ``batch_size`` from 0.

What follows the batch (docs/batch.md):

* the gradient accumulation, ``batch / (micro_batch_size x ranks)``, per phase: every phase's
  batch must divide by it;
* the lr and min_lr, by ``batch_lr_scaling``: multiplied by ``sqrt(B / B0)`` (the default, Adam's
  rule), ``B / B0`` ("linear") or not at all ("none"), B0 the schedule's first batch;
* the decays named in ``batch_half_life_betas``, held at a fixed half-life in tokens (Marek et al.
  2025): ``beta ** (B / B0)``. Each optimizer declares which of its decays may follow the batch
  (``BATCH_DECAYS``, optim/protocol.py: Adam's beta1 and beta2, Muon's momentum, AdEMAMix's beta3,
  MARS's adamw_beta1 and adamw_beta2, ...); a name it does not declare is refused;
* the lr schedule, which runs in tokens (training/schedule.py), so a ramp does not stretch it;
* what the optimizer and the parts scale by the batch: Sophia-G's Hessian scale and the batch of
  its Hessian pass, the noise scale's big batch.

The data order does not depend on the batch: the loader's global stream hands out the next
micro-batches whatever the accumulation (data/loader.py). So a scheduled run equals a run
stopped at a change and resumed by hand with the new batch, lr and decays (tests/test_batch_schedule.py).
``StepSchedule`` sets all of it, from one place, for a run, a resume and a branch (study/cbs.py).

A checkpoint records the phases (``Checkpoint.batch_phases``). A resume keeps those that began
at or before its step and plans the rest from the config's schedule, which may so change on
resume (``--allow_changes=batch_size`` or ``batch_schedule``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import Tensor

import optim
from configs import SCALINGS, ConfigError, TrainConfig
from training.schedule import LrSchedule, decay_steps
from training.seq_len_warmup import SeqLenWarmup


@dataclass(frozen=True)
class Phase:
    step: int  # optimizer steps taken when it begins
    tokens: int  # training tokens seen when it begins
    batch: int  # its global batch, in sequences


class BatchSchedule:
    """A run's phases (oldest first, the first at step 0) for sequences of ``block_size`` tokens, each
    step's sequences cut by ``seq_len_warmup`` (None: none): the tokens it counts are those trained."""

    def __init__(self, phases: list[Phase], block_size: int, reference: int,
                 seq_len_warmup: SeqLenWarmup | None = None):
        self.phases, self.block_size = phases, block_size
        self.reference = reference  # the config's first batch: the lr and decays are set for it
        self.seq_len_warmup = seq_len_warmup
        # (With a warmup: the tokens a sequence trains in the steps before each of its steps.)
        self._trained = [0]
        if seq_len_warmup is not None:
            for step in range(seq_len_warmup.steps):
                self._trained.append(self._trained[-1] + seq_len_warmup.trained_per_sequence(step))

    @classmethod
    def of(cls, config: TrainConfig, block_size: int, history: list[Phase] = (), at_step: int = 0) -> BatchSchedule:
        """The phases of ``config``'s schedule, or of a run resumed at ``at_step`` that recorded
        ``history``: its phases up to that step, then the config's from there."""
        requested = config.batch_schedule or [[0, config.batch_size]]
        phases = [p for p in history if p.step <= at_step] or [Phase(0, 0, requested[0][1])]
        schedule = cls(phases, block_size, reference=requested[0][1],
                       seq_len_warmup=SeqLenWarmup.of(config, block_size))
        origin = schedule.tokens(at_step)
        active = [batch for start, batch in requested if start <= origin][-1]  # the config's batch at the origin
        if phases[-1].step == at_step:  # a phase that begins here takes the config's batch
            phases.pop()
        if not phases or phases[-1].batch != active:
            phases.append(Phase(at_step, origin, active))
        for start, batch in ((s, b) for s, b in requested if s > origin):
            current = phases[-1]
            steps = max(0, -(-(start - current.tokens) // (current.batch * block_size)))  # the first step at or after
            if steps == 0:  # two changes within one step: the earlier one never took a step
                phases.pop()
                current = phases[-1]
                if batch == current.batch:
                    continue
                steps = -(-(start - current.tokens) // (current.batch * block_size))
            phases.append(Phase(current.step + steps, current.tokens + steps * current.batch * block_size, batch))
        return schedule

    # --- where a step lies ---
    def phase_index(self, step: int) -> int:
        """The phase of the step taken after ``step`` steps (0-based: the phase of step ``step + 1``)."""
        return max(i for i, phase in enumerate(self.phases) if phase.step <= step)

    def phase(self, step: int) -> Phase:
        return self.phases[self.phase_index(step)]

    def trained(self, steps: int) -> int:
        """The tokens one sequence a step trains over the first ``steps`` steps (``steps`` blocks
        without a sequence-length warmup)."""
        warmup = len(self._trained) - 1
        return self._trained[min(steps, warmup)] + max(0, steps - warmup) * self.block_size

    def tokens(self, steps: int) -> int:
        """The training tokens trained after ``steps`` optimizer steps."""
        phase = self.phase(steps)
        return phase.tokens + (self.trained(steps) - self.trained(phase.step)) * phase.batch

    def tokens_per_step(self, step: int) -> int:
        """The tokens the step after ``step`` steps trains."""
        return self.phase(step).batch * (self.trained(step + 1) - self.trained(step))

    def tokens_read_per_step(self, step: int) -> int:
        """The tokens the step after ``step`` steps reads: its sequences' whole blocks."""
        return self.phase(step).batch * self.block_size

    def cut(self, x: Tensor, y: Tensor, steps: int) -> tuple[Tensor, Tensor]:
        """A micro-batch's inputs and targets as the step after ``steps`` steps trains them."""
        return (x, y) if self.seq_len_warmup is None else self.seq_len_warmup.cut(x, y, steps)

    def tokens_read(self, steps: int) -> int:
        """The tokens read from the data after ``steps`` steps: their sequences' whole blocks."""
        ends = [p.step for p in self.phases[1:]] + [steps]
        return sum(max(0, min(steps, end) - p.step) * p.batch * self.block_size for p, end in zip(self.phases, ends))

    def steps_within(self, tokens: int) -> int:
        """The most optimizer steps whose tokens fit in ``tokens``."""
        phase = max((p for p in self.phases if p.tokens <= tokens), key=lambda p: p.step)
        if self.seq_len_warmup is None:
            return phase.step + (tokens - phase.tokens) // (phase.batch * self.block_size)
        low, high = phase.step, phase.step + (tokens - phase.tokens) // phase.batch + 1  # (a step trains >= 1 token)
        while high - low > 1:  # the last step whose tokens fit: tokens(low) <= tokens < tokens(high)
            middle = (low + high) // 2
            low, high = (middle, high) if self.tokens(middle) <= tokens else (low, middle)
        return low

    # --- the run's lengths, and what follows the batch ---
    def lengths(self, config: TrainConfig) -> tuple[int, int]:
        """(total optimizer steps, warmup steps) of ``config``, its token budgets in whole steps."""
        total = config.max_steps or self.steps_within(config.max_tokens)
        warmup = config.warmup_steps or self.steps_within(config.warmup_tokens)
        if total <= 0:
            raise ConfigError(f"max_tokens={config.max_tokens} is less than one step of {self.tokens_per_step(0)} "
                              f"tokens")
        if warmup > total:
            raise ConfigError(f"the warmup ({warmup} steps) is longer than the run ({total} steps): shorten "
                              f"warmup_steps / warmup_tokens or lengthen the run")
        return total, warmup

    def accumulation(self, step: int, micro_batch_size: int, world_size: int) -> int:
        """The micro-steps of one rank in the step after ``step`` steps."""
        return self.phase(step).batch // (micro_batch_size * world_size)

    def check_divisible(self, micro_batch_size: int, world_size: int, from_step: int = 0) -> None:
        """The batch of every phase still to train (after ``from_step`` steps) divides into
        micro-batches on every rank (a ConfigError naming it)."""
        per_step = micro_batch_size * world_size
        for i, phase in enumerate(self.phases[self.phase_index(from_step):], self.phase_index(from_step)):
            if phase.batch % per_step:
                where = f"batch_size={phase.batch}" if len(self.phases) == 1 else \
                    f"the batch schedule's phase {i} (batch {phase.batch} from step {phase.step})"
                which = "batch_size" if len(self.phases) == 1 else "every batch of the schedule"
                raise ConfigError(f"{where} is not divisible by micro_batch_size={micro_batch_size} x "
                                  f"world_size={world_size} = {per_step}: make {which} a multiple of {per_step}, "
                                  f"or choose micro_batch_size so that micro_batch_size x world_size divides it")

    def ratio(self, step: int) -> float:
        """The batch of the step after ``step`` steps over the config's first (``reference``): what
        scales the lr and the decays."""
        return self.phase(step).batch / self.reference

    def lr_schedule(self, config: TrainConfig, total_steps: int, warmup_steps: int) -> LrSchedule:
        """``config``'s lr schedule, its landmarks the tokens at the run's step boundaries."""
        decay_start = total_steps - decay_steps(total_steps, config.decay_fraction)
        return LrSchedule(total=self.tokens(total_steps), warmup=self.tokens(warmup_steps),
                          decay_start=self.tokens(decay_start), lr=config.lr, min_lr=config.min_lr,
                          kind=config.lr_schedule)

    def state_dict(self) -> list[list[int]]:
        return [[p.step, p.tokens, p.batch] for p in self.phases]

    @staticmethod
    def recorded(phases: list[list[int]]) -> list[Phase]:
        return [Phase(*p) for p in phases]


def half_life_betas(config: TrainConfig, ratio: float, names: tuple[str, ...]) -> dict:
    """The changes to ``config`` (resolved: every decay has its value) that keep the half-life in
    tokens of the decays ``names`` fixed when the tokens a step grow by ``ratio`` (Marek et al.
    2025): beta ** ratio, each decay where its optimizer declares it (``optim.batch_decays``: beta1
    and beta2 are the config's, the others its optimizer_options')."""
    declared = declared_decays(config, names)
    changes, options = {}, dict(config.optimizer_options)
    for name in names:
        key, index = declared[name]
        if key == "betas":  # (the config's beta1 and beta2)
            if getattr(config, f"beta{index + 1}") is not None:
                changes[f"beta{index + 1}"] = getattr(config, f"beta{index + 1}") ** ratio
        elif key in options:
            options[key] = with_decay(options[key], index, decay_of(options[key], index) ** ratio)
    return {**changes, **({"optimizer_options": options} if options != config.optimizer_options else {})}


def followed_decays(config: TrainConfig) -> tuple[str, ...]:
    """The decays ``config`` holds at a fixed half-life in tokens (its ``batch_half_life_betas``)."""
    return tuple(name for name in config.batch_half_life_betas.split(",") if name)


def declared_decays(config: TrainConfig, names: tuple[str, ...]) -> dict[str, tuple[str, int | None]]:
    """Of the decays ``config``'s optimizer declares, those named (a ConfigError for another name)."""
    declared = optim.batch_decays(config.optimizer)
    unknown = [name for name in names if name not in declared]
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: optimizer {config.optimizer!r} has no such decay to hold at a "
                          f"half-life in tokens; its decays are {', '.join(declared) or 'none'}")
    return {name: declared[name] for name in names}


def decay_of(value, index: int | None) -> float:
    """The decay a declared (key, index) names in its key's ``value``: the number, or ``value[index]``."""
    return value if index is None else value[index]


def with_decay(value, index: int | None, decay: float):
    """``value`` with the decay at ``index`` (None: the number itself) replaced by ``decay``."""
    return decay if index is None else tuple(decay if i == index else v for i, v in enumerate(value))


class StepSchedule:
    """What follows the batch in a run, set from one place: train.py calls ``before_step`` before
    each optimizer step, and a resume or a branch gives it the schedule it trains by (``follow``).
    When a phase begins: its gradient accumulation and the decays named by ``batch_half_life_betas``
    (beta ** (B / B0), each where its optimizer declares it, from the value it was built with); every
    step: what the optimizer scales by the step's tokens (Sophia-G's Hessian scale) where they
    changed, and the lr of the step's tokens, its peak by ``batch_lr_scaling``."""

    def __init__(self, config: TrainConfig, block_size: int, optimizer, world_size: int):
        self.config, self.block_size, self.optimizer, self.world_size = config, block_size, optimizer, world_size
        # (group number, key, index, the decay built with: the config's, for its first batch B0). By
        # number: loading a checkpoint replaces the optimizer's group dicts.
        self.decays = [(number, key, index, decay_of(group[key], index))
                       for key, index in declared_decays(config, followed_decays(config)).values()
                       for number, group in enumerate(optimizer.param_groups) if key in group]

    def follow(self, schedule: BatchSchedule, step: int = 0) -> None:
        """Train by ``schedule`` from after ``step`` steps: the run's length, its lr schedule in
        tokens, the batch of the next step."""
        config = self.config
        schedule.check_divisible(config.micro_batch_size, self.world_size, from_step=step)
        self.batch_schedule = schedule
        self.total_steps, self.warmup_steps = schedule.lengths(config)
        self.lr_schedule = schedule.lr_schedule(config, self.total_steps, self.warmup_steps)
        self.phase = None  # the phase the run trains in
        self.step_tokens = None  # the tokens of the step the optimizer was last told of
        self.enter_phase(step)

    def resume(self, checkpoint) -> None:
        """Train on from ``checkpoint`` (training/checkpoint/format.py): its phases up to its step are the
        run's record, the rest the config's."""
        self.follow(BatchSchedule.of(self.config, self.block_size, BatchSchedule.recorded(checkpoint.batch_phases),
                                     checkpoint.step), checkpoint.step)

    def was_final(self, checkpoint, changes: list[dict]) -> bool:
        """Whether ``checkpoint``'s step was its run's last as it was trained: with the settings before
        the ``changes`` (a run's record) made from that step on, the earliest's "from"."""
        made_there = [change for change in changes if change["step"] == checkpoint.step]
        trained_with = dataclasses.replace(self.config, **{c["key"]: c["from"] for c in reversed(made_there)})
        schedule = BatchSchedule.of(trained_with, self.block_size, BatchSchedule.recorded(checkpoint.batch_phases),
                                    checkpoint.step)
        return checkpoint.step == schedule.lengths(trained_with)[0]

    def enter_phase(self, step: int) -> None:
        """Take the step after ``step`` steps with its phase's batch, if it does not yet."""
        phase = self.batch_schedule.phase_index(step)
        if phase == self.phase:
            return
        self.phase, ratio = phase, self.batch_schedule.ratio(step)
        self.accumulation = self.batch_schedule.accumulation(step, self.config.micro_batch_size, self.world_size)
        for number, key, index, built in self.decays:
            group = self.optimizer.param_groups[number]
            group[key] = with_decay(group[key], index, built ** ratio)

    def before_step(self, step: int, tokens: int) -> None:
        """Set the step after ``step`` steps (``tokens`` trained): its phase, the tokens it trains
        (what the optimizer scales by them: they change with the phase and the sequence length), its lr."""
        self.enter_phase(step)
        step_tokens = self.batch_schedule.tokens_per_step(step)
        if step_tokens != self.step_tokens:
            self.optimizer.set_batch_tokens(step_tokens)
            self.step_tokens = step_tokens
        lr = self.lr_schedule(tokens, step_tokens,
                              scale=SCALINGS[self.config.batch_lr_scaling](self.batch_schedule.ratio(step)))
        for group in self.optimizer.param_groups:
            group["lr"] = lr


def run_lengths(config: TrainConfig) -> tuple[int, int]:
    """(total optimizer steps, warmup steps) of a run of ``config`` (a study's, a sweep's: from its start)."""
    return BatchSchedule.of(config, config.model_config(1).block_size).lengths(config)
