"""scripts/mini_study.py end to end at a tiny scale: its runs (two at once), report and figures."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow  # two runs at once in processes of their own, then the report and figures
def test_the_mini_study_runs_its_grid_and_writes_the_report_and_figures(tmp_path, byte_shards):
    out = tmp_path / "mini"
    tiny = ["max_tokens=2048", "warmup_steps=0", "block_size=32", "batch_size=8", "micro_batch_size=8",
            "val_tokens=512", "probe_batch_size=2", "log_interval=2", "eval_interval=4"]
    result = subprocess.run([sys.executable, "-m", "scripts.mini_study", f"--out={out}", f"--data-dir={byte_shards}",
                             "--optimizers=adamw,maxlamb", "--seeds=1", "--lr-points=1", "--jobs=2",
                             *(f"--set={t}" for t in tiny)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The central lr of each grid, seed 0; each run's output in its own log (two ran at once).
    for point in (out / "adamw" / "lr0.001_s0", out / "maxlamb" / "lr0.03_s0"):
        assert (point / "train.log").is_file() and "finished 8 steps" in (point / "train.log").read_text()
    text = (out / "report.md").read_text()
    assert "| adamw | " in text and "| merit (maxLAMB) | " in text and "# Study report: 2 runs" in text
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "attn_entropy.png", "max_logit.png", "max_logit_heads.png", "merit_diagnostics.png", "scaling.png",
        "val_loss.png"]
    assert "mini-study: 2 runs, 0 did not finish" in result.stdout
