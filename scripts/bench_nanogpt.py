"""Training speed and memory against nanoGPT's train.py, side by side; installs nothing.

    python -m scripts.bench_nanogpt --nanogpt PATH [--shape gpt2-vocab|default] [--repeats 3]
                                    [--steps 40] [--device cpu] [--dtype float32] [--compile]
                                    [--set key=value ...] [--profile]

PATH is a checkout of https://github.com/karpathy/nanoGPT (MIT-licensed: it is run from there,
never copied here). Both train the same model with AdamW at batch 16 x 256 tokens for --steps
steps, no biases, no dropout, on the same random tokens, each in a fresh process (nanoGPT's reads
``train.bin``; ours the same tokens as an llm.c shard), the two alternating --repeats times. The
shapes: ``gpt2-vocab`` 4 layers, 4 heads, 256 dims, block 256, GPT-2's vocabulary padded to 50304;
``default`` the default job's model (configs/default.py: 4 layers, 4 heads, 128 dims, block 256,
the byte vocabulary padded to 320; nanoGPT reads that size from a ``meta.pkl``).
nanoGPT evaluates once at the start (``eval_iters=1``) and saves nothing; ours validates at the
start and the end (``val_tokens`` = one batch), logs every 10 steps (the probe included) and saves
its checkpoint: it is charged for its extras. Per pair: the whole process's wall time, its
steady-state step (nanoGPT's printed per-iteration times, ours the logged tokens/s of steps
11-N; both the median after the first ten steps) and the process's peak RSS (``wait4``).

``--profile`` instead shows where each side's time goes: one process builds our Trainer of the
same settings and nanoGPT's ``GPT`` (imported from the checkout's ``model.py``, with its own
``configure_optimizers``), runs 3 warm-up iterations of each, then profiles ``--steps``
iterations of each with ``torch.profiler``, the sides taking turns an iteration at a time (ours: the loop's
``train_step`` and ``after_step``; nanoGPT's: forward, backward, gradient clipping, optimizer step,
``zero_grad``, as its train.py iterates), and prints the operators that take the most time, in ms
per iteration for each side.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"gpt2-vocab": ({"n_layer": 4, "n_head": 4, "n_embd": 256, "block_size": 256}, "gpt2", 50257, None),
          "default": ({"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 256}, "byte", 256, 320)}
BATCH = 16


def run(command: list[str], cwd: Path) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of ``command`` run to its end in a process of its own."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise RuntimeError(f"{' '.join(command[:3])} ... failed:\n{output[-3000:]}")
    return seconds, usage.ru_maxrss / 1024, output


def nanogpt_command(args, data: Path, out: Path) -> list[str]:
    settings = {**SHAPES[args.shape][0], "dataset": str(data), "out_dir": str(out), "batch_size": BATCH,
                "gradient_accumulation_steps": 1, "max_iters": args.steps, "lr_decay_iters": args.steps,
                "warmup_iters": 2, "eval_interval": 10 ** 9, "eval_iters": 1, "log_interval": 1,
                "always_save_checkpoint": False, "device": args.device, "dtype": args.dtype,
                "compile": args.compile, "dropout": 0.0, "bias": False}
    return [sys.executable, "train.py", *(f"--{key}={value}" for key, value in settings.items())]


def our_command(args, data: Path, out: Path) -> list[str]:
    model, tokenizer = SHAPES[args.shape][:2]
    settings = {"model": "nano", **model, "tokenizer": tokenizer, "bias": False, "dropout": 0.0, "batch_size": BATCH,
                "micro_batch_size": BATCH, "max_steps": args.steps, "warmup_steps": 2, "optimizer": "adamw",
                "lr": 6e-4, "min_lr": 6e-5, "log_interval": 10, "eval_interval": 10 ** 9,
                "val_tokens": BATCH * model["block_size"], "probe_batch_size": 2, "sample_tokens": 0,
                "device": args.device, "dtype": args.dtype, "compile": args.compile, "data_dir": str(data),
                "out_dir": str(out), "run_name": "bench", "wandb_mode": "disabled", "overwrite": True}
    return [sys.executable, "train.py", *(f"--{key}={value!r}" for key, value in settings.items()),
            *(f"--{item}" for item in args.set)]


def nanogpt_step_ms(output: str) -> float:
    times = [float(ms) for ms in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", output)]
    return statistics.median(times[10:])


def our_step_ms(run_dir: Path, block_size: int) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r and r["step"] > 10]
    return 1e3 * BATCH * block_size / statistics.median(rates)


def profile_iterations(args) -> None:
    """Per operator, ms per training iteration of ours and of nanoGPT's model in this process."""
    import importlib.util

    import torch
    from torch.profiler import profile

    from study.bench import loop_step, synthetic_trainer
    from train import Trainer

    settings, _, n_tokens, meta_vocab = SHAPES[args.shape]
    spec = importlib.util.spec_from_file_location("nanogpt_model", args.nanogpt / "model.py")
    nanogpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nanogpt)
    with tempfile.TemporaryDirectory() as tmp:
        command = our_command(args, Path(tmp), Path(tmp))
        overrides = [item for item in command[2:] if not item.startswith(("--data_dir=", "--out_dir=", "--run_name="))]
        trainer = synthetic_trainer(ROOT / "configs" / "default.py", overrides, Path(tmp), trainer_class=Trainer)
        try:
            vocab = meta_vocab or trainer.model_config.vocab_size
            config = nanogpt.GPTConfig(**settings, vocab_size=vocab, bias=False, dropout=0.0)
            theirs = nanogpt.GPT(config).to(args.device)
            optimizer = theirs.configure_optimizers(0.1, 6e-4, (0.9, 0.95), torch.device(args.device).type)
            rows = torch.randint(0, n_tokens, (BATCH, settings["block_size"] + 1), device=args.device)
            inputs, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()  # as its get_batch's

            def nanogpt_iteration():
                _, loss = theirs(inputs, targets)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            sides = {"ours": lambda: loop_step(trainer), "nanoGPT": nanogpt_iteration}
            for _ in range(3):
                for iteration in sides.values():
                    iteration()
            # The sides take turns, one profiled iteration each: a shared machine's speed drifts by
            # tens of percent over seconds, which blocks of one side and then the other would charge
            # to whichever ran in the slow stretch.
            self_ms = {name: collections.Counter() for name in sides}
            for _ in range(args.steps):
                for name, iteration in sides.items():
                    with profile() as prof:
                        iteration()
                    self_ms[name].update({event.key: event.self_cpu_time_total / 1e3 / args.steps
                                          for event in prof.key_averages()})
        finally:
            trainer.close()
    totals = {name: sum(ms.values()) for name, ms in self_ms.items()}
    ops = sorted(set(self_ms["ours"]) | set(self_ms["nanoGPT"]),
                 key=lambda op: -max(self_ms["ours"].get(op, 0.0), self_ms["nanoGPT"].get(op, 0.0)))
    print(f"{args.shape}: self CPU ms per iteration, {args.steps} iterations each ({torch.get_num_threads()} threads)")
    print(f"{'operator':60s}{'ours':>10s}{'nanoGPT':>10s}")
    for op in ops[:16]:
        print(f"{op[:59]:60s}{self_ms['ours'].get(op, 0.0):10.2f}{self_ms['nanoGPT'].get(op, 0.0):10.2f}")
    print(f"{'all':60s}{totals['ours']:10.2f}{totals['nanoGPT']:10.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout (its train.py is run)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpt2-vocab")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of our train.py's settings (e.g. a flag under test)")
    parser.add_argument("--profile", action="store_true",
                        help="profile --steps iterations of each side by operator instead (one process)")
    args = parser.parse_args(argv)
    if not (args.nanogpt / "train.py").is_file() or not (args.nanogpt / "configurator.py").is_file():
        sys.exit(f"--nanogpt {args.nanogpt}: no nanoGPT checkout there (train.py and configurator.py): "
                 f"git clone https://github.com/karpathy/nanoGPT and pass its path")
    if args.profile:
        profile_iterations(args)
        return
    from data.shards import write_shard

    model, _, n_tokens, meta_vocab = SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokens = np.random.default_rng(0).integers(0, n_tokens, 4_000_000, dtype=np.uint16)
        if meta_vocab:  # nanoGPT's vocabulary size for its own data, as its char-level prepare writes it
            with open(tmp / "meta.pkl", "wb") as file:
                pickle.dump({"vocab_size": meta_vocab}, file)
        for split in ("train", "val"):
            tokens.tofile(tmp / f"{split}.bin")  # nanoGPT's format: the raw uint16 ids
            write_shard(tmp / "ours" / f"{split}_000000.bin", tokens)  # llm.c's: a header, then the ids
        pairs = []
        for repeat in range(args.repeats):
            theirs = run(nanogpt_command(args, tmp, tmp / "nanogpt_out"), cwd=args.nanogpt)
            ours = run(our_command(args, tmp / "ours", tmp / "runs"), cwd=ROOT)
            pair = {"nanogpt": (*theirs[:2], nanogpt_step_ms(theirs[2])),
                    "ours": (*ours[:2], our_step_ms(tmp / "runs" / "bench", model["block_size"]))}
            pairs.append(pair)
            (t_wall, t_rss, t_step), (o_wall, o_rss, o_step) = pair["nanogpt"], pair["ours"]
            print(f"pair {repeat + 1}: wall {o_wall:.1f} s vs nanoGPT {t_wall:.1f} s ({o_wall / t_wall:.3f}x); "
                  f"step {o_step:.1f} ms vs {t_step:.1f} ms: tokens/s {t_step / o_step:.3f}x nanoGPT's; "
                  f"peak RSS {o_rss:,.0f} vs {t_rss:,.0f} MiB ({o_rss / t_rss:.3f}x)", flush=True)
    for label, index in (("wall time", 0), ("tokens/s", 2), ("peak RSS", 1)):
        # ours / nanoGPT's for times and memory; for tokens/s, nanoGPT's step over ours
        ratios = [p["nanogpt"][index] / p["ours"][index] if label == "tokens/s"
                  else p["ours"][index] / p["nanogpt"][index] for p in pairs]
        print(f"{label}: ours / nanoGPT's median {statistics.median(ratios):.3f}x (range {min(ratios):.3f}-"
              f"{max(ratios):.3f}, {len(pairs)} pairs)")


if __name__ == "__main__":
    main()
