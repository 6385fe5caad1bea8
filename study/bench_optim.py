"""An optimizer's step timed alone on GPT-2 Small's parameter shapes, against torch's fused AdamW
interleaved with it: what scripts/bench_optim.py prints (its docstring says what and how) and
scripts/check_cuda.py's speed check runs on a GPU. ``bench``: one optimizer's step (optim's
registry by name, fused AdamW, a naive MERIT, Muon with its Newton-Schulz share); ``bench_passes``:
MERIT's two fused passes (``--passes``)."""
import statistics
import time

import torch

import optim
from optim.muon import matrix_rows, newton_schulz
from study.bench import synchronize
from training.memory import optimizer_state_bytes, tensor_bytes

try:
    from tqdm import tqdm
except ImportError:  # progress bars are optional
    def tqdm(iterable, **_):
        return iterable

# GPT-2 Small (124M, nanoGPT without biases): wte (tied with the LM head), wpe, 12 blocks, ln_f.
BLOCK = {"attn.c_attn.weight": (2304, 768), "attn.c_proj.weight": (768, 768), "mlp.c_fc.weight": (3072, 768),
         "mlp.c_proj.weight": (768, 3072), "ln_1.weight": (768,), "ln_2.weight": (768,)}
NAMED_SHAPES = {"transformer.wte.weight": (50304, 768), "transformer.wpe.weight": (1024, 768),
                **{f"transformer.h.{i}.{name}": shape for i in range(12) for name, shape in BLOCK.items()},
                "transformer.ln_f.weight": (768,)}
SHAPES = list(NAMED_SHAPES.values())


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
    if name.endswith(" (torch fused)"):  # torch's own fused SGD: the bar for ours
        momentum = float(name.removesuffix(" (torch fused)").partition(" momentum ")[2] or 0.0)
        return torch.optim.SGD(groups, lr=1e-4, momentum=momentum, weight_decay=0.0, fused=True)
    name, _, ns_dtype = name.partition(" ns ")  # e.g. "muon ns float32": Muon's other iteration dtype
    name, _, momentum = name.partition(" momentum ")  # "sgd momentum 0.9": SGD with its momentum buffer
    options = {**({"ns_dtype": ns_dtype} if ns_dtype else {}), **({"momentum": float(momentum)} if momentum else {})}
    weight_decay = 0.0 if name == "adafactor" else 0.1  # (Marek et al.'s Adafactor refuses a decay)
    groups = [{**group, "weight_decay": min(group["weight_decay"], weight_decay)} for group in groups]
    return optim.build(name, groups, lr=1e-4, weight_decay=weight_decay, batch_tokens=480 * 1024, run_steps=10_000,
                       backend="auto" if name == "adamw" else backend, **options)  # (AdamW: torch's)


def make_params(device: torch.device, dtype: torch.dtype) -> tuple[list[torch.nn.Parameter], list[dict]]:
    """GPT-2 Small's parameters (the same values on every call) and the shared builder's groups
    (optim/param_groups.py, hidden matrices apart): the decayed hidden matrices, marked for Muon
    (which leaves the embeddings to its AdamW part), and the rest undecayed; the others decay the
    embeddings too, as nanoGPT does."""
    gen = torch.Generator(device).manual_seed(0)
    params = {name: torch.nn.Parameter(0.02 * torch.randn(s, generator=gen, device=device, dtype=dtype))
              for name, s in NAMED_SHAPES.items()}
    hidden = [name for name in params if name.startswith("transformer.h.") and params[name].ndim == 2]
    rest = [name for name in params if name not in hidden]
    groups = [{"params": [params[n] for n in hidden], "names": hidden, "weight_decay": 0.1, "hidden_matrix": True},
              {"params": [params[n] for n in rest], "names": rest, "weight_decay": 0.0, "hidden_matrix": False}]
    return list(params.values()), groups


def newton_schulz_of(optimizer: torch.optim.Optimizer, grads: list[torch.Tensor]):
    """What Muon's step spends in Newton-Schulz: the iterations alone on its hidden matrices' parts."""
    group = optimizer.param_groups[0]
    by_name = dict(zip(NAMED_SHAPES, grads))

    def run():
        for name in group["names"]:
            update = by_name[name]
            for rows in matrix_rows(name, update.shape[0]):
                newton_schulz(update[rows], group["ns_coefficients"], group["ns_steps"], group["ns_eps"],
                              optimizer.ns_dtype(group, update.device))
    return run


def bench(name: str, device: torch.device, dtype: torch.dtype, steps: int, warmup: int,
          backend: str = "auto") -> tuple[float, float, float, float | None, float]:
    """(median ms of ``name``, median ms of the interleaved fused AdamW, median per-step ratio,
    Muon's median ms in Newton-Schulz or None, bytes of ``name``'s optimizer state per byte of
    parameters after the steps)."""
    gen = torch.Generator(device).manual_seed(1)
    grads = [torch.randn(s, generator=gen, device=device, dtype=dtype) for s in SHAPES]
    runs = []
    for run_name in ("adamw (fused)", name):
        params, groups = make_params(device, dtype)
        runs.append((params, make_optimizer(run_name, groups, backend), []))
    extra = ([(None, newton_schulz_of(runs[1][1], grads), [])] if name.startswith("muon") else [])
    for i in tqdm(range(warmup + steps), desc=name, leave=False):
        for _, step, times in extra:
            timed(step, device, times if i >= warmup else None)
        for params, opt, times in runs:
            set_grads(params, grads)
            timed(opt.step, device, times if i >= warmup else None)
    (_, _, base), (params, optimizer, ours) = runs
    ratio = statistics.median(t / b for t, b in zip(ours, base))
    newton_schulz_ms = 1e3 * statistics.median(extra[0][2]) if extra else None
    state = optimizer_state_bytes(optimizer) / tensor_bytes(params)
    return 1e3 * statistics.median(ours), 1e3 * statistics.median(base), ratio, newton_schulz_ms, state


def set_grads(params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    """Fresh gradients, copied in untimed before each step (MERIT and LAMB consume theirs)."""
    for p, g in zip(params, grads):
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)


def timed(fn, device: torch.device, record: list[float] | None) -> None:
    """Run ``fn``, appending its seconds (the device waited for) to ``record`` unless None (a warm-up)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    if record is not None:
        record.append(time.perf_counter() - start)


@torch.no_grad()
def bench_passes(device: torch.device, dtype: torch.dtype, steps: int, warmup: int) -> dict[str, tuple[float, float]]:
    """{sequence: (median ms, median per-step ratio to the interleaved fused AdamW)} of MERIT's passes
    on GPT-2 Small's matrices (scripts/bench_optim.py's ``--passes``)."""
    from optim import backends
    shapes = [s for s in SHAPES if len(s) == 2]
    gen = torch.Generator(device).manual_seed(1)
    grads = [torch.randn(s, generator=gen, device=device, dtype=dtype) for s in shapes]
    base_params, params = ([torch.nn.Parameter(0.02 * torch.randn(s, generator=gen, device=device, dtype=dtype))
                            for s in shapes] for _ in range(2))
    base, floor = (torch.optim.AdamW(group, lr=1e-4, fused=True) for group in (base_params, params))
    m, v = ([torch.zeros_like(p) for p in params] for _ in range(2))
    backends.prepare("auto", params)

    def passes(reduce: str, update: bool):
        for p, m_p, v_p in zip(params, m, v):
            ops = backends.select("auto", [p, p.grad, m_p, v_p], matrix=reduce == "rows_cols")
            ratios = ops.moments_and_ratios(p, p.grad, m_p, v_p, beta1=0.9, beta2=0.999, eps=1e-6, wd=0.1,
                                            reduce=reduce, l2=False)
            if update:  # MERIT's pass 2 (optim/merit.py): the whole-tensor ratio folded into the rows
                rows, cols = ((torch.maximum(ratios[0], ratios[2]), ratios[1]) if reduce == "rows_cols"
                              else (ratios[0], None))
                ops.apply_update(p, p.grad, rows, cols, lr=1e-4, clip=True, count=False)

    def torch_two_passes():
        floor.step()
        torch._foreach_add_(params, [p.grad for p in params], alpha=-1e-4)

    sequences = {"pass 1, row + column + whole maxima": lambda: passes("rows_cols", False),
                 "pass 1, whole-tensor maximum": lambda: passes("tensor", False),
                 "MERIT: pass 1 + pass 2 per tensor": lambda: passes("rows_cols", True),
                 "whole-tensor pass 1 + pass 2": lambda: passes("tensor", True),
                 "torch: fused AdamW + p -= lr*u": torch_two_passes}
    times = {name: ([], []) for name in sequences}
    for i in tqdm(range(warmup + steps), desc="passes", leave=False):
        for name, run in sequences.items():
            set_grads(base_params + params, grads + grads)
            for fn, record in ((base.step, times[name][0]), (run, times[name][1])):
                timed(fn, device, record if i >= warmup else None)
    return {name: (1e3 * statistics.median(ours), statistics.median(t / b for t, b in zip(ours, base_times)))
            for name, (base_times, ours) in times.items()}
