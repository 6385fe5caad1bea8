"""The protocol between the training loop and an optimizer, beyond ``step()``.

The loop calls, and nothing else:

* ``request_diagnostics()`` before the step of a log interval and ``pop_diagnostics()`` after it.
  Between requests an optimizer computes nothing extra and causes no host synchronisation; on a
  requested step it records 0-d tensors per parameter, and ``pop_diagnostics`` moves them to the
  host in one transfer. Keys are ``"<statistic>/<parameter name>"`` (e.g.
  ``"clip_fraction/transformer.h.3.attn.c_attn.weight"``), so a dashboard shows each statistic as
  one panel group with a curve per layer.
* ``extra_pass_due(step)`` after optimizer step ``step`` (1-based): whether the optimizer needs an
  extra pass now, such as Sophia-G's Hessian estimate every 10 steps; then ``extra_pass(gradients,
  seed)``, which gets the gradients of a loss of its own through the ``GradientFn`` it is handed
  (the training loop's forward and backward over the next global batch), never the loop itself,
  and the run's seed for any sampling it does.
* ``backends()`` and ``describe()``: which implementation steps each parameter group, for the
  start-up summary, the metrics log and the checkpoint.
* ``eval()`` before anything reads the weights as the model (validation, the probe, samples,
  zero-shot evaluation, a checkpoint) and ``train()`` before the next step: an optimizer whose
  model is evaluated at another point than its gradients are taken (Schedule-Free AdamW: its
  average x, and y) moves the parameters there and back; the others do nothing. Both are
  idempotent, and the loop calls them on every rank in step.
* ``GROUP_STATE``: the param-group keys that are the optimizer's state (Schedule-Free's step
  count and weight sum), which a resume loads with the rest of it, not the run's settings.
* ``BATCH_DECAYS``: the decays that may follow the batch (a config's ``batch_half_life_betas``
  names them; training/batch_schedule.py holds each one's half-life in tokens when the batch
  changes): ``{name: (param-group key, index in that key's tuple, or None for a number)}``, e.g.
  Adam's ``{"beta1": ("betas", 0), "beta2": ("betas", 1)}``. Each optimizer declares its own, so
  none is scaled by a guess at its key names; an optimizer with none declares ``{}``.

``TrainingHooks`` is the mixin every optimizer of this package inherits (optim/base.py and torch's
AdamW in optim/adamw.py), with the defaults: no extra passes, the torch implementation.
"""
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import Tensor, nn

# loss_fn(model, x, y, offset) -> scalar loss of micro-batch (x, y); offset: x's place in the token stream.
LossFn = Callable[[nn.Module, Tensor, Tensor, int], Tensor]
# gradients(loss_fn): a context inside which every parameter's ``.grad`` is the gradient of loss_fn,
# averaged over the next global batch (all ranks, all micro-batches) and unscaled, cleared on exit;
# it yields the model's parameters (in their training order).
GradientFn = Callable[[LossFn], AbstractContextManager[list[Tensor]]]
# The ``BATCH_DECAYS`` of an optimizer with Adam's two betas in its groups' "betas".
ADAM_BETAS: dict[str, tuple[str, int | None]] = {"beta1": ("betas", 0), "beta2": ("betas", 1)}


class TrainingHooks:
    """Mix into a torch.optim.Optimizer; its step() checks ``diagnostics_requested``."""

    _diagnostics_requested = False
    # Param-group keys that are state, not hyper-parameters: a resume keeps the checkpoint's values
    # of these (training/parallel.py) and gives every other key this run's.
    GROUP_STATE: tuple[str, ...] = ()
    BATCH_DECAYS: dict[str, tuple[str, int | None]] = {}

    def request_diagnostics(self) -> None:
        self._diagnostics_requested = True
        self._diagnostics = {}

    @property
    def diagnostics_requested(self) -> bool:
        return self._diagnostics_requested

    def record_diagnostics(self, group: dict, index: int, **stats: Tensor) -> None:
        """Record statistics of parameter ``group["params"][index]`` for this step."""
        name = group["names"][index] if "names" in group else f"group{self.param_groups.index(group)}.{index}"
        for stat, value in stats.items():
            self._diagnostics[f"{stat}/{name}"] = value.detach().float().reshape(())

    def pop_diagnostics(self) -> dict[str, float]:
        """This step's statistics as floats (one device-to-host copy); {} if none were requested."""
        self._diagnostics_requested = False
        records, self._diagnostics = getattr(self, "_diagnostics", {}), {}
        if not records:
            return {}
        values = torch.stack([v.to(next(iter(records.values())).device) for v in records.values()]).tolist()
        return dict(zip(records, values))

    def step_unless(self, found_inf: Tensor) -> None:
        """``step()``, dropped if the 0-d tensor ``found_inf`` is nonzero: decided on the device by an
        optimizer that reads torch's ``found_inf`` flag (``_step_supports_amp_scaling``: this
        package's, torch's fused AdamW), else read on the host (one sync)."""
        if getattr(self, "_step_supports_amp_scaling", False):
            self.found_inf = found_inf.float()  # as torch's GradScaler hands it over
            try:
                self.step()
            finally:
                del self.found_inf
        elif not found_inf.item():
            self.step()

    def eval(self) -> bool:
        """Put the parameters where the model is evaluated, until ``train()``; whether they moved.
        Nowhere by default: the parameters are the model."""
        return False

    def train(self) -> bool:
        """Put the parameters back where the gradients are taken; whether they moved. (Named as
        ``schedulefree``'s optimizers name the pair.)"""
        return False

    def set_batch_tokens(self, tokens: int) -> None:
        """The tokens of the coming steps' global batch, set by the training loop before the first
        step and where a batch schedule changes it; nothing scales by it by default."""

    def extra_pass_due(self, step: int) -> bool:
        """Whether an extra pass follows optimizer step ``step`` (1-based); never by default."""
        return False

    def extra_pass(self, gradients: GradientFn, seed: int) -> None:
        """The extra pass, run by the training loop where ``extra_pass_due``; ``seed``: the run's."""
        raise NotImplementedError(f"{type(self).__name__} has no extra pass")

    def backends(self) -> dict[str, str]:
        """Per parameter group ("group0", ...): the implementation that steps its tensors."""
        return {f"group{i}": "torch" for i in range(len(self.param_groups))}

    def describe(self) -> str:
        """One line per parameter group: its size, weight decay and implementation."""
        lines = []
        for (key, backend), group in zip(self.backends().items(), self.param_groups):
            numel = sum(p.numel() for p in group["params"])
            lines.append(f"  {key}: {len(group['params'])} tensors, {numel / 1e6:.2f}M elements, "
                         f"weight_decay {group['weight_decay']}: {backend}")
        return "\n".join(lines)
