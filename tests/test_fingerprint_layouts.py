"""scripts/fingerprint_layouts.py: its fingerprint of a case (single, adamw: stopped at step 2 and
resumed to 4) is the one computed here, with hashing code of this test's own, from a plain train.py
run of the same arguments (the tool's report names them) on the data it wrote, straight to step 4 (a
bitwise resume, which tests/test_train.py asserts, makes the two runs' checkpoints and losses equal)."""
import hashlib
import json
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, read_metrics, run_train

pytestmark = pytest.mark.slow  # the tool's two train.py runs and a straight one (15 s; a first kernel build: 60 s)


def digest_of(tree: dict):
    """The documented serialization, written out for flat or two-level dicts of tensors: sorted key
    paths, each ``repr(path)``, then a tensor's ``"dtype shape"`` and raw bytes, then a newline."""
    digest = hashlib.sha256()
    for key in sorted(tree, key=lambda k: (type(k).__name__, k)):
        value = tree[key]
        inner = value.items() if isinstance(value, dict) else [(None, value)]
        for name, t in sorted(inner, key=lambda kv: (type(kv[0]).__name__, kv[0] or "")):
            path = (key,) if name is None else (key, name)
            t = t.detach().cpu().contiguous()
            digest.update(repr(path).encode() + f"{t.dtype} {tuple(t.shape)}".encode()
                          + t.reshape(-1).view(torch.uint8).numpy().tobytes() + b"\n")
    return digest


def test_single_adamw_fingerprint_is_a_plain_run_s(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "fingerprint_layouts.py"), "--repo", str(ROOT),
                             "--python", sys.executable, "--only", "single:adamw", "--workdir", str(tmp_path / "work"),
                             "--json", str(tmp_path / "fp.json")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    layout, optimizer, printed = result.stdout.split()
    report = json.loads((tmp_path / "fp.json").read_text())
    case = report["cases"]["single adamw"]
    assert (layout, optimizer, printed) == ("single", "adamw", case["sha256"])
    assert "adamw" in report["optimizers"] and len(report["optimizers"]) >= 13
    assert [c.split(" -> ")[1] for c in case["diagnostics"]["checkpoints"]] == ["ckpt_00000004.pt (inline)",
                                                                               "ckpt_00000002.pt (inline)"]

    args = case["diagnostics"]["train_args"]
    assert "--optimizer=adamw" in args and f"--data_dir={tmp_path / 'work' / 'data'}" in args
    assert not any(a.startswith(("--stop_at_step", "--resume")) for a in args)
    run_train(*args, f"--out_dir={tmp_path / 'out'}", "--run_name=plain")  # (the later --key=value wins)
    checkpoint = torch.load(tmp_path / "out" / "plain" / "ckpt.pt", weights_only=True)
    assert checkpoint["step"] == 4
    losses = [(r["step"], key, repr(value)) for r in read_metrics(tmp_path / "out" / "plain") if "step" in r
              for key, value in r.items() if key in ("train/loss", "val/loss")]
    assert len(losses) == 4 + 3  # train 1..4; val 0, 2, 4
    parts = {"weights": digest_of(checkpoint["model"]).hexdigest(),
             "optimizer": digest_of(checkpoint["optimizer"]["state"]).hexdigest(),
             "losses": hashlib.sha256(repr(losses).encode()).hexdigest()}
    assert {key: case[key] for key in parts} == parts
    expected = hashlib.sha256(" ".join(f"{k}={v}" for k, v in parts.items()).encode()).hexdigest()
    assert printed == expected
