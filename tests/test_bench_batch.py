"""scripts/bench_batch.py's small-batch measurement on a tiny model: a per-token row for every batch
and the accumulated one, per optimizer, each ratio to the largest batch's in the same rounds, the
batch-1 loop against its bare forward, backward and optimizer step, and the numbers it prints are
the ones it writes; its subnormal measurement of a checkpoint's model. Speed itself is never asserted."""
import json
import re
import subprocess
import sys

import pytest

from helpers import ROOT, TINY, TINY_RUN, train_here
from model import GPT, GPTConfig
from training.checkpoint import Checkpoint


@pytest.mark.slow  # a process of its own
def test_bench_batch_tables_the_cost_per_token_and_the_loop_s_overhead(tmp_path):
    out = tmp_path / "bench.json"
    config = ROOT / "configs" / "default.py"  # (the tiny model instead of the mini-study's)
    result = subprocess.run([sys.executable, "-m", "scripts.bench_batch", "small", f"--config={config}",
                             *(f"--set={key}={value}" for key, value in TINY.items()), "--optimizers", "adamw", "lion",
                             "--batches", "1", "2", "4", "--accumulated=4", "--rounds=1", f"--json={out}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    measured = json.loads(out.read_text())["small"]
    rows = {(r["optimizer"], r["batch"], r["micro_batch"]): r for r in measured["per_token"]}
    assert list(rows) == [(name, batch, micro) for name in ("adamw", "lion")
                          for batch, micro in ((1, 1), (2, 2), (4, 4), (4, 1))]
    printed = re.findall(r"^ +(\d+) = (\d+) x (\d+) +([\d.]+) +([\d.]+) +([\d,]+) +([\d.]+)x$", result.stdout,
                         flags=re.MULTILINE)
    assert len(printed) == len(rows)
    for (name, batch, micro), row, line in zip(rows, rows.values(), printed):
        assert (int(line[0]), int(line[1]), int(line[2])) == (batch, micro, batch // micro)
        assert row["us_per_token"] > 0 and row["tokens_per_s"] == pytest.approx(1e6 / row["us_per_token"])
        assert float(line[4]) == pytest.approx(row["us_per_token"], abs=0.0051)
        assert float(line[6]) == pytest.approx(row["vs_largest"], abs=0.0051)
    assert all(rows[name, 4, 4]["vs_largest"] == 1.0 for name in ("adamw", "lion"))
    for name in ("adamw", "lion"):
        overhead = measured["overhead"][name]
        assert all(overhead[key] > 0 for key in ("loop", "bare", "clipped")) and "loop - clipped" in overhead
        assert {"data", "forward", "backward", "optimizer"} <= set(overhead["parts_ms"])
        assert f"{name} at batch 1: loop step {overhead['loop']:.3f} ms" in result.stdout and overhead["batch"] == 1


@pytest.mark.slow  # a process of its own
def test_bench_batch_subnormal_times_a_checkpoint_s_model_both_ways_and_counts_its_gradient(byte_shards, tmp_path):
    train_here(*TINY_RUN, "--max_steps=2", "--batch_size=2", "--micro_batch_size=2",
               f"--data_dir={byte_shards}", f"--out_dir={tmp_path}")
    checkpoint = tmp_path / "default" / "ckpt.pt"
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, "-m", "scripts.bench_batch", "subnormal", f"--checkpoint={checkpoint}",
                             "--steps=2", "--rounds=2", f"--json={out}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cost = json.loads(out.read_text())["subnormal"]
    weights = {id(tensor): tensor.numel() for tensor in GPT(GPTConfig(**Checkpoint.load(checkpoint).model_args))
               .parameters()}  # (each tied tensor once, as the model's gradients)
    assert cost["grads"] == sum(weights.values()) and 0 <= cost["subnormal_grads"] < cost["grads"]
    assert cost["ratio"] == pytest.approx(cost["ieee_ms"] / cost["flushed_ms"])
    assert (f"{cost['ieee_ms']:.2f} ms with IEEE floats, {cost['flushed_ms']:.2f} ms with subnormals flushed: "
            f"{cost['ratio']:.2f}x") in result.stdout
    refused = subprocess.run([sys.executable, "-m", "scripts.bench_batch", "subnormal"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "give --checkpoint RUN/ckpt.pt" in refused.stderr
