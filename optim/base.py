"""The base class of this package's optimizers: what every optimizer shares, once.

A subclass holds its math, options and diagnostics only:

* ``__init__`` passes its defaults (``lr``, ``weight_decay``, ``betas`` and ``eps`` where it has
  them, and its options) and ``backend`` to ``Optimizer.__init__``;
* ``FLAGS`` names its boolean options, ``check_options(h)`` checks the others (also of each
  param group's own values);
* ``init_state(p)`` returns a new parameter's state (a float32 0-d "step" entry is counted up
  before each update);
* ``update(p, grad, state, group, index, skip, shards)`` steps one parameter, through the fused
  operations of ``self.implementation(group, *tensors, shards=shards)`` (optim/backends/),
  passing them ``skip``. p, grad and the state tensors are this rank's: the whole tensors, or,
  for a parameter FSDP2 shards by rows, the local rows, with ``shards`` (optim/sharding.py) the
  ranks that hold the others (None for a whole tensor); ``implementation`` then completes the
  trust ratios' reductions across them, and a diagnostic over the whole tensor uses
  ``sharding.total``;
* ``reduces_rows_cols(p, group)``: whether p's operations reduce per row and column (MERIT);
* ``USES_FUSED_OPERATIONS = False`` for an update written in plain torch (then ``backends()``
  reports "torch", no kernels are prepared, and ``skip`` is always None).

A step can be dropped on the device, without a host sync, the way torch's fused AdamW does it:
``_step_supports_amp_scaling`` tells torch's GradScaler (and ``step_unless``) to set a 0-d
``found_inf`` attribute before ``step``; every fused operation then gets it as ``skip`` and leaves
p and its state untouched where it is nonzero, and the "step" counters count only kept steps.

Hyper-parameters are checked here: lr >= 0, betas in [0, 1), eps >= 0 and weight_decay >= 0
(NaN rejected), each error naming the bad value.
"""
import torch
from torch import Tensor

from . import backends, sharding
from .protocol import TrainingHooks


class Optimizer(TrainingHooks, torch.optim.Optimizer):
    FLAGS: tuple[str, ...] = ()
    USES_FUSED_OPERATIONS = True  # False: the update is the subclass's own torch code
    # Attributes beyond torch's that pickling (deepcopy, torch.save of the optimizer) keeps.
    _ATTRIBUTES: tuple[str, ...] = ("backend",)

    def __init__(self, params, defaults: dict, *, backend: str = "auto"):
        if "betas" in defaults:
            defaults = {**defaults, "betas": tuple(defaults["betas"])}
        self._check(defaults)
        super().__init__(params, defaults)
        backends.check_setting(backend)
        if self.USES_FUSED_OPERATIONS:
            backends.prepare(backend, [p for group in self.param_groups for p in group["params"]])
        self.backend = backend

    @property
    def _step_supports_amp_scaling(self) -> bool:
        # Whether step() reads torch's found_inf flag: the fused operations take it; an update in
        # the subclass's own torch code (``skip`` always None) is dropped on the host instead.
        return self.USES_FUSED_OPERATIONS

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), **{name: getattr(self, name) for name in self._ATTRIBUTES}}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        # A checkpoint saved before an option existed has no value for it: use this optimizer's.
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    def add_param_group(self, param_group: dict) -> None:
        # Groups may override any hyper-parameter: check before the group joins the optimizer.
        self._check({**self.defaults, **param_group})
        super().add_param_group(param_group)

    def _check(self, h: dict) -> None:
        # Written as "not (valid)" so that NaN is rejected too.
        if not h["lr"] >= 0.0:
            raise ValueError(f"Invalid learning rate: {h['lr']} (must be >= 0)")
        for i, beta in enumerate(h.get("betas", ())):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta} (must be in [0, 1))")
        if "eps" in h and not h["eps"] >= 0.0:
            raise ValueError(f"Invalid epsilon value: {h['eps']} (must be >= 0)")
        if not h["weight_decay"] >= 0.0:
            raise ValueError(f"Invalid weight_decay value: {h['weight_decay']} (must be >= 0)")
        for key in self.FLAGS:
            if not isinstance(h[key], bool):
                raise ValueError(f"Invalid {key}: {h[key]!r} (must be True or False)")
        self.check_options(h)

    def check_options(self, h: dict) -> None:
        """Check the subclass's own options in the hyper-parameters ``h``; ValueError if bad."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if any(p.grad is not None and p.grad.is_sparse for group in self.param_groups for p in group["params"]):
            raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
        if getattr(self, "grad_scale", None) is not None:
            raise RuntimeError(f"{type(self).__name__} takes unscaled gradients: call scaler.unscale_(optimizer) "
                               f"before scaler.step(optimizer)")
        found_inf = getattr(self, "found_inf", None)
        flags = {}  # found_inf on each parameter device, as float32
        for group in self.param_groups:
            for index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                skip = None
                if found_inf is not None:
                    skip = flags.setdefault(p.device, found_inf.to(p.device, torch.float32, non_blocking=True))
                state = self.state_of(p)
                if "step" in state:
                    state["step"] = _counted(state["step"], skip)
                local_state = {key: sharding.local(value) for key, value in state.items()}
                self.update(sharding.local(p), sharding.local(p.grad), local_state, group, index, skip,
                            sharding.Shards.of(p))
        return loss

    def state_of(self, p: Tensor) -> dict:
        """p's state, created by ``init_state`` on first use."""
        state = self.state[p]
        if not state:
            state.update(self.init_state(p))
        return state

    def init_state(self, p: Tensor) -> dict:
        raise NotImplementedError

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        raise NotImplementedError

    def reduces_rows_cols(self, p: Tensor, group: dict) -> bool:
        return False

    def implementation(self, group: dict, *tensors: Tensor, shards: sharding.Shards | None = None) -> backends.Backend:
        """The backend that runs the fused operations on ``tensors`` (p first) of ``group``; with
        ``shards``, on p's local rows, its ratios completed over the ranks."""
        ops = backends.select(self.backend, list(tensors), matrix=self.reduces_rows_cols(tensors[0], group))
        return sharding.completed(ops, shards)

    def backends(self) -> dict[str, str]:
        """Per group, the backend that steps its tensors (gradients and state laid out like their
        parameters, as autograd and ``init_state`` lay them out): "cpp", or e.g. "cpp x25, torch x1"."""
        if not self.USES_FUSED_OPERATIONS:
            return super().backends()
        summary = {}
        for i, group in enumerate(self.param_groups):
            names = [self.implementation(group, sharding.local(p)).NAME for p in group["params"]]
            counts = {name: names.count(name) for name in dict.fromkeys(names)}
            summary[f"group{i}"] = (next(iter(counts)) if len(counts) == 1 else
                                    ", ".join(f"{name} x{n}" for name, n in counts.items()) or "none")
        return summary


def zeros_like(p: Tensor) -> Tensor:
    """A state tensor laid out like p."""
    return torch.zeros_like(p, memory_format=torch.preserve_format)


def _counted(counter: Tensor, skip: Tensor | None) -> Tensor:
    """The "step" counter after one more step: in place, or on the flag's device when a flag
    decides on the device whether the step counts (a CUDA flag moves the counter to CUDA)."""
    if skip is None:
        return counter.add_(1)
    return counter.to(skip.device) + (skip == 0)


def step_counter() -> Tensor:
    """The "step" state entry: a float32 0-d CPU tensor, as torch's optimizers keep it."""
    return torch.tensor(0.0, dtype=torch.float32)
