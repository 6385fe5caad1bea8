"""scripts/bench_train.py on a tiny model: the step's parts are the loop's own (train.PHASES, each
timed), they add up to no more than the step they were timed in, and the numbers it prints and
writes agree with each other. Speed itself is never asserted."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from train import PHASES

TINY = ["model=nano", "n_layer=2", "n_head=2", "n_embd=32", "block_size=32", "batch_size=8", "micro_batch_size=4",
        "tokenizer=byte", "optimizer=sophiag", "qk_clip_tau=50", "log_interval=5", "probe_batch_size=2"]


def bench_train(tmp_path, *args: str) -> tuple[str, dict]:
    """(stdout, the --json results) of scripts/bench_train on TINY in a process of its own."""
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, "-m", "scripts.bench_train", *(f"--set={s}" for s in TINY), *args,
                             f"--json={out}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout, json.loads(out.read_text())


@pytest.mark.slow  # a process of its own
def test_bench_train_times_the_loop_s_parts_and_compares_optimizers(tmp_path):
    stdout, measured = bench_train(tmp_path, "--steps=10", "--warmup=1", "--compare", "sophiag", "adamw", "muon")
    parts = measured["parts_ms"]
    # Sophia-G's extra pass runs every 10 steps and QK-Clip on every one: every phase of an
    # ordinary iteration of the loop was entered and took time.
    assert set(parts) == {*PHASES, "other"} - {"instruments"}
    assert all(ms > 0 for name, ms in parts.items() if name != "other") and parts["other"] >= 0
    assert sum(ms for name, ms in parts.items() if name != "other") <= measured["parts_step_ms"]
    tokens_per_step = 8 * 32
    assert measured["tokens_per_s"] == pytest.approx(tokens_per_step / (measured["step_ms"] / 1e3))
    assert measured["compare"]["sophiag"]["ratio"] == 1.0 and measured["compare"]["sophiag"]["step_ms"] == \
        measured["step_ms"]
    for name in ("adamw", "muon"):
        assert measured["compare"][name]["ratio"] > 0 and "optimizer" in measured["compare"][name]["parts_ms"]
        assert "extra_pass" not in measured["compare"][name]["parts_ms"]  # Sophia-G's alone
    assert f"{measured['tokens_per_s']:,.0f} tokens/s" in stdout


@pytest.mark.slow  # a process of its own
def test_bench_train_without_parts_compares_whole_steps_alone(tmp_path):
    stdout, measured = bench_train(tmp_path, "--steps=2", "--warmup=1", "--no-parts", "--compare", "adamw", "lion")
    assert "parts_ms" not in measured and "instruments_ms" not in measured
    assert "one step by parts" not in stdout
    lion = measured["compare"]["lion"]
    assert lion["ratio"] == pytest.approx(lion["step_ms"] / measured["step_ms"]) and "parts_ms" not in lion
    assert f"{lion['ratio']:6.3f}x" in stdout
