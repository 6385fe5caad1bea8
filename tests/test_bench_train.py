"""scripts/bench_train.py on a tiny model: the step's parts are the loop's own (train.SECTIONS, each
timed), they add up to no more than the step they were timed in, tokens/s counts the global batch,
and the numbers it prints are the ones it writes. Speed itself is never asserted."""
import json
import math
import re
import subprocess
import sys

import pytest

from helpers import ROOT, TINY
from train import SECTIONS

# The tiny run as the script's --set key=value, with accumulation 2 and Sophia-G with QK-Clip: every
# section of the loop runs.
SETTINGS = [f"{key}={value}" for key, value in TINY.items()] + [
    "batch_size=8", "micro_batch_size=4", "optimizer=sophiag", "qk_clip_tau=50", "log_interval=5"]


def bench_train(tmp_path, *args: str) -> tuple[str, dict]:
    """(stdout, the --json results) of scripts/bench_train on SETTINGS in a process of its own."""
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, "-m", "scripts.bench_train", *(f"--set={s}" for s in SETTINGS), *args,
                             f"--json={out}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout, json.loads(out.read_text())


def printed(stdout: str, unit: str) -> dict[str, tuple[float, float]]:
    """{name: (ms, the number after it)} from the output's indented lines ``name ms ms number<unit>``:
    the parts and the instruments (unit "%", the share of the step) or the optimizers ("x", the ratio)."""
    rows = re.findall(rf"^  (\S+) +(-?[\d.]+) ms +(-?[\d.]+){re.escape(unit)}", stdout, flags=re.MULTILINE)
    return {name: (float(ms), float(number)) for name, ms, number in rows}


def assert_compared_as_printed(stdout: str, measured: dict, names: list[str]) -> None:
    """Each compared optimizer's mean step and ratio, printed (to 0.1 ms and 0.001) as written."""
    compare, shown = measured["compare"], printed(stdout, "x")
    assert list(compare) == list(shown) == names
    for name, entry in compare.items():
        assert entry["step_ms"] > 0 and entry["ratio"] > 0 and math.isfinite(entry["ratio"]), name
        ms, ratio = shown[name]
        assert ms == pytest.approx(entry["step_ms"], abs=0.051) and ratio == pytest.approx(entry["ratio"], abs=5.1e-4)


@pytest.mark.slow  # a process of its own
def test_bench_train_times_the_loop_s_parts_and_compares_optimizers(tmp_path):
    stdout, measured = bench_train(tmp_path, "--steps=10", "--warmup=1", "--compare", "sophiag", "adamw", "muon")
    parts = measured["parts_ms"]
    # Sophia-G's extra pass runs every 10 steps and QK-Clip on every one: every section of an
    # ordinary iteration of the loop was entered and took time.
    assert set(parts) == {*SECTIONS, "other"} - {"instruments"}
    assert all(ms > 0 for name, ms in parts.items() if name != "other")
    assert sum(ms for name, ms in parts.items() if name != "other") <= measured["parts_step_ms"]
    # Printed as written (to 0.01 ms), the shares of the parted step (0.1% each) adding up to all of it.
    shown = printed(stdout, "%")
    assert shown.keys() == {*parts, "instruments"}
    for name, ms in parts.items():
        assert shown[name][0] == pytest.approx(ms, abs=0.0051), name
    assert sum(share for name, (_, share) in shown.items() if name != "instruments") == pytest.approx(100, abs=0.45)
    assert shown["instruments"][0] == pytest.approx(measured["instruments_ms"], abs=0.0051)
    # tokens/s is the global batch's 8 x 32 tokens over the mean step (not a micro-batch's 4 x 32).
    step_ms, steps, tokens_per_s = re.search(r"^step ([\d.]+) ms \(mean of (\d+)\), ([\d,]+) tokens/s", stdout,
                                             flags=re.MULTILINE).groups()
    assert float(step_ms) == pytest.approx(measured["step_ms"], abs=0.051) and steps == "10"
    assert float(tokens_per_s.replace(",", "")) == pytest.approx(measured["tokens_per_s"], abs=0.51)
    assert measured["tokens_per_s"] == pytest.approx(8 * 32 / (measured["step_ms"] / 1e3))
    assert_compared_as_printed(stdout, measured, ["sophiag", "adamw", "muon"])
    for name in ("adamw", "muon"):
        assert "optimizer" in measured["compare"][name]["parts_ms"]
        assert "extra_pass" not in measured["compare"][name]["parts_ms"]  # Sophia-G's alone


@pytest.mark.slow  # a process of its own
def test_bench_train_without_parts_compares_whole_steps_alone(tmp_path):
    stdout, measured = bench_train(tmp_path, "--steps=2", "--warmup=1", "--no-parts", "--compare", "adamw", "lion")
    assert "parts_ms" not in measured and "instruments_ms" not in measured
    assert "one step by parts" not in stdout and printed(stdout, "%") == {}
    assert all("parts_ms" not in entry for entry in measured["compare"].values())
    assert_compared_as_printed(stdout, measured, ["adamw", "lion"])


@pytest.mark.slow  # a process of its own
def test_bench_train_compares_models_each_with_its_own_shape_and_flops(tmp_path):
    """--models: one trainer per preset with its own overrides, each row's tokens/s the batch over its
    step and its FLOP/s its own model's FLOPs per token times that (GPT-2's and Llama's counts differ)."""
    stdout, measured = bench_train(tmp_path, "--steps=2", "--warmup=1", "--no-parts", "--models", "nano",
                                   "llama_nano,vocab_size=640")
    assert_compared_as_printed(stdout, measured, ["nano", "llama_nano"])
    # The non-embedding parameters of the tiny shape (2 layers of 32 dims, no biases), counted here: GPT-2
    # V d + L (12 d^2 + 2 d) + d (the tied head, 4d-wide MLP, two LayerNorms a block, the final one);
    # Llama V d + L (4 d^2 + 3 d x 96 + 2 d) + d (its untied head, SwiGLU 8/3 x 32 rounded up to 96).
    params = {"nano": 320 * 32 + 2 * (12 * 32 ** 2 + 2 * 32) + 32,
              "llama_nano": 640 * 32 + 2 * (4 * 32 ** 2 + 3 * 32 * 96 + 2 * 32) + 32}
    attention = 12 * 2 * 2 * 16 * 32  # 12 L H Q T a token
    for name in ("nano", "llama_nano"):
        entry = measured["compare"][name]
        assert entry["params"] == params[name]
        assert entry["tokens_per_s"] == pytest.approx(8 * 32 / (entry["step_ms"] / 1e3))
        assert entry["flops"] == pytest.approx((6 * params[name] + attention) * entry["tokens_per_s"])
    assert "model llama_nano: 2 layers, 2 heads, 32 dims, block 32, vocab 640" in stdout
