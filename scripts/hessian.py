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
checkpoint) with the model they are of (the checkpoint, its step and ``model_sha256``, the hash of
its weights, which scripts/report.py checks against the run's checkpoints), and a one-line
summary to stdout.

Power iteration is slow when the two eigenvalues largest in magnitude are close (near
initialisation the spectrum is about symmetric), and its small steps can then pass --tol early,
below the true value: eigen_iterations near --max-iter says so; a smaller --tol confirms. Each
product holds one batch's double-backward graph, more than a training step's activations:
lower --batch-size if memory runs out.

The functions (``hvp``, ``top_eigenvalue``, ``hutchinson_trace``, for any loss closure and list
of parameters) are in study/hessian.py.
"""
import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

from atomic import atomic_write
from study.hessian import batch_loss, hutchinson_trace, top_eigenvalue, validation_batches
from training.checkpoint import load_model
from training.run_folder import model_sha256


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
        batches = validation_batches(checkpoint.config, data_dir, args.batches, args.batch_size, block_size)
    except (OSError, ValueError) as e:
        sys.exit(f"hessian: {e}")

    model.to(device)  # in eval mode (no dropout) and in float32, as load_model gives it
    params = [p for p in model.parameters() if p.requires_grad]
    loss_fns = [functools.partial(batch_loss, model, x.to(device), y.to(device)) for x, y in batches]
    generator = torch.Generator().manual_seed(args.seed)
    eigenvalue, iterations, converged = top_eigenvalue(loss_fns, params, args.tol, args.max_iter, generator,
                                                       progress=True)
    trace, stderr = hutchinson_trace(loss_fns, params, args.samples, generator, progress=True)
    seconds = time.perf_counter() - started

    out = args.out or args.checkpoint.parent / "hessian.json"
    result = {"checkpoint": str(args.checkpoint), "step": checkpoint.step, "model_sha256": model_sha256(model),
              "top_eigenvalue": eigenvalue, "eigen_iterations": iterations, "eigen_converged": converged,
              "tol": args.tol, "max_iter": args.max_iter, "trace": trace, "trace_stderr": stderr,
              "trace_samples": args.samples,
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
