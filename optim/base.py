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

A step does the math and little else (at batch 1 a small model's optimizer step is mostly
per-parameter Python: docs/performance.md, "Small batches"): what does not change from step to
step is kept per parameter (``_Plan``: its row sharding, whether it is whole here, the backend each
call of ``implementation`` chose), the "step" counters are counted in one operation, and the plans
are made again when a parameter in a group is another tensor, when a group is added and when the
state is loaded (or unpickled).

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


class _Plan:
    """What a step keeps of one parameter from step to step."""

    __slots__ = ("param", "shards", "backends")

    def __init__(self, param: Tensor):
        self.param = param  # the tensor planned for (a group's list may have changed since)
        self.shards = sharding.Shards.of(param)  # None: a plain tensor, whole here, as are its gradient and state
        # implementation()'s choices for it: {key: (backend, the key's tensors, kept so that their ids stay theirs)}
        self.backends: dict[tuple, tuple[backends.Backend, tuple[Tensor, ...]]] = {}


# The choices a plan keeps at most: an update calls implementation() with a few sets of tensors; one
# handing it new tensors at every step (a subclass replacing its state) starts the plan's choices over.
_CHOICES_PER_PARAMETER = 4


class Optimizer(TrainingHooks, torch.optim.Optimizer):
    FLAGS: tuple[str, ...] = ()
    USES_FUSED_OPERATIONS = True  # False: the update is the subclass's own torch code
    # Attributes beyond torch's that pickling (deepcopy, torch.save of the optimizer) keeps.
    _ATTRIBUTES: tuple[str, ...] = ("backend",)
    # During step(), the plan and the (local) gradient of the parameter being updated: implementation() reads them.
    _stepping: tuple[_Plan, Tensor] | None = None

    def __init__(self, params, defaults: dict, *, backend: str = "auto"):
        if "betas" in defaults:
            defaults = {**defaults, "betas": tuple(defaults["betas"])}
        self._check(defaults)
        self._plans: list[list[_Plan]] = []  # each group's parameters' (_current_plans)
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
        # (Also load_state_dict's last act: the plans' choices were made for the state it replaced.)
        super().__setstate__(state)
        self._plans = []
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
        stepped = []  # (group, index, plan, gradient) of each parameter with a gradient, in the groups' order
        for group, plans in zip(self.param_groups, self._current_plans()):
            for index, plan in enumerate(plans):
                grad = plan.param.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                stepped.append((group, index, plan, grad))
        if getattr(self, "grad_scale", None) is not None:
            raise RuntimeError(f"{type(self).__name__} takes unscaled gradients: call scaler.unscale_(optimizer) "
                               f"before scaler.step(optimizer)")
        found_inf = getattr(self, "found_inf", None)
        skips = {}  # found_inf on each parameter device, as float32
        states = []
        counted = {}  # {parameter device: the states whose "step" counts}
        for group, index, plan, grad in stepped:
            device = plan.param.device
            if found_inf is not None and device not in skips:
                skips[device] = found_inf.to(device, torch.float32, non_blocking=True)
            state = self.state_of(plan.param)
            states.append(state)
            if "step" in state:
                counted.setdefault(device, []).append(state)
        for device, counting in counted.items():
            _count(counting, skips.get(device))
        try:
            for (group, index, plan, grad), state in zip(stepped, states):
                p, shards = plan.param, plan.shards
                if shards is None:  # (a whole tensor: its own local part)
                    local_state = dict(state)
                else:
                    p, grad, local_state = sharding.local(p), sharding.local(grad), {
                        key: sharding.local(value) for key, value in state.items()}
                self._stepping = plan, grad
                self.update(p, grad, local_state, group, index, skips.get(plan.param.device), shards)
        finally:
            self._stepping = None
        return loss

    def _current_plans(self) -> list[list[_Plan]]:
        """Each group's parameters' plans, made again for a group whose parameters are not those
        planned for (a group added, a tensor replaced: FSDP2's fully_shard makes new ones)."""
        if len(self._plans) != len(self.param_groups):
            self._plans = [[] for _ in self.param_groups]
        for i, group in enumerate(self.param_groups):
            params, plans = group["params"], self._plans[i]
            if len(plans) != len(params) or any(plan.param is not p for plan, p in zip(plans, params)):
                self._plans[i] = [_Plan(p) for p in params]
        return self._plans

    def state_of(self, p: Tensor) -> dict:
        """p's state, created by ``init_state`` on first use."""
        state = self.state[p]
        if not state:
            state.update(self.init_state(p))
        return state

    def init_state(self, p: Tensor) -> dict:
        raise NotImplementedError

    def group_of(self, p: Tensor) -> dict:
        """The param group that holds p (an ``init_state`` reads its options)."""
        return next(group for group in self.param_groups if any(q is p for q in group["params"]))

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        raise NotImplementedError

    def reduces_rows_cols(self, p: Tensor, group: dict) -> bool:
        return False

    def implementation(self, group: dict, *tensors: Tensor, shards: sharding.Shards | None = None) -> backends.Backend:
        """The backend that runs the fused operations on ``tensors`` (p first) of ``group``; with
        ``shards``, on p's local rows, its ratios completed over the ranks."""
        matrix = self.reduces_rows_cols(tensors[0], group)
        if self._stepping is None or shards is not None:  # (a row shard's local tensors are new views each step)
            return sharding.completed(backends.select(self.backend, list(tensors), matrix=matrix), shards)
        # Once prepared, select is a pure function of the setting, ``matrix`` and the tensors'
        # devices, dtypes, dims and contiguity, which stay with a tensor: the choice is kept per
        # tensor (by id, the tensors kept with it). The gradient is a new tensor each step, with its
        # parameter's dtype, device and shape (torch holds it to them): only its contiguity counts.
        plan, grad = self._stepping
        key = (self.backend, matrix, *(("gradient", t.is_contiguous()) if t is grad else id(t) for t in tensors))
        chosen = plan.backends.get(key)
        if chosen is None:
            if len(plan.backends) == _CHOICES_PER_PARAMETER:
                plan.backends.clear()
            chosen = plan.backends[key] = (backends.select(self.backend, list(tensors), matrix=matrix),
                                           tuple(t for t in tensors if t is not grad))
        return chosen[0]

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


def _count(states: list[dict], skip: Tensor | None) -> None:
    """Each state's "step" counter one step on, all in one operation: in place, or where a flag
    decides on the device whether the step counts, by the flag, on its device (a CUDA flag moves a
    CPU counter to CUDA)."""
    counters = [state["step"] for state in states]
    if skip is None:
        torch._foreach_add_(counters, 1)
        return
    counters, kept = [counter.to(skip.device) for counter in counters], skip == 0
    # (A list of the bool flag, not the flag as a scalar: foreach kernels of any device and dtype take that.)
    torch._foreach_add_(counters, [kept] * len(counters))
    for state, counter in zip(states, counters):
        state["step"] = counter


def step_counter() -> Tensor:
    """The "step" state entry: a float32 0-d CPU tensor, as torch's optimizers keep it."""
    return torch.tensor(0.0, dtype=torch.float32)
