"""The Hessian of a loss: Hessian-vector products, the top eigenvalue (power iteration) and the
trace (Hutchinson), for any loss closure and parameters, and a checkpoint's validation loss on
fixed batches (the CLI is scripts/hessian.py, whose docstring says what is measured and how).

Power iteration is slow when the two eigenvalues largest in magnitude are close (near
initialisation the spectrum is about symmetric), and its small steps can then pass ``tol``
early, below the true value: an iteration count near ``max_iter`` says so.
"""
import math
from collections.abc import Callable, Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm import tqdm

from data.loader import TokenLoader
from data.tokenizer import get_tokenizer

Loss = Callable[[], torch.Tensor] | Sequence[Callable[[], torch.Tensor]]
Vectors = list[torch.Tensor]  # one tensor per parameter: a vector of the parameter space


def hvp(loss_fn: Loss, params: Sequence[torch.Tensor], v: Vectors) -> Vectors:
    """H v, H the Hessian of the loss with respect to ``params`` at their values, by double
    backprop. ``loss_fn`` is a closure returning the scalar loss, or a sequence of closures whose
    mean is the loss (one per batch, say): those are differentiated one at a time, so only one
    double-backward graph is held at once."""
    closures = [loss_fn] if callable(loss_fn) else list(loss_fn)
    total = [torch.zeros_like(p) for p in params]
    with torch.enable_grad():
        for closure in closures:
            # materialize_grads: a parameter the loss does not (or only linearly) depend on has a
            # zero row in H, not an error.
            grads = torch.autograd.grad(closure(), params, create_graph=True, materialize_grads=True)
            grad_dot_v = sum((g * u).sum() for g, u in zip(grads, v))
            if grad_dot_v.requires_grad:  # else the loss is linear in params: this batch adds nothing
                products = torch.autograd.grad(grad_dot_v, params, materialize_grads=True)
                for t, hv in zip(total, products):
                    t.add_(hv, alpha=1 / len(closures))
    return total


def dot(a: Vectors, b: Vectors) -> float:
    """The inner product of two vectors of the parameter space, accumulated in float64."""
    return sum(torch.sum(x * y, dtype=torch.float64).item() for x, y in zip(a, b))


def _power_iteration(loss_fn: Loss, params, v: Vectors, shift: float, tol: float, budget: int,
                     bar: tqdm) -> tuple[float, int, bool]:
    """Power iteration on H - shift I from the unit vector v: (the last Rayleigh quotient
    v^T H v, products used, whether it changed by less than tol relative)."""
    rayleigh = None
    for i in range(1, budget + 1):
        hv = hvp(loss_fn, params, v)
        new = dot(v, hv)
        bar.update()
        bar.set_postfix(eigenvalue=f"{new:.6g}", refresh=False)
        if rayleigh is not None and abs(new - rayleigh) <= tol * abs(new):
            return new, i, True
        rayleigh = new
        w = [h - shift * u for h, u in zip(hv, v)]
        norm = math.sqrt(dot(w, w))
        if norm == 0:  # v is an eigenvector of H with eigenvalue shift (of a zero H, say)
            return new, i, True
        v = [x / norm for x in w]
    return rayleigh, budget, False


def top_eigenvalue(loss_fn: Loss, params: Sequence[torch.Tensor], tol: float = 1e-4, max_iter: int = 100,
                   generator: torch.Generator | None = None, progress: bool = False) -> tuple[float, int, bool]:
    """(the largest algebraic eigenvalue of the loss's Hessian, Hessian-vector products used,
    whether it converged), by power iteration from a random start drawn from ``generator`` (on
    the CPU, so a seed gives the same start on every device).

    Power iteration finds the eigenvalue largest in magnitude. When that one is negative, a
    second power iteration on H - lambda I (whose eigenvalues are all >= 0 then, the largest
    being lambda_max - lambda) finds the largest one, from the same start. ``max_iter`` bounds
    the products of each; the count returned is of both. (Like every power iteration it is
    fooled by two dominant eigenvalues of exactly equal magnitude and opposite sign: the Rayleigh
    quotient of their mixture does not change, and that is returned as converged.)"""
    start = [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for p in params]
    norm = math.sqrt(dot(start, start))
    start = [x / norm for x in start]
    with tqdm(total=max_iter, desc="top eigenvalue", unit="hvp", disable=not progress) as bar:
        dominant, used, converged = _power_iteration(loss_fn, params, start, 0.0, tol, max_iter, bar)
        if dominant >= 0 or not converged:
            return dominant, used, converged
        bar.reset(total=max_iter)
        bar.set_description("top eigenvalue, shifted")
        largest, more, converged = _power_iteration(loss_fn, params, start, dominant, tol, max_iter, bar)
    return largest, used + more, converged


def hutchinson_trace(loss_fn: Loss, params: Sequence[torch.Tensor], samples: int = 100,
                     generator: torch.Generator | None = None, progress: bool = False) -> tuple[float, float]:
    """(Hutchinson's estimate of the trace of the loss's Hessian, its standard error): the mean of
    z^T H z over ``samples`` Rademacher vectors z drawn from ``generator`` (on the CPU)."""
    if samples < 2:
        raise ValueError(f"hutchinson_trace needs at least 2 samples for a standard error, got {samples}")
    values = []
    for _ in tqdm(range(samples), desc="trace", unit="hvp", disable=not progress):
        z = [(2 * torch.randint(0, 2, p.shape, generator=generator) - 1).to(p.device, p.dtype) for p in params]
        values.append(dot(z, hvp(loss_fn, params, z)))
    values = torch.tensor(values, dtype=torch.float64)
    return values.mean().item(), (values.std() / math.sqrt(samples)).item()


def batch_loss(model, x, y) -> torch.Tensor:
    # The fused attention kernels have no second derivative; the math one is plain differentiable ops.
    with sdpa_kernel(SDPBackend.MATH):
        return model(x, y)[1]


def validation_batches(config: dict, data_dir, batches: int, batch_size: int, block_size: int) -> list:
    """The first ``batches`` batches of the val split, cut as train.py's validation loader cuts
    them; an error if the split holds fewer (the loader would start it over)."""
    tokenizer = get_tokenizer(config["tokenizer"])
    loader = TokenLoader(data_dir, "val", batch_size, block_size, prefetch=False,
                         align_documents=config.get("align_documents", False), eot_token=tokenizer.eot_token,
                         vocab_size=tokenizer.n_vocab)
    found = []
    for _ in range(batches):
        found.append(loader.next_batch())
        if loader.position >= loader.split_tokens:  # that batch ran past the end
            raise ValueError(f"the 'val' split of {data_dir} has {loader.split_tokens:,} tokens, too few for "
                             f"--batches {batches} x --batch-size {batch_size} x block_size {block_size}: "
                             f"use fewer or smaller batches")
    return found


