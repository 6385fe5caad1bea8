"""The console (training/console.py): the max attention logit per layer it prints, against the run's
metrics log; with a soft-cap, the raw maxima labelled as such and the capped ones beside them."""
import math
import re

import pytest

from helpers import TINY_RUN, read_metrics, train_here

CAP = 0.01  # small enough to bind on the tiny model's logits from the first step


def per_layer(record: dict, stat: str) -> str:
    """A record's per-layer ``stat`` values as the console writes them (2 decimals, layer order)."""
    return " ".join(f"{record[f'{stat}/layer_{i:02d}']:.2f}" for i in range(2))


def run(byte_shards, tmp_path, *extra) -> tuple[str, str, list[dict]]:
    """(stdout, stderr: the progress bar, the log records) of a 4-step run of the tiny model, logged every 2 steps."""
    result = train_here(*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run",
                        "--max_steps=4", "--batch_size=2", "--micro_batch_size=2", "--log_interval=2", *extra)
    return result.stdout, result.stderr, [r for r in read_metrics(tmp_path / "run") if "max_logit/layer_00" in r]


def test_with_a_binding_soft_cap_the_raw_maxima_are_labelled_and_the_capped_ones_printed(byte_shards, tmp_path):
    stdout, stderr, records = run(byte_shards, tmp_path, f"--attn_logit_softcap={CAP}")
    assert len(records) == 2
    for record in records:
        raw, capped = per_layer(record, "max_logit"), per_layer(record, "max_logit_capped")
        # The cap binds: the raw maxima lie above it, the capped ones are cap * tanh(raw / cap).
        assert record["max_logit/layer_00"] > 2 * CAP
        assert record["max_logit_capped/layer_00"] == pytest.approx(CAP * math.tanh(record["max_logit/layer_00"] / CAP))
        assert f"  max attention logit per layer: raw {raw}, capped by attn_logit_softcap={CAP:g}: {capped}\n" in stdout
    last = records[-1]
    largest = max(last["max_logit/layer_00"], last["max_logit/layer_01"])
    assert f"max_logit={largest:.1f}, max_logit_capped={CAP:.1f}" in stderr  # (the bar's)
    summary = (f"max attention logit per layer raw {per_layer(last, 'max_logit')}, capped by "
               f"attn_logit_softcap={CAP:g}: {per_layer(last, 'max_logit_capped')}\n")
    assert re.search(r"finished 4 steps .*, " + re.escape(summary), stdout), stdout


def test_without_a_soft_cap_the_maxima_are_printed_alone(byte_shards, tmp_path):
    stdout, stderr, records = run(byte_shards, tmp_path)
    for record in records:
        assert f"  max attention logit per layer: {per_layer(record, 'max_logit')}\n" in stdout
    assert "capped" not in stdout + stderr
    assert f"max attention logit per layer {per_layer(records[-1], 'max_logit')}\n" in stdout
