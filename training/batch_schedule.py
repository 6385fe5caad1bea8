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
* the decays named in ``batch_half_life_betas`` (Adam's beta2, beta1, Muon's momentum), held at a
  fixed half-life in tokens (Marek et al. 2025): ``beta ** (B / B0)``;
* the lr schedule, which runs in tokens (training/schedule.py), so a ramp does not stretch it;
* what the optimizer and the parts scale by the batch: Sophia-G's Hessian scale and the batch of
  its Hessian pass, the noise scale's big batch.

The data order does not depend on the batch: the loader's global stream hands out the next
micro-batches whatever the accumulation (data/loader.py). So a scheduled run equals a run
stopped at a change and resumed by hand with the new batch, lr and decays (tests/test_batch_schedule.py).

A checkpoint records the phases (``Checkpoint.batch_phases``). A resume keeps those that began
at or before its step and plans the rest from the config's schedule, which may so change on
resume (``--allow_changes=batch_size`` or ``batch_schedule``).
"""
from __future__ import annotations

from dataclasses import dataclass

from configs import ConfigError, TrainConfig
from training.schedule import LrSchedule, decay_steps


@dataclass(frozen=True)
class Phase:
    step: int  # optimizer steps taken when it begins
    tokens: int  # training tokens seen when it begins
    batch: int  # its global batch, in sequences


class BatchSchedule:
    """A run's phases (oldest first, the first at step 0) for sequences of ``block_size`` tokens."""

    def __init__(self, phases: list[Phase], block_size: int, reference: int):
        self.phases, self.block_size = phases, block_size
        self.reference = reference  # the config's first batch: the lr and decays are set for it

    @classmethod
    def of(cls, config: TrainConfig, block_size: int, history: list[Phase] = (), at_step: int = 0) -> BatchSchedule:
        """The phases of ``config``'s schedule, or of a run resumed at ``at_step`` that recorded
        ``history``: its phases up to that step, then the config's from there."""
        requested = config.batch_schedule or [[0, config.batch_size]]
        phases = [p for p in history if p.step <= at_step] or [Phase(0, 0, requested[0][1])]
        schedule = cls(phases, block_size, reference=requested[0][1])
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

    def tokens(self, steps: int) -> int:
        """The training tokens seen after ``steps`` optimizer steps."""
        phase = self.phase(steps)
        return phase.tokens + (steps - phase.step) * phase.batch * self.block_size

    def tokens_per_step(self, step: int) -> int:
        return self.phase(step).batch * self.block_size

    def steps_within(self, tokens: int) -> int:
        """The most optimizer steps whose tokens fit in ``tokens``."""
        phase = max((p for p in self.phases if p.tokens <= tokens), key=lambda p: p.step)
        return phase.step + (tokens - phase.tokens) // (phase.batch * self.block_size)

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

    def set_optimizer(self, optimizer, config: TrainConfig, step: int) -> None:
        """Give ``optimizer`` the batch of the step after ``step`` steps: its tokens (Sophia-G's
        Hessian scale) and, by ``config.batch_half_life_betas``, the decays at their half-life in
        tokens (beta ** (B / B0)), in every param group that has them."""
        optimizer.set_batch_tokens(self.tokens_per_step(step))
        if config.batch_half_life_betas:
            decays = half_life_betas(config, self.ratio(step), tuple(config.batch_half_life_betas.split(",")))
            for group in optimizer.param_groups:
                if "betas" in group:
                    group["betas"] = (decays.get("beta1", config.beta1), decays.get("beta2", config.beta2))
                if "momentum" in group and "optimizer_options" in decays:
                    group["momentum"] = decays["optimizer_options"]["momentum"]

    def state_dict(self) -> list[list[int]]:
        return [[p.step, p.tokens, p.batch] for p in self.phases]

    @staticmethod
    def recorded(phases: list[list[int]]) -> list[Phase]:
        return [Phase(*p) for p in phases]


def half_life_betas(config: TrainConfig, ratio: float, betas: tuple[str, ...]) -> dict:
    """The changes to ``config`` that keep the half-life of ``betas`` (each of BETAS the config
    has: the resolved beta1 and beta2, Muon's momentum) fixed in tokens when the tokens a step
    grow by ``ratio`` (Marek et al. 2025): beta ** ratio."""
    changes = {key: getattr(config, key) ** ratio for key in betas
               if key in ("beta1", "beta2") and getattr(config, key) is not None}
    if "momentum" in betas and "momentum" in config.optimizer_options:
        changes["optimizer_options"] = {**config.optimizer_options,
                                        "momentum": config.optimizer_options["momentum"] ** ratio}
    return changes


def run_lengths(config: TrainConfig) -> tuple[int, int]:
    """(total optimizer steps, warmup steps) of a run of ``config`` (a study's, a sweep's: from its start)."""
    return BatchSchedule.of(config, config.model_config(1).block_size).lengths(config)
