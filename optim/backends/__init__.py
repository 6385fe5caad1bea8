"""The optimizers' implementation boundary: the fused operations, declared once, and the one
function that picks who runs them.

The step of every optimizer of this package is memory-bound, so its element-wise work is a few
fused operations that sweep each tensor once or twice (docs/optimizers.md, "Implementation"):

* ``moments_and_ratios`` (MERIT, LAMB pass 1) reads p, g, m, v; writes m, v and the update
  direction ``u = m * m_scale / (sqrt(v) * v_scale + eps) + wd * p`` INTO THE GRADIENT'S STORAGE
  (the gradient is consumed, as apex's FusedLAMB does with its update); returns the trust ratios
  ``min(N(p), max_p_norm) / N(u)``, with p before the update and N the max norm (or the l2 norm
  if ``l2``): ``reduce="none"`` -> (); ``"tensor"`` -> (ratio,), 0-d; ``"rows_cols"`` (a matrix)
  -> (row ratios (R, 1, ...), column ratios (1, C, ...), whole-tensor ratio), rows reduced over
  dim 1 and columns over dim 0, further dims not reduced. A ratio is NaN where N(p) or N(u) is 0
  (the zero guard); one that overflows is the largest finite value. In p's dtype.
* ``apply_update`` (pass 2) reads p and u, writes p: ``p -= lr * [clamp](s * u, -1, 1)`` with
  ``s = max(rows_i, cols_j)``, one s for the whole tensor (``rows`` 0-d, ``cols`` None) or s = 1
  (``rows`` None); NaN means s = 1. Overwrites u. Returns the number of |s * u| > 1 if ``count``.
* ``lion_step``: ``p *= 1 - lr*wd; p -= lr * sign(lerp(m, g, 1-beta1)); m = lerp(m, g, 1-beta2)``.
* ``sophia_step``: ``p *= 1 - lr*wd; m = lerp(m, g, 1-beta1); p -= lr * clamp(m / (scale*h + eps), -1, 1)``.
* ``ademamix_step``: ``m1 = b1*m1 + (1-b1)*g; m2 = b3*m2 + (1-b3)*g; v = b2*v + (1-b2)*g*g;
  p -= lr * ((m1/bias_correction1 + alpha*m2) / (sqrt(v)/sqrt(bias_correction2) + eps) + wd*p)``, in
  the authors' order (apple/ml-ademamix); the optimizer computes this step's alpha and b3. May
  consume the gradient (the torch reference builds the update in its storage).
* ``schedulefree_step`` (Schedule-Free AdamW; y the parameter): ``v = b2*v + (1-b2)*g*g;
  u = g / (sqrt(v / bias_correction2) + eps) + wd*y; y = lerp(y, z, ckp1) + y_lr*u; z -= lr*u``, in
  ``schedulefree.AdamWScheduleFree.step``'s order; the optimizer computes lr, ckp1, y_lr and the bias
  correction. May consume the gradient (the torch reference builds u in its storage, as the package does).
* ``mars_correction`` (MARS-AdamW's variance-reduced gradient, before torch's fused AdamW takes it):
  ``c = g + scale*(g - g_prev)`` (``(g - g_prev)*scale`` rounded, then added to g) INTO THE
  GRADIENT'S STORAGE, ``g_prev = g`` (the gradient as it came); returns the sum of c^2 (0-d, float32;
  float64 for float64 tensors), from which the optimizer takes ||c|| and clips c. Under ``skip``, c
  is computed all the same (AdamW's own flag drops it) and g_prev kept.
* ``sgd_step`` (torch.optim.SGD's step, no dampening or Nesterov): ``d = g + wd*p`` (if wd);
  with a momentum buffer ``buf = momentum*buf + d; d = buf``; ``p -= lr*d``, each ``add`` with an
  alpha a fused multiply-add as torch's is, so that it is torch's SGD bitwise.
* Adafactor's sweeps (optim/adafactor.py has the rule), in the compute dtype, u never stored:
  ``adafactor_statistics`` (a factored matrix's row means and column sums of g*g + 1e-30),
  ``adafactor_factored_sums`` and ``adafactor_unfactored_sums`` (the latter first updates v:
  ``v = beta*v + w*(g*g + 1e-30)``) return (sum(u*u), sum(p*p)), from which the optimizer takes the
  clip's divisor and the parameter scale; ``adafactor_factored_apply`` and
  ``adafactor_unfactored_apply`` compute u again and write ``p += ((u / divisor) * -lr) * scale``
  (no division without a divisor).

Each takes an optional ``skip``: a 0-d tensor on the tensors' device (torch's ``found_inf``);
where it is nonzero the operation leaves p and its state as they were (the gradient, consumed,
may hold anything afterwards). It is read on the device (the C++ kernels' CPU flag on the host,
where that costs nothing), so dropping a non-finite step needs no host sync.

Three modules implement all of them with the signatures of ``Backend`` below:

=========  ==============================  =========================================================
name       module                          takes
=========  ==============================  =========================================================
torch      optim/backends/reference.py     anything (the reference the kernels are tested against)
cpp        optim/backends/cpp.py           contiguous CPU tensors of one dtype (fp32, bf16, fp64)
triton     optim/backends/triton.py        contiguous CUDA tensors of one dtype (fp32, bf16, fp64)
=========  ==============================  =========================================================

What the two kernel backends share (the tensors their kernels take, the kernels' form of pass 2's
factors, the one warning of a fallback to the reference) is in optim/backends/common.py.

The ``optim_backend`` setting (``optim.build(..., backend=)``, the config's ``optim_backend``)
is "auto" (C++ for CPU tensors, Triton for CUDA tensors), or one name: then that backend runs
every operation whose tensors it takes, and the torch reference the others. ``check_setting`` is
the one check of a setting's name, with the one error message. ``prepare`` makes a setting's
backends ready (building the C++ extension is this explicit, logged step); ``select`` is then a
pure function of the setting and the tensors.
"""
from __future__ import annotations

import math
from typing import Protocol

from torch import Tensor

from . import cpp, reference, triton

SETTINGS = ("auto", "torch", "cpp", "triton")
BY_NAME = {"torch": reference, "cpp": cpp, "triton": triton}
# What "auto" tries for a tensor on each device type.
AUTO = {"cpu": cpp, "cuda": triton}


class Backend(Protocol):
    """The fused operations (the module docstring says what each computes)."""

    NAME: str

    def moments_and_ratios(self, p: Tensor, g: Tensor, m: Tensor, v: Tensor, *, beta1: float, beta2: float,
                           eps: float, wd: float, reduce: str, l2: bool, m_scale: float = 1.0,
                           v_scale: float = 1.0, max_p_norm: float = math.inf,
                           skip: Tensor | None = None) -> tuple[Tensor, ...]: ...

    def apply_update(self, p: Tensor, u: Tensor, rows: Tensor | None, cols: Tensor | None, *, lr: float,
                     clip: bool, count: bool, skip: Tensor | None = None) -> Tensor | None: ...

    def lion_step(self, p: Tensor, g: Tensor, m: Tensor, *, lr: float, wd: float, beta1: float,
                  beta2: float, skip: Tensor | None = None) -> None: ...

    def sophia_step(self, p: Tensor, g: Tensor, m: Tensor, h: Tensor, *, lr: float, wd: float, beta1: float,
                    scale: float, eps: float, skip: Tensor | None = None) -> None: ...

    def ademamix_step(self, p: Tensor, g: Tensor, m1: Tensor, m2: Tensor, v: Tensor, *, lr: float, wd: float,
                      beta1: float, beta2: float, beta3: float, alpha: float, bias_correction1: float,
                      bias_correction2: float, eps: float, skip: Tensor | None = None) -> None: ...

    def schedulefree_step(self, y: Tensor, g: Tensor, z: Tensor, v: Tensor, *, lr: float, y_lr: float, ckp1: float,
                          wd: float, beta2: float, bias_correction2: float, eps: float,
                          skip: Tensor | None = None) -> None: ...

    def mars_correction(self, g: Tensor, g_prev: Tensor, *, scale: float, skip: Tensor | None = None) -> Tensor: ...

    def sgd_step(self, p: Tensor, g: Tensor, buf: Tensor | None, *, lr: float, momentum: float, wd: float,
                 skip: Tensor | None = None) -> None: ...

    def adafactor_statistics(self, g: Tensor) -> tuple[Tensor, Tensor]: ...

    def adafactor_factored_sums(self, p: Tensor, g: Tensor, row: Tensor, col: Tensor, *,
                                rows_first: bool) -> Tensor: ...

    def adafactor_factored_apply(self, p: Tensor, g: Tensor, row: Tensor, col: Tensor, *, rows_first: bool,
                                 divisor: Tensor | None, lr: float, scale: Tensor,
                                 skip: Tensor | None = None) -> None: ...

    def adafactor_unfactored_sums(self, p: Tensor, g: Tensor, v: Tensor, *, beta: float, w: float,
                                  skip: Tensor | None = None) -> Tensor: ...

    def adafactor_unfactored_apply(self, p: Tensor, g: Tensor, v: Tensor, *, divisor: Tensor | None, lr: float,
                                   scale: Tensor, skip: Tensor | None = None) -> None: ...


def check_setting(setting: str) -> None:
    """ValueError unless ``setting`` is one of ``SETTINGS``."""
    if setting not in SETTINGS:
        raise ValueError(f"optim_backend={setting!r}: use one of {', '.join(map(repr, SETTINGS))}")


def prepare(setting: str, tensors: list[Tensor]) -> None:
    """Make ready the backends that ``setting`` may pick for ``tensors``: build (or load) the C++
    extension, import Triton; each once per process, logged. Under "auto" a backend that cannot
    be made ready is one warning (its tensors run the reference); a named one that cannot, or
    that takes none of the tensors, is an error that says what to do instead."""
    check_setting(setting)
    if setting == "torch":
        return
    if setting == "auto":
        for device_type in sorted({t.device.type for t in tensors}):
            if device_type in AUTO:
                AUTO[device_type].load(required=False)
        return
    backend = BY_NAME[setting]
    backend.load(required=True)
    if tensors and not any(backend.takes([t]) for t in tensors):
        devices = ", ".join(sorted({str(t.device) for t in tensors}))
        raise ValueError(f"optim_backend={setting!r} takes none of these parameters (on {devices}; "
                         f"{backend.TAKES}): use optim_backend='auto', or move the model")


def select(setting: str, tensors: list[Tensor], *, matrix: bool = False) -> Backend:
    """The backend that runs an operation on ``tensors`` (p first; ``matrix``: p is reduced per row
    and column) under ``setting``: the setting's backend where it is ready and takes them, else
    the torch reference."""
    candidate = AUTO.get(tensors[0].device.type) if setting == "auto" else BY_NAME[setting]
    if candidate is not None and candidate.ready() and candidate.takes(tensors, matrix=matrix):
        return candidate
    return reference
