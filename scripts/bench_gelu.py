"""GPT-2's tanh GELU on a CPU: the project's kernel (kernels/csrc/gelu.cpp) against torch's.

    python -m scripts.bench_gelu [--rows 4096] [--width 512] [--rounds 20] [--steps 5] [--json FILE]

Prints, in one process on this CPU's threads:

* the activation alone, over a ``rows x width`` float32 tensor (the default job's MLP: 16 x 256
  positions, 4 x 128 wide): forward and backward in ms for our kernel, torch's tanh GELU and
  torch's exact (erf) GELU, the three taking turns for --rounds rounds (medians), and each one's
  time against our kernel's;
* a whole training step of the default job's model (configs/default.py's model at batch 16,
  AdamW, random tokens, the loop's own ``train_step`` and ``after_step``) with our kernel and with
  torch's tanh GELU, alternating --steps steps at a time for --rounds rounds: the medians and the
  ratio. ``--steps 0`` leaves the step out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import kernels

ROOT = Path(__file__).resolve().parents[1]


def median_ms(functions: dict, rounds: int, repeats: int) -> dict[str, float]:
    """Each function's median ms a call, the functions taking turns ``rounds`` times."""
    times = {name: [] for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            start = time.perf_counter()
            for _ in range(repeats):
                function()
            times[name].append((time.perf_counter() - start) / repeats * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def activation(rows: int, width: int, rounds: int) -> dict[str, dict[str, float]]:
    x = torch.randn(rows, width)
    grad = torch.randn(rows, width)
    forms = {"kernel": (kernels.gelu_tanh, lambda: torch.ops.nanomerit.gelu_tanh_backward(grad, x)),
             "torch tanh": (lambda t: F.gelu(t, approximate="tanh"),
                            lambda: torch.ops.aten.gelu_backward(grad, x, approximate="tanh")),
             "torch erf": (F.gelu, lambda: torch.ops.aten.gelu_backward(grad, x))}
    forward = median_ms({name: (lambda f=f: f(x)) for name, (f, _) in forms.items()}, rounds, 10)
    backward = median_ms({name: b for name, (_, b) in forms.items()}, rounds, 10)
    return {name: {"forward_ms": forward[name], "backward_ms": backward[name]} for name in forms}


def training_step(rounds: int, steps: int) -> dict[str, float]:
    from study.bench import loop_step, synthetic_trainer
    from train import Trainer

    overrides = ["--optimizer='adamw'", "--wandb_mode='disabled'"]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = synthetic_trainer(ROOT / "configs" / "default.py", overrides, Path(tmp), trainer_class=Trainer)
        try:
            mlps = [block.mlp for block in trainer.model.transformer.h]
            kernel_gelu = mlps[0].gelu

            def with_gelu(gelu):
                for mlp in mlps:
                    mlp.gelu = gelu
                loop_step(trainer)

            torch_gelu = torch.nn.GELU(approximate="tanh")
            for _ in range(3):
                with_gelu(kernel_gelu), with_gelu(torch_gelu)
            return median_ms({"kernel": lambda: with_gelu(kernel_gelu), "torch tanh": lambda: with_gelu(torch_gelu)},
                             rounds, steps)
        finally:
            trainer.close()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5, help="steps a turn of the training-step comparison (0: none)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    error = kernels.build()
    if error is not None:
        raise SystemExit(f"bench_gelu: {kernels.failure(error)}: install a C++ compiler and ninja")
    results = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
               "activation": activation(args.rows, args.width, args.rounds)}
    print(f"GELU over {args.rows} x {args.width} float32 ({results['cpu_capability']}, {results['threads']} threads), "
          f"median of {args.rounds} rounds:")
    print(f"{'':12s}{'forward ms':>12s}{'backward ms':>13s}{'vs kernel':>11s}")
    ours = results["activation"]["kernel"]
    for name, ms in results["activation"].items():
        ratio = (ms["forward_ms"] + ms["backward_ms"]) / (ours["forward_ms"] + ours["backward_ms"])
        print(f"{name:12s}{ms['forward_ms']:12.3f}{ms['backward_ms']:13.3f}{ratio:10.2f}x")
    if args.steps:
        step = results["step_ms"] = training_step(args.rounds, args.steps)
        print(f"default job's training step (AdamW, batch 16 x 256): {step['kernel']:.1f} ms with the kernel, "
              f"{step['torch tanh']:.1f} ms with torch's tanh GELU: {step['torch tanh'] / step['kernel']:.3f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
