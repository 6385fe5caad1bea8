"""Step time of every registered optimizer on GPT-2 Small parameter shapes.

    python -m scripts.bench_optim [--device cpu] [--dtype float32] [--steps 10] [--warmup 2] [--backend auto]
                                  [--only NAME ...]

Times ``optimizer.step()`` alone (fresh gradients are copied in before each step, untimed) for
every name in ``optim.available()`` on ``--backend`` (optim/backends/; Muon with its Newton-Schulz
share: the iterations on every hidden matrix, q, k and v apart, timed alone) and for a naive MERIT
written straight from docs/optimizers.md the way the authors' code is (a per-tensor loop that materialises every temporary). Each optimizer's
steps alternate with those of a ``torch.optim.AdamW(fused=True)`` on its own copy of the
parameters, so that the ratio compares steps taken under the same conditions (a shared machine's
speed drifts by tens of percent). Prints the median over ``--steps`` steps after ``--warmup``:
ms per step, and the median of the per-step ratios to the interleaved fused AdamW; and the memory
each keeps: bytes of optimizer state per byte of parameters (fused AdamW's m and v: 2; SGD's none,
and with ``sgd momentum 0.9`` its momentum buffer, 1; Adafactor's factored statistics far below 1).

``--passes`` times MERIT's two fused passes (optim/backends/) instead, on GPT-2 Small's matrices,
each sequence of per-tensor calls interleaved with fused AdamW's step on the same shapes: pass 1
with the row, column and whole-tensor maxima and with the whole-tensor maximum alone, each followed
by pass 2 or not, and a two-pass floor made of torch's own kernels (fused AdamW, then p -= lr * u
with ``torch._foreach_add_``: the 40 bytes per parameter of the two passes).
"""
import argparse

import torch

import optim
from optim.muon import default_ns_dtype
from study.bench_optim import SHAPES, bench, bench_passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per optimizer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (state, build)")
    parser.add_argument("--backend", default="auto", choices=optim.BACKENDS, help="who runs the fused operations")
    parser.add_argument("--passes", action="store_true", help="MERIT's two passes instead (the docstring)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these optimizers alone (default: all of them)")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.passes:
        print(f"MERIT's passes on GPT-2 Small's matrices, {args.dtype} on {device} ({torch.get_num_threads()} "
              f"threads); median of {args.steps} steps after {args.warmup}, each against fused AdamW's step")
        print(f"{'sequence':<40}{'ms':>10}{'ratio':>8}")
        for name, (ms, ratio) in bench_passes(device, dtype, args.steps, args.warmup).items():
            print(f"{name:<40}{ms:>10.1f}{ratio:>8.3f}", flush=True)
        return
    # Muon's Newton-Schulz in the dtype "auto" does not pick too, to see the choice's numbers.
    other = "float32" if default_ns_dtype(device) == torch.bfloat16 else "bfloat16"
    names = [*optim.available(), f"muon ns {other}", "sgd momentum 0.9", "sgd (torch fused)",
             "sgd momentum 0.9 (torch fused)", "naive merit"]
    if args.only:
        unknown = set(args.only) - set(names)
        if unknown:
            parser.error(f"--only {' '.join(sorted(unknown))}: not one of {', '.join(names)}")
        names = [name for name in names if name in args.only]
    n_params = sum(torch.Size(s).numel() for s in SHAPES)
    print(f"GPT-2 Small shapes: {len(SHAPES)} tensors, {n_params / 1e6:.1f}M parameters, {args.dtype} on "
          f"{device} ({torch.get_num_threads()} threads), optim_backend {args.backend!r}; median of "
          f"{args.steps} steps after {args.warmup}")
    print(f"{'optimizer':<20}{'ms/step':>10}{'fused AdamW ms':>16}{'ratio':>8}{'state/params':>14}")
    for name in names:
        ms, base, ratio, newton_schulz_ms, state = bench(name, device, dtype, args.steps, args.warmup, args.backend)
        share = (f"   Newton-Schulz {newton_schulz_ms:.1f} ms ({newton_schulz_ms / ms:.0%} of the step)"
                 if newton_schulz_ms is not None else "")
        kept = f"{state:.2f}" if state == 0 or state >= 0.01 else f"{state:.1e}"  # (Adafactor's: far below 0.01)
        print(f"{name:<20}{ms:>10.1f}{base:>16.1f}{ratio:>8.2f}{kept:>14}{share}", flush=True)


if __name__ == "__main__":
    main()
