"""The Hessian of a checkpoint's language-model loss: its top eigenvalue and its trace.

    python -m scripts.hessian runs/NAME/ckpt.pt [--batches 4] [--batch-size 8] [--samples 100]
        [--tol 1e-4] [--max-iter 100] [--seed 0] [--device cpu|cuda] [--data-dir DIR] [--out FILE]

The curvature measures the MERIT paper compares across optimizers (on GPT-2 Small it reports a
top eigenvalue of 37.2 after AdamW against 12.3 after MERIT, a trace of 12995 against 3445). The
loss is the mean over ``--batches`` fixed batches of the checkpoint's validation split (the first
ones, cut as train.py cuts them), the same batches for every Hessian-vector product, so both
measures are of one fixed symmetric matrix: the Hessian with respect to every trainable
parameter, the model in eval mode (no dropout), in float32.

The top eigenvalue is the largest algebraic one, found by power iteration, which stops when the
Rayleigh quotient changes by less than ``--tol`` relative or after ``--max-iter`` products. The
trace is Hutchinson's estimate, the mean of z^T H z over ``--samples`` Rademacher vectors z, with
the standard error of that mean. The results go to a JSON file (default: hessian.json next to the
checkpoint), and a one-line summary to stdout.

Power iteration is slow when the two eigenvalues largest in magnitude are close (near
initialisation the spectrum is about symmetric), and its small steps can then pass --tol early,
below the true value: eigen_iterations near --max-iter says so; a smaller --tol confirms. Each
product holds one batch's double-backward graph, more than a training step's activations:
lower --batch-size if memory runs out.

The functions ``hvp``, ``top_eigenvalue`` and ``hutchinson_trace`` work on any loss closure and
list of parameters.
"""
import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm import tqdm

from atomic import atomic_write
from data.loader import TokenLoader
from data.tokenizer import get_tokenizer
from training.checkpoint import load_model

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


def _batch_loss(model, x, y) -> torch.Tensor:
    # The fused attention kernels have no second derivative; the math one is plain differentiable ops.
    with sdpa_kernel(SDPBackend.MATH):
        return model(x, y)[1]


def _validation_batches(config: dict, data_dir, batches: int, batch_size: int, block_size: int) -> list:
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


def _positive(kind):
    def parse(text):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m scripts.hessian", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by train.py (RUN/ckpt.pt)")
    parser.add_argument("--data-dir", type=Path, help="the prepared data folder (default: the checkpoint's data_dir)")
    parser.add_argument("--batches", type=_positive(int), default=4, help="fixed val batches of the loss (default 4)")
    parser.add_argument("--batch-size", type=_positive(int), default=8, help="sequences per batch (default 8)")
    parser.add_argument("--samples", type=_positive(int), default=100,
                        help="Rademacher vectors of the trace estimate, at least 2 (default 100)")
    parser.add_argument("--tol", type=_positive(float), default=1e-4,
                        help="stop the power iteration at this relative change of the eigenvalue (default 1e-4)")
    parser.add_argument("--max-iter", type=_positive(int), default=100,
                        help="Hessian-vector products of the power iteration at most; a second one runs "
                             "if the dominant eigenvalue is negative (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random vectors (default 0)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--out", type=Path,
                        help="the JSON file to write (default: hessian.json next to the checkpoint)")
    args = parser.parse_args(argv)
    if args.samples < 2:
        parser.error("--samples must be at least 2 (the trace's standard error needs two)")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a device: use cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: there is no CUDA device here; use --device cpu")

    started = time.perf_counter()
    try:
        model, checkpoint = load_model(args.checkpoint)
    except (OSError, ValueError) as e:
        sys.exit(f"hessian: {e}")
    data_dir = args.data_dir or checkpoint.config.get("data_dir")
    if data_dir is None:
        sys.exit(f"hessian: checkpoint {args.checkpoint} does not record its data_dir: give the prepared data "
                 f"folder with --data-dir")
    block_size = model.config.block_size
    try:
        batches = _validation_batches(checkpoint.config, data_dir, args.batches, args.batch_size, block_size)
    except (OSError, ValueError) as e:
        sys.exit(f"hessian: {e}")

    model.to(device)  # in eval mode (no dropout) and in float32, as load_model gives it
    params = [p for p in model.parameters() if p.requires_grad]
    loss_fns = [functools.partial(_batch_loss, model, x.to(device), y.to(device)) for x, y in batches]
    generator = torch.Generator().manual_seed(args.seed)
    eigenvalue, iterations, converged = top_eigenvalue(loss_fns, params, args.tol, args.max_iter, generator,
                                                       progress=True)
    trace, stderr = hutchinson_trace(loss_fns, params, args.samples, generator, progress=True)
    seconds = time.perf_counter() - started

    out = args.out or args.checkpoint.parent / "hessian.json"
    result = {"checkpoint": str(args.checkpoint), "step": checkpoint.step, "top_eigenvalue": eigenvalue,
              "eigen_iterations": iterations, "eigen_converged": converged, "tol": args.tol,
              "max_iter": args.max_iter, "trace": trace, "trace_stderr": stderr, "trace_samples": args.samples,
              "data_dir": str(data_dir), "split": "val", "batches": args.batches, "batch_size": args.batch_size,
              "block_size": block_size, "parameters": sum(p.numel() for p in params), "seed": args.seed,
              "device": str(device), "seconds": seconds}
    try:
        with atomic_write(out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    except OSError as e:
        sys.exit(f"hessian: cannot write {out} ({e}): the results were {json.dumps(result)}")
    print(f"{args.checkpoint} (step {checkpoint.step}): top Hessian eigenvalue {eigenvalue:.6g} "
          f"({'converged' if converged else 'NOT converged'} in {iterations} products), trace {trace:.6g} "
          f"+- {stderr:.3g} ({args.samples} samples), on {args.batches} x {args.batch_size} x {block_size} val "
          f"tokens, {seconds:.1f}s; wrote {out}")


if __name__ == "__main__":
    main()
