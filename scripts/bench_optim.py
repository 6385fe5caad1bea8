"""Step time of every registered optimizer on GPT-2 Small parameter shapes.

    python -m scripts.bench_optim [--device cpu] [--dtype float32] [--steps 10] [--warmup 2] [--backend auto]

Times ``optimizer.step()`` alone (fresh gradients are copied in before each step, untimed) for
every name in ``optim.available()`` on ``--backend`` (optim/backends/) and for a naive MERIT
written straight from docs/optimizers.md the way the authors' code is (a per-tensor loop that materialises every temporary). Each optimizer's
steps alternate with those of a ``torch.optim.AdamW(fused=True)`` on its own copy of the
parameters, so that the ratio compares steps taken under the same conditions (a shared machine's
speed drifts by tens of percent). Prints the median over ``--steps`` steps after ``--warmup``:
ms per step, and the median of the per-step ratios to the interleaved fused AdamW.
"""
import argparse
import statistics
import time

import torch

import optim

try:
    from tqdm import tqdm
except ImportError:  # progress bars are optional
    def tqdm(iterable, **_):
        return iterable

# GPT-2 Small (124M, nanoGPT without biases): wte (tied with the LM head), wpe, 12 blocks, ln_f.
BLOCK = [(2304, 768), (768, 768), (3072, 768), (768, 3072), (768,), (768,)]
SHAPES = [(50304, 768), (1024, 768)] + BLOCK * 12 + [(768,)]


class NaiveMERIT(torch.optim.Optimizer):
    """docs/optimizers.md's MERIT as a plain per-tensor loop with full-size temporaries."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            (beta1, beta2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["m"], state["v"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                u = m / (v.sqrt() + eps) + wd * p
                p_abs, u_abs = p.abs(), u.abs()
                if p.ndim >= 2:
                    p_row, u_row = p_abs.amax(1, keepdim=True), u_abs.amax(1, keepdim=True)
                    p_col, u_col = p_abs.amax(0, keepdim=True), u_abs.amax(0, keepdim=True)
                    s = torch.maximum(torch.maximum(p_row / u_row, p_col / u_col), p_abs.max() / u_abs.max())
                    guard = (p_row == 0) | (u_row == 0) | (p_col == 0) | (u_col == 0)
                else:
                    s = p_abs.max() / u_abs.max()
                    guard = (p_abs.max() == 0) | (u_abs.max() == 0)
                s = torch.where(guard, torch.ones_like(s), s)
                p.add_(torch.clamp(s * u, -1, 1), alpha=-lr)


def make_optimizer(name: str, groups: list[dict], backend: str) -> torch.optim.Optimizer:
    if name == "adamw (fused)":
        return torch.optim.AdamW(groups, lr=1e-4, fused=True)
    if name == "naive merit":
        return NaiveMERIT(groups, lr=1e-4)
    return optim.build(name, groups, lr=1e-4, weight_decay=0.1, batch_tokens=480 * 1024,
                       backend="auto" if name == "adamw" else backend)


def make_params(device: torch.device, dtype: torch.dtype) -> tuple[list[torch.nn.Parameter], list[dict]]:
    """GPT-2 Small's parameters (the same values on every call) and nanoGPT's decay groups."""
    gen = torch.Generator(device).manual_seed(0)
    params = [torch.nn.Parameter(0.02 * torch.randn(s, generator=gen, device=device, dtype=dtype)) for s in SHAPES]
    return params, [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                    {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def bench(name: str, device: torch.device, dtype: torch.dtype, steps: int, warmup: int,
          backend: str = "auto") -> tuple[float, float, float]:
    """(median ms of ``name``, median ms of the interleaved fused AdamW, median per-step ratio)."""
    gen = torch.Generator(device).manual_seed(1)
    grads = [torch.randn(s, generator=gen, device=device, dtype=dtype) for s in SHAPES]
    runs = []
    for run_name in ("adamw (fused)", name):
        params, groups = make_params(device, dtype)
        runs.append((params, make_optimizer(run_name, groups, backend), []))
    for i in tqdm(range(warmup + steps), desc=name, leave=False):
        for params, opt, times in runs:
            for p, g in zip(params, grads):  # MERIT and LAMB consume the gradient
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
            sync(device)
            start = time.perf_counter()
            opt.step()
            sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - start)
    (_, _, base), (_, _, ours) = runs
    ratio = statistics.median(t / b for t, b in zip(ours, base))
    return 1e3 * statistics.median(ours), 1e3 * statistics.median(base), ratio


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per optimizer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (state, build)")
    parser.add_argument("--backend", default="auto", choices=optim.BACKENDS, help="who runs the fused operations")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    names = [*optim.available(), "naive merit"]
    n_params = sum(torch.Size(s).numel() for s in SHAPES)
    print(f"GPT-2 Small shapes: {len(SHAPES)} tensors, {n_params / 1e6:.1f}M parameters, {args.dtype} on "
          f"{device} ({torch.get_num_threads()} threads), optim_backend {args.backend!r}; median of "
          f"{args.steps} steps after {args.warmup}")
    print(f"{'optimizer':<16}{'ms/step':>10}{'fused AdamW ms':>16}{'ratio':>8}")
    for name in names:
        ms, base, ratio = bench(name, device, dtype, args.steps, args.warmup, args.backend)
        print(f"{name:<16}{ms:>10.1f}{base:>16.1f}{ratio:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
