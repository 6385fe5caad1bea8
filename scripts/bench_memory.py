"""Memory per rank of GPT-2 Small shapes under each scale-out strategy, measured by train.py itself.

    python -m scripts.bench_memory [--nproc 2] [--block-size 256] [--optimizer merit]

Trains GPT-2 Small (12 layers, 768 dims, vocabulary 50304: 124M parameters) for 2 steps with
each strategy, one micro-batch of one sequence per rank, float32 on the CPU (gloo), on random byte
tokens in a temporary folder (no data needed), and prints the ``memory/*`` metrics train.py
logs (training/memory.py; each the largest over the ranks): parameters, gradients, optimizer
state and the activation estimate counted from the tensors each rank holds, and the measured
peak (the process's peak RSS on a CPU, which includes the Python runtime and torch, about 0.4
GiB; ``max_memory_allocated`` on a GPU). One process first, as the unsharded reference.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = {"one process": [], "ddp": [], "zero1": ["--zero_stage=1"], "fsdp": ["--fsdp"]}
COLUMNS = ("params", "grads", "optimizer_state", "activations_estimate", "peak")


def measure(strategy: str, nproc: int, out_dir: Path, common: list[str]) -> dict[str, float]:
    """The memory metrics of the last log step of one run."""
    ranks = 1 if strategy == "one process" else nproc
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
                if ranks > 1 else [sys.executable])
    run_name = strategy.replace(" ", "_")
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // ranks))}
    result = subprocess.run([*launcher, str(ROOT / "train.py"), str(ROOT / "configs" / "gpt2_small_owt.py"), *common,
                             f"--out_dir={str(out_dir)!r}", f"--run_name={run_name!r}", f"--batch_size={ranks}",
                             *STRATEGIES[strategy]], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"the {strategy} run failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    records = [json.loads(line) for line in (out_dir / run_name / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "memory/peak" in r][-1]
    return {key: last[f"memory/{key}"] for key in COLUMNS}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2, help="ranks of the DDP, ZeRO-1 and FSDP2 runs")
    parser.add_argument("--block-size", type=int, default=256, help="sequence length (GPT-2: 1024)")
    parser.add_argument("--optimizer", default="merit")
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES),
                        metavar="STRATEGY", help=f"of {', '.join(map(repr, STRATEGIES))} (default: all)")
    args = parser.parse_args(argv)

    from data.shards import write_shard
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        for split in ("train", "val"):
            write_shard(Path(tmp) / f"{split}_000000.bin", rng.integers(0, 256, 200_000, dtype=np.uint16))
        common = [f"--data_dir={tmp!r}", "--tokenizer='byte'", "--vocab_size=50304",
                  f"--block_size={args.block_size}", "--micro_batch_size=1", "--max_steps=2", "--warmup_steps=0",
                  "--log_interval=1", "--eval_interval=1000", f"--val_tokens={args.block_size}",
                  "--probe_batch_size=1", "--compile=False", "--wandb_mode='disabled'", "--device='cpu'",
                  "--dtype='float32'", f"--optimizer={args.optimizer!r}", "--lr=1e-4", "--min_lr=1e-5"]
        print(f"GPT-2 Small shapes (124M parameters), {args.optimizer}, float32, block {args.block_size}, "
              f"micro-batch 1, CPU; MiB per rank (the largest rank):")
        print("| strategy | ranks | " + " | ".join(COLUMNS) + " |")
        print("|---|---|" + "---|" * len(COLUMNS))
        for strategy in args.strategies:
            values = measure(strategy, args.nproc, Path(tmp) / "runs", common)
            ranks = 1 if strategy == "one process" else args.nproc
            print(f"| {strategy} | {ranks} | " + " | ".join(f"{values[key]:.0f}" for key in COLUMNS) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
