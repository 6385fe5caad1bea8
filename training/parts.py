"""What takes part in a run beside the model and the optimizer: parts with one lifecycle.

The instruments, QK-Clip, the gradient noise scale, validation, zero-shot evaluation, the metrics
log, the console and the replica groups are parts; train.py registers them in one order and the
loop calls them in it, so a new feature is a new part, not new lines in the loop. A config adds its
own parts with ``extra_parts`` ("module:Class", comma-separated), as tests/test_parts.py does:
they go after train.py's ``PARTS`` and before its ``LAST_PARTS`` (the replica groups, whose quorum
follows every other part's ``after_step``).

A part is built by its class's ``build(run)`` from the run: what it may read of it is declared
once, by ``Run`` below (train.py's ``Trainer`` provides it; tests/test_parts.py fails on a part
that reaches for anything else). It is built after the model and optimizer and before anything is
written; it returns None where the config does not ask for it, and raises a ValueError naming the
key where the config asks for something impossible. A part that reads the weights as the model's
(an evaluation) takes the model from ``run.evaluated_model()``, which puts them where the optimizer
evaluates (Schedule-Free's x).
The loop then calls every part, in the list's order, at these moments (each is optional: the
base class's do nothing):

=========================  =================================================================
``start()``                the loop begins (after a resume), the run folder prepared
``before_step(step)``      before the step's forward and backward passes
``after_backward(i)``      after micro-batch i's backward (its gradient accumulated in .grad)
``after_reduce()``         the step's gradient is complete: all-reduced and unscaled, not clipped
``commit(step)``           clipped (``step.grad_norm``, ``step.finite``): whether the update is applied
                           (``step.committed``: replica groups that disagreed drop it); nothing
                           records the step before, and a dropped step enters no record as trained
``before_update(step)``    just before the optimizer step (``step.committed`` final) ...
``after_update(step)``     ... and just after it
``after_step(step)``       after the update, before anything reads the weights (``step.finite``)
``measure(step)``          at a log step: the part's metrics, logged with the train loss
``evaluate(step)``         after each step (and before the first at step 0): an evaluation's
                           metrics where one is due, else {}; then the checkpoint, if due
``record(metrics)``        a record is logged: the sinks (metrics file, wandb, console)
``finish()``               the run reached its last step
``close()``                the run ends: finished, stopped or failed
=========================  =================================================================

Every rank calls every moment but ``record`` (the main rank's), in step with the others, so a
part may run collectives there; the metrics of the main rank are the ones logged. On an ordinary
step the moments up to ``after_step`` run: they must not wait for the device (no ``.item()``), so
the loop never syncs with the host between log steps.

A part with state sets ``name`` and has ``state_dict`` / ``load_state_dict``: the checkpoint keeps
it under ``parts[name]`` (training/state.py), and a resumed run continues it; a checkpoint without
the part's state (an older run, the part added since) leaves it fresh.

A part that returns metrics declares their keys in ``metric_keys``: exact keys (``"lr"``) and
prefixes ending in "/" (``"val/"``: every key under it), or ``"*"``: every key no other part
declares (the optimizer's diagnostics, whose statistics each optimizer names). A record holds one
value a key, so ``Parts`` refuses two parts that declare one key when the run is built (before
anything is written), and a key that a part returns outside its declaration when it returns it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

CATCH_ALL = "*"  # in metric_keys: every key no other part declares
LOOP = "the training loop"
LOOP_KEYS = ("step", "tokens")  # what the loop writes in every record beside the parts' metrics (train.py's log)


class EvaluationInterrupted(Exception):
    """A stop (SIGTERM, Ctrl-C) agreed by the ranks during a part's ``evaluate``: the loop saves
    with the step's evaluation pending, and a resumed run runs it first."""


@dataclass
class Step:
    """The optimizer step the loop is taking (``number``, 1-based; 0 before the first step)."""

    number: int
    log: bool = False  # a log step: measured (a host sync), its metrics logged
    final: bool = False  # the run's last step
    # From commit on: the gradient's norm before clipping (a 0-d tensor): torch's clip_grad_norm_'s on a log
    # step, within training/clipping.py's bound of it on the others.
    grad_norm: Tensor | None = None
    finite: Tensor | None = None  # from commit on: whether the gradient was finite (a 0-d bool tensor)
    committed: bool = True  # False (set at commit): the update is dropped (replica groups that disagreed)


class Run(Protocol):
    """What a part may read of the run it takes part in, declared once: train.py's ``Trainer``
    provides every name (tests/test_parts.py holds both sides: the Trainer has each, and no part
    reaches for another). A part reassigns none of them: its own state is its own, and what it
    tells the loop goes through the ``Step`` it is handed. Set before the parts are built, but
    ``train_model``, ``signals`` and ``run_lock``, set before the loop starts. (Types by name: their
    modules import this one.)"""

    config: TrainConfig  # the resolved config: what the run trains with and records
    optimizer_settings: Settings  # the optimizer's resolved hyper-parameters (optim.settings)
    ctx: Distributed  # this process: rank, world size, device
    device: torch.device
    dtype: torch.dtype  # what the forward computes in
    autocast: AbstractContextManager  # the forward's autocast (none for float32)
    scaler: GradScaler  # enabled for float16
    layout: Layout  # how the model and the optimizer state lie over the ranks (training/parallel.py)
    tokenizer: Tokenizer
    model_config: GPTConfig
    model: GPT  # the plain module (never compiled or wrapped): its weights as trained
    train_model: nn.Module  # what the steps run (compiled, wrapped by DDP)
    optimizer: Optimizer
    schedule: StepSchedule  # the run's length, its batch schedule, the step's accumulation (training/batch_schedule.py)
    state: RunState  # everything a checkpoint holds: the step, the tokens, the changes (training/state.py)
    loss_window: LossWindow  # the train loss since the last log step
    nonfinite: NonFiniteSteps  # the non-finite bookkeeping (training/nonfinite.py)
    signals: StopSignals  # SIGTERM and Ctrl-C (training/signals.py)
    run_dir: Path
    run_lock: RunLock  # the run folder's lock, to check before a write (training/run_folder.py)
    resuming: bool  # the run continues a checkpoint
    loader_options: dict  # what every loader of the run's data is built with (data/loader.py)
    step: int  # optimizer steps taken

    def evaluated_model(self) -> GPT:
        """The model at the weights it is evaluated at (Schedule-Free: its average x)."""


class Part:
    """Something that takes part in a run (see the module's docstring for the moments)."""

    name: str | None = None  # the key of its state in a checkpoint; None: it has no state
    metric_keys: tuple[str, ...] = ()  # the keys it may return from measure and evaluate (the module's docstring)

    @classmethod
    def build(cls, run: Run) -> Part | None:
        """The part for ``run``, None where its config does not ask for it (by default: made
        from the run by the constructor)."""
        return cls(run)

    def start(self) -> None: ...

    def before_step(self, step: Step) -> None: ...

    def after_backward(self, micro_step: int) -> None: ...

    def after_reduce(self) -> None: ...

    def commit(self, step: Step) -> None: ...

    def before_update(self, step: Step) -> None: ...

    def after_update(self, step: Step) -> None: ...

    def after_step(self, step: Step) -> None: ...

    def measure(self, step: Step) -> dict:
        return {}

    def evaluate(self, step: Step) -> dict:
        return {}

    def record(self, metrics: dict) -> None: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


def imported(names: str) -> list[type[Part]]:
    """The part classes that ``extra_parts`` names ("package.module:Class", comma-separated)."""
    classes = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        module, _, attribute = name.partition(":")
        try:
            found = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError, ValueError) as error:
            raise ValueError(f"extra_parts={names!r}: {name!r} cannot be imported ({error}); name each part as "
                             f"'package.module:Class', importable from the working directory") from error
        if not (isinstance(found, type) and issubclass(found, Part)):
            raise ValueError(f"extra_parts={names!r}: {name!r} is not a subclass of training.parts.Part")
        classes.append(found)
    return classes


class Parts(list):
    """A run's parts, in the order the loop calls them, each the only one to log its metric keys."""

    def __init__(self, parts=()):
        super().__init__(parts)
        self.owners = dict.fromkeys(LOOP_KEYS, LOOP)  # a declared key or prefix -> who declared it
        self.catch_all = None  # the part that declared "*"
        for part in self:
            if isinstance(part.metric_keys, str):  # (("val/") is a string: its letters would be the keys)
                raise ValueError(f"{label(part)}.metric_keys is the string {part.metric_keys!r}: make it a tuple, "
                                 f"({part.metric_keys!r},)")
            for entry in part.metric_keys:
                self._claim(part, entry)

    def _claim(self, part: Part, entry: str) -> None:
        """Make ``part`` the owner of ``entry`` (of its metric_keys), unless another part declared a key of it."""
        if entry == CATCH_ALL:
            if self.catch_all is not None:
                raise ValueError(f"the parts {label(self.catch_all)} and {label(part)} both declare {CATCH_ALL!r} "
                                 "in their metric_keys (every key no other part declares): only one part may")
            self.catch_all = part
            return
        for declared, owner in self.owners.items():
            if not (covers(declared, entry) or covers(entry, declared)):
                continue
            key = max(declared, entry, key=len)  # (the one under the other)
            if owner == LOOP:
                raise ValueError(f"{label(part)} declares the metric key {key!r}, which {LOOP} writes in every "
                                 f"record ({', '.join(LOOP_KEYS)}): give the part another key")
            raise ValueError(f"the parts {label(owner)} and {label(part)} both log the metric key {key!r} "
                             f"({type(owner).__name__}.metric_keys {owner.metric_keys!r}, {type(part).__name__}"
                             f".metric_keys {part.metric_keys!r}): give each part keys of its own")
        self.owners[entry] = part

    @classmethod
    def build(cls, classes, run) -> Parts:
        """The parts of ``classes`` that the run's config asks for, in that order."""
        return cls(part for kind in classes if (part := kind.build(run)) is not None)

    def call(self, moment: str, *args) -> None:
        """Tell every part about a moment of the run."""
        for part in self:
            getattr(part, moment)(*args)

    def collect(self, moment: str, step: Step) -> dict:
        """The metrics every part returns at ``moment`` ("measure" or "evaluate"), merged."""
        metrics = {}
        for part in self:
            returned = getattr(part, moment)(step)
            for key in returned:
                self._check_owner(part, key)
            metrics.update(returned)
        return metrics

    def _check_owner(self, part: Part, key: str) -> None:
        """An error unless ``part`` declared ``key``."""
        owner = self.owner(key)
        if owner is part:
            return
        if owner is None or owner is self.catch_all:
            raise ValueError(f"{label(part)} logged the metric key {key!r}, outside its metric_keys "
                             f"{part.metric_keys!r}: declare it there (a key, or a prefix ending in '/')")
        declared = (f"{LOOP} writes in every record" if owner == LOOP
                    else f"{label(owner)} declares (its metric_keys {owner.metric_keys!r})")
        raise ValueError(f"{label(part)} logged the metric key {key!r}, which {declared}: give each part keys of "
                         "its own")

    def owner(self, key: str) -> Part | str | None:
        """Who declared ``key``: the key itself or a prefix of it, else the part that declared "*" (None: no
        one). A dict lookup a "/" of the key: cheap enough for every key of every log step."""
        if key in self.owners:
            return self.owners[key]
        end = key.find("/")
        while end != -1:
            if key[:end + 1] in self.owners:
                return self.owners[key[:end + 1]]
            end = key.find("/", end + 1)
        return self.catch_all

    def find(self, kind: type[Part]) -> Part | None:
        """The part of class ``kind``, None if the run has none."""
        return next((part for part in self if isinstance(part, kind)), None)


def covers(entry: str, key: str) -> bool:
    """Whether the metric_keys entry ``entry`` (a key, or a prefix ending in "/") covers ``key``."""
    return key == entry or entry.endswith("/") and key.startswith(entry)


def label(part: Part) -> str:
    """A part as ``extra_parts`` names its class: "package.module:Class"."""
    return f"{type(part).__module__}:{type(part).__qualname__}"
