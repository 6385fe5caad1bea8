"""MERIT (Luo et al., ICML 2025), exactly as optimizers.md specifies.

Per tensor, structured as the spec's two passes (a later fused kernel makes each one sweep):
  pass 1: update m and v, form u, reduce the max-ratios of |p| (before the update) and |u|;
  pass 2: p -= lr * clamp(s * u, -1, 1).
Everything is vectorised per tensor; only the loop over tensors is in Python.
"""
import torch
from torch import Tensor


class MERIT(torch.optim.Optimizer):
    """MERIT optimizer.

    Defaults are the authors' constructor defaults (lr=1e-3, betas=(0.9, 0.999), eps=1e-6,
    weight_decay=0); their README recommends lr=2e-4, weight_decay=1e-2, betas=(0.9, 0.95).
    Every param group may override lr, betas, eps and weight_decay.

    State per parameter: "step" (float32 scalar tensor, a counter only: MERIT has no bias
    correction), "exp_avg" (m) and "exp_avg_sq" (v).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        _check_hyperparameters(defaults)
        super().__init__(params, defaults)
        self._workspaces = {}

    def __setstate__(self, state: dict) -> None:
        # Unpickling (deepcopy, torch.load of the optimizer) bypasses __init__.
        super().__setstate__(state)
        self._workspaces = {}

    def add_param_group(self, param_group: dict) -> None:
        # Groups may override any hyper-parameter: check before the group joins the optimizer.
        _check_hyperparameters({**self.defaults, **param_group})
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("MERIT does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                u, scratch = self._workspace(p)
                ratio = _pass1(p, p.grad, state["exp_avg"], state["exp_avg_sq"], u, scratch,
                               beta1, beta2, group["eps"], group["weight_decay"])
                _pass2(p, u, ratio, group["lr"], scratch)
        return loss

    def _workspace(self, p: Tensor) -> tuple[Tensor, Tensor]:
        """Two p-shaped temporaries (u and a scratch buffer), views of one reused buffer.

        Allocating them per tensor and step cost more than all the arithmetic on CPU (the pages
        of every fresh full-size tensor are faulted in again); the buffer costs 2x the largest
        parameter, is not optimizer state and is not saved.
        """
        key = (p.device, p.dtype)
        buf = self._workspaces.get(key)
        if buf is None or buf.numel() < 2 * p.numel():
            buf = self._workspaces[key] = torch.empty(2 * p.numel(), dtype=p.dtype, device=p.device)
        n = p.numel()
        return buf[:n].view(p.shape), buf[n:2 * n].view(p.shape)


def _check_hyperparameters(h: dict) -> None:
    lr, (beta1, beta2), eps, wd = h["lr"], h["betas"], h["eps"], h["weight_decay"]
    # Written as "not (valid)" so that NaN is rejected too.
    if not lr >= 0.0:
        raise ValueError(f"Invalid learning rate: {lr} (must be >= 0)")
    for i, beta in enumerate((beta1, beta2)):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta} (must be in [0, 1))")
    if not eps >= 0.0:
        raise ValueError(f"Invalid epsilon value: {eps} (must be >= 0)")
    if not wd >= 0.0:
        raise ValueError(f"Invalid weight_decay value: {wd} (must be >= 0)")


def _pass1(p: Tensor, g: Tensor, m: Tensor, v: Tensor, u: Tensor, scratch: Tensor,
           beta1: float, beta2: float, eps: float, wd: float) -> tuple[Tensor, ...]:
    """Update m, v in place, write u into ``u``; return the ratio s (vectors) or its factors.

    For a matrix the factors are ``(rows, cols)``: rows = max(r_i, b) of shape (R, 1, ...),
    cols = c_j of shape (1, C, ...), so that s = max(rows, cols). NaN marks "s = 1" (zero guard).
    """
    m.lerp_(g, 1 - beta1)                          # m = b1*m + (1-b1)*g, in one pass
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v = b2*v + (1-b2)*g*g
    torch.sqrt(v, out=u).add_(eps)                 # no bias correction; eps outside the sqrt
    torch.div(m, u, out=u)
    if wd != 0:
        u.add_(p, alpha=wd)                        # wd folded into u BEFORE the ratios
    if p.ndim < 2:
        # Vectors (biases, LayerNorm): the weight-wise ratio only.
        return (_ratio(torch.abs(p, out=scratch).amax(), torch.abs(u, out=scratch).amax()),)
    # Matrices: rows = dim 0, columns = dim 1; further dims are not reduced (spec), which matches
    # the authors' amax(dim=1) / amax(dim=0). All maxima use p before this step's update.
    torch.abs(p, out=scratch)
    p_rows, p_cols = scratch.amax(1, keepdim=True), scratch.amax(0, keepdim=True)
    torch.abs(u, out=scratch)
    u_rows, u_cols = scratch.amax(1, keepdim=True), scratch.amax(0, keepdim=True)
    b = _ratio(p_rows.amax(), u_rows.amax())       # weight-wise ratio from the row maxima
    # s_ij = max(r_i, c_j, b): fold the lower bound b into the (small) row factor. NaN propagates
    # through torch.maximum, so a zero guard on the row, the column or b forces s_ij = 1.
    return torch.maximum(_ratio(p_rows, u_rows), b), _ratio(p_cols, u_cols)


def _pass2(p: Tensor, u: Tensor, ratio: tuple[Tensor, ...], lr: float, scratch: Tensor) -> None:
    """p = p - lr * clamp(s * u, -1, 1), consuming u."""
    s = ratio[0] if len(ratio) == 1 else torch.maximum(*ratio, out=scratch)
    # Zero guards: s = 1. nan_to_num also turns an overflowed ratio (finite/denormal) from inf
    # into the largest finite value, which clips identically except that 0 * s stays 0, not NaN.
    s.nan_to_num_(nan=1.0)
    u.mul_(s).clamp_(-1.0, 1.0)                    # clip AFTER scaling, sign kept
    p.add_(u, alpha=-lr)


def _ratio(p_max: Tensor, u_max: Tensor) -> Tensor:
    """p_max / u_max, NaN where either is 0 (the spec's "s = 1" guard; also hides x/0)."""
    return (p_max / u_max).masked_fill_((p_max == 0) | (u_max == 0), float("nan"))
