"""wandb for real: train.py with the installed wandb package in offline mode, the run read back
from the file wandb wrote (its transaction log of wandb's own protobuf records)."""
import json
import struct

import pytest

from helpers import TINY_RUN, read_metrics, train_here

pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

RUN = [*TINY_RUN, "--log_interval=2", "--eval_interval=2", "--batch_size=2", "--micro_batch_size=2", "--max_steps=4",
       "--checkpoint_interval=2", "--wandb_mode=offline"]


def wandb_records(path):
    """The protobuf records of a .wandb file. Its framing is LevelDB's log format, as wandb writes
    it: a 7-byte file header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of chunks, each
    with a 7-byte header (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    block, header, pos, parts = 32768, 7, 7, []
    while pos + header <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + header])
        if left < header or (length == 0 and kind == 0):  # the rest of a block is padding
            pos += left
            continue
        parts.append(data[pos + header:pos + header + length])
        pos += header + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def read_run(run_dir):
    """(run ids, history rows, the config's updates) over the offline runs in run_dir/wandb, in
    the order written."""
    ids, rows, config = [], [], {}
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.append(record.run.run_id)
            elif kind == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
            elif kind == "config":
                config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return ids, rows, config


def test_an_offline_run_holds_the_metrics_and_a_resumed_run_continues_its_id(byte_shards, tmp_path):
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}"]
    first = train_here(*common, "--stop_at_step=2")
    assert "wandb could not start" not in first.stderr + first.stdout
    train_here(*common, "--resume", "--z_loss=0.001", "--allow_changes=z_loss")  # a change, recorded
    run_dir = tmp_path / "default"
    ids, rows, config = read_run(run_dir)
    assert config["event"] == {"changes": [{"step": 2, "key": "z_loss", "from": 0.0, "to": 0.001}]}
    assert "run_info" in config
    assert len(ids) == 2 and ids[0] == ids[1] == (run_dir / "wandb_id.txt").read_text()  # one wandb run
    logged = [r for r in read_metrics(run_dir) if "step" in r]
    assert [r["step"] for r in logged if "train/loss" in r] == [2, 4]
    assert [r["step"] for r in logged if "val/loss" in r] == [0, 2, 4]
    # Every record of the JSONL log reached wandb at its step, with the same values.
    for record in logged:
        matches = [row for row in rows if row.get("step") == record["step"] and record.keys() <= row.keys()]
        assert matches, f"step {record['step']}: {sorted(record)} not in wandb's history"
        assert {k: matches[0][k] for k in record} == pytest.approx(record)
    for step in (2, 4):
        row = next(r for r in rows if r.get("step") == step and "train/loss" in r)
        assert {"max_logit/layer_00", "max_logit/layer_01", "batch/size", "batch/phase"} <= row.keys()
        assert any(key.startswith("trust_ratio_max/") for key in row)  # MERIT's diagnostics, per layer
