"""scripts/bench_replicas.py on the tiny model: it runs DDP, the replica groups and a --variant end to
end, and its table holds each one's ms a step and that against ddp's, as it writes them. Speed
itself is never asserted."""
import json
import re
import subprocess
import sys

import pytest

from helpers import ROOT, TINY

pytestmark = pytest.mark.slow  # torchrun and a lighthouse with two groups, in processes of their own
pytest.importorskip("torchft", reason="torchft is not installed (requirements-ft.txt)")

# The tiny run as the script's --set key=value (its own eval_interval keeps evaluations out), warmed
# up within the 40 steps.
SETTINGS = [f"{key}={value}" for key, value in TINY.items() if key != "eval_interval"] + ["warmup_steps=5"]
ROW = re.compile(r"^  (\S+) +([\d.]+) +([\d.]+)-([\d.]+) +([\d.]+)$", flags=re.MULTILINE)


def test_bench_replicas_prints_each_variant_s_step_against_ddp(tmp_path, byte_shards):
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, "-m", "scripts.bench_replicas", f"--data_dir={byte_shards}",
                             *(f"--set={s}" for s in SETTINGS), "--steps=40", "--rounds=1",
                             "--variant=adamw:optimizer=adamw,weight_decay=0.0", f"--json={out}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    measured = json.loads(out.read_text())["variants"]
    rows = {name: tuple(map(float, numbers)) for name, *numbers in ROW.findall(result.stdout)}
    assert list(rows) == list(measured) == ["ddp", "replicas", "adamw"], result.stdout
    assert measured["adamw"]["overrides"] == ["--optimizer=adamw", "--weight_decay=0.0"]
    base = rows["ddp"][0]
    for name, (ms, low, high, ratio) in rows.items():
        entry = measured[name]
        # One round: its median is the variant's, and the range is that one number.
        assert ms > 0 and low == high == ms, name
        assert ms == pytest.approx(entry["ms_per_step"], abs=0.051), name
        assert entry["ratio"] == pytest.approx(entry["ms_per_step"] / measured["ddp"]["ms_per_step"], rel=1e-12)
        # (ms printed to 0.05 ms, the ratio to 0.0005)
        assert ratio == pytest.approx(ms / base, abs=5e-4 + 0.05 * (1 + ratio) / base), name
        assert ratio == pytest.approx(entry["ratio"], abs=5.1e-4), name
    assert rows["ddp"][3] == 1.0
    assert re.search(r"^measured on .+ \(\d+ cores; amx_tile (yes|no), avx512_bf16 (yes|no)\); torch \S+, torchft \S+$",
                     result.stdout, flags=re.MULTILINE), result.stdout
