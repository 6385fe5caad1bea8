"""scripts/mini_study.py end to end at a tiny scale: its two stages (the lr on a grid that grows
past an edge, then the seeds at the best lr), its report on the held-out loss, its figures and
the archive they are drawn from again."""
import os
import statistics
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from configs import load_config
from data.shards import write_shard
from helpers import ROOT, make_text

# Each study's model and evaluations at a size that trains in seconds (--set overrides of every preset).
TINY_STUDY = ["block_size=16", "n_layer=1", "n_embd=16", "n_head=2", "val_tokens=256", "heldout_tokens=256",
              "probe_batch_size=2"]
from study.mini_study import lr_grid
from study.report import first_table, report
from study.runs import find_runs


def final_val_loss(run) -> float:
    return [r["val/loss"] for r in run.records if "val/loss" in r][-1]


@pytest.mark.slow  # two runs at once in processes of their own, then the report and figures
def test_the_mini_study_runs_its_stages_and_writes_the_report_figures_and_archive(tmp_path, byte_shards):
    out, archive = tmp_path / "mini", tmp_path / "runs.tar.xz"
    result = subprocess.run([sys.executable, "-m", "scripts.mini_study", f"--out={out}", f"--data-dir={byte_shards}",
                             "--optimizers=adamw,muonclip", "--batches=4,8", "--seeds=2", "--tokens=1024",
                             "--extend=1", "--jobs=2", f"--archive={archive}", *(f"--set={t}" for t in TINY_STUDY)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = find_runs([out])
    # AdamW at both batches, MuonClip at the largest only; each grid three lrs a factor 3 apart (the
    # centre scaled by (batch / 128) ** exponent), one more past an edge where the best lr was on it.
    by_point = {}
    for run in runs:
        by_point.setdefault((run.optimizer_label, run.batch_size), []).append(run)
    assert sorted(by_point) == [("adamw", 4), ("adamw", 8), ("muon + qk_clip 10", 8)]
    for (label, batch), members in by_point.items():
        lrs = sorted({r.lr for r in members if r.seed == 0})
        assert len(lrs) in (3, 4) and all(b / a == pytest.approx(3, rel=0.01) for a, b in zip(lrs, lrs[1:]))
        assert members[0].config["max_tokens"] == 1024 and members[0].config["micro_batch_size"] == batch // 2
        # Stage 2: seed 1 at the best lr of seed 0's grid (its lowest final val/loss, read here), and
        # wherever the seeds' mean moved the best lr to: the lr of the lowest mean has both seeds.
        seeded = {r.lr for r in members if r.seed == 1}
        assert min((r for r in members if r.seed == 0), key=final_val_loss).lr in seeded and len(seeded) <= len(lrs)
        by_lr = {}
        for run in members:
            by_lr.setdefault(run.lr, []).append(final_val_loss(run))
        assert len(by_lr[min(by_lr, key=lambda lr: statistics.fmean(by_lr[lr]))]) == 2
        assert all(r.config["data_seed"] == r.seed for r in members)
    text = (out / "report.md").read_text()
    assert "selected on val/loss, reported on heldout/loss" in text and "| muon + qk_clip 10 |" in text
    assert report(find_runs([archive]), None, "val/loss", "heldout/loss") == text  # the archive is enough
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "attn_entropy.png", "max_logit.png", "max_logit_heads.png", "noise_scale.png", "peak_logit.png",
        "scaling.png", "val_loss.png"]
    assert f"mini-study: {len(runs)} runs" in result.stdout


@pytest.mark.slow  # three tiny runs in processes of their own, then the report
def test_the_benchmark_preset_places_its_optimizers_beside_the_paper_preset_s_records(tmp_path, byte_shards):
    out, archive = tmp_path / "benchmark", tmp_path / "benchmark.tar.xz"
    result = subprocess.run([sys.executable, "-m", "scripts.mini_study", "--preset=benchmark", f"--out={out}",
                             f"--data-dir={byte_shards}", "--optimizers=adamw_schedulefree", "--batches=8",
                             "--seeds=1", "--tokens=1024", "--extend=0", "--jobs=2", f"--archive={archive}",
                             "--no-figures", *(f"--set={t}" for t in TINY_STUDY)],  # (the paper test draws them)
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = find_runs([archive])
    trained = [r for r in runs if r.config["optimizer"] == "adamw_schedulefree"]
    assert len(trained) == 3 and all(r.config["lr_schedule"] == "constant" for r in trained)  # a grid of three
    # The paper preset's committed AdamW, MERIT and Muon records (not its QK-Clip points), unchanged, beside it.
    paper = ROOT / "docs/mini_study/runs.tar.xz"
    records = lambda runs, root, folders: sorted((str(r.folder.relative_to(root)), r.records)  # noqa: E731
                                                 for r in runs if r.folder.relative_to(root).parts[0] in folders)
    assert records(runs, archive, ("adamw", "merit", "muon")) == records(find_runs([paper]), paper,
                                                                          ("adamw", "merit", "muon"))
    assert len(runs) == len(trained) + len(records(runs, archive, ("adamw", "merit", "muon")))
    with tarfile.open(archive) as tar:  # (read from the paper's archive, not copied into this one)
        assert {name.split("/")[0] for name in tar.getnames()} == {"adamw_schedulefree", "beside.json"}
    text = (out / "report.md").read_text()
    assert report(runs, None, "val/loss", "heldout/loss") == text and not (out / "figures").exists()
    assert "| adamw_schedulefree, " in text and "| merit, " in text and "| muon, " in text


def planned(preset: str, out, data_dir, *options: str) -> dict[tuple[str, ...], dict]:
    """``--preset PRESET --dry-run`` (and ``options``) into ``out``: {(arm, batch, point): its config}
    of the points it wrote, having trained nothing."""
    result = subprocess.run([sys.executable, "-m", "scripts.mini_study", f"--preset={preset}", "--dry-run",
                             f"--out={out}", f"--data-dir={data_dir}", *options], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "nothing trained" in result.stdout and not list(out.rglob("metrics.jsonl"))
    return {path.relative_to(out).parts[:3]: load_config(str(path)).to_dict() for path in out.rglob("point.py")}


def test_the_llama_cures_preset_plans_each_cure_as_adamw_with_one_change_on_the_small_llama(tmp_path):
    """--preset llama_cures, planned only (--dry-run): at batch 64, AdamW's grid and each cure's
    grid of the same three lrs, each point AdamW's but for its cure's keys, on llama_nano's shape."""
    out = tmp_path / "cures"
    configs = planned("llama_cures", out, tmp_path)
    assert {(name, lr) for name, batch, lr in configs} == {
        *((name, lr) for name in ("adamw", "adamw_qknorm", "adamw_zloss", "adamw_qkclip", "adamw_softcap")
          for lr in ("lr0.001_s0", "lr0.003_s0", "lr0.009_s0")),
        *(("merit", lr) for lr in ("lr0.00707_s0", "lr0.0212_s0", "lr0.0636_s0"))}  # 3e-2 x sqrt(64 / 128)
    cures = {"adamw_qknorm": {"qk_norm": "rmsnorm"}, "adamw_zloss": {"z_loss": 1e-4},
             "adamw_qkclip": {"qk_clip_tau": 15.0}, "adamw_softcap": {"attn_logit_softcap": 15.0,
                                                                     "final_logit_softcap": 10.0}}
    for (name, batch, lr), config in configs.items():
        assert batch == "b64" and config["batch_size"] == 64 and config["max_tokens"] == 1_048_576
        model = load_config(str(out / name / batch / lr / "point.py")).model_config(257)
        assert (model.arch, model.n_layer, model.n_head, model.n_embd, model.block_size) == ("llama", 4, 4, 128, 64)
        if name in cures:
            adamw = configs[("adamw", batch, lr)]
            changed = {key: value for key, value in config.items() if value != adamw[key] and key != "out_dir"}
            assert changed == cures[name], name
    assert {configs[key]["optimizer"] for key in configs if key[0] == "merit"} == {"merit"}


@pytest.mark.parametrize("multiple", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_the_seq_len_warmup_preset_plans_each_arm_at_one_lr_with_every_seed(tmp_path, multiple):
    """--preset seq_len_warmup, planned only (--dry-run): at batch 64 on llama_nano's shape, AdamW,
    AdamW with the warmup and with QK-Clip at 3x AdamW's centre (0.009), MERIT with and without the
    warmup at 3x its (3e-2 x sqrt(64 / 128) x 3 = 0.0636), each at that lr alone with seeds 0-2 at
    once; each arm its optimizer's plain point but for its cure's keys; every run the same tokens
    trained. --lr-multiple 3: each lr 3x that (9x the best: 0.027, and 0.191 for MERIT)."""
    out = tmp_path / "slw"
    configs = planned("seq_len_warmup", out, tmp_path, f"--lr-multiple={multiple}")
    adamw_lr, merit_lr = {1: (0.009, 0.0636), 3: (0.027, 0.191)}[multiple]
    lrs = {"adamw": adamw_lr, "adamw_slw": adamw_lr, "adamw_qkclip": adamw_lr, "merit": merit_lr,
           "merit_slw": merit_lr}
    assert set(configs) == {(name, "b64", f"lr{lr:g}_s{seed}") for name, lr in lrs.items() for seed in (0, 1, 2)}
    cures = {"adamw_slw": ("adamw", {"seq_len_warmup_start": 8, "seq_len_warmup_steps": 64}),
             "merit_slw": ("merit", {"seq_len_warmup_start": 8, "seq_len_warmup_steps": 64}),
             "adamw_qkclip": ("adamw", {"qk_clip_tau": 15.0})}
    for (name, batch, run), config in configs.items():
        assert (config["batch_size"], config["max_tokens"], config["lr"]) == (64, 1_048_576, lrs[name])
        assert config["seed"] == config["data_seed"] == int(run[-1])
        model = load_config(str(out / name / batch / run / "point.py")).model_config(257)
        assert (model.arch, model.n_layer, model.n_head, model.n_embd, model.block_size) == ("llama", 4, 4, 128, 64)
        if name in cures:
            plain, keys = cures[name]
            reference = configs[(plain, batch, run)]
            assert {k: v for k, v in config.items() if v != reference[k] and k != "out_dir"} == keys, name


def test_an_lr_grid_of_one_point_is_its_centre_and_of_an_even_number_is_refused():
    """lr_grid's points a factor apart around the centre scaled to the batch, worked by hand."""
    assert lr_grid(3e-2, 0.5, 512, 3.0) == [0.02, 0.06, 0.18]  # 3e-2 x sqrt(512 / 128) = 0.06
    assert lr_grid(3e-2, 0.5, 512, 2.0, points=5) == [0.015, 0.03, 0.06, 0.12, 0.24]
    assert lr_grid(9e-2, 0.5, 64, points=1) == [0.0636]  # 9e-2 x sqrt(1/2) = 0.06364
    with pytest.raises(ValueError, match="points=2: an odd number"):
        lr_grid(3e-3, 0.0, 64, points=2)


def test_the_small_batch_preset_plans_the_authors_settings(tmp_path):
    """--preset small_batch, planned only (--dry-run), at Marek et al.'s settings: each arm at its
    batches (AdamW with fixed betas at 1 and 512, MERIT at 1 and 4), every point one micro-step a step
    (micro-batch = batch), the token budget, warmup and evaluations of the mini-study's rule, cosine to
    0; no gradient clipping, weight decay 0 but AdamW's 0.1 at batch 512; AdamW's (0.9, 0.95), its
    beta2 by half-life at 0.95's half-life in tokens at batch 512 (0.95 ** (B / 512): 0.9999 at batch
    1, the authors' batch-1 beta2), beta1 0.9; SGD without momentum, Adafactor at the authors'
    decay_rate; each grid the centre scaled by (B / 128) ** exponent, x2 apart."""
    # Each arm's optimizer and grid centre at batch 128 with its exponent in the batch (the preset's, typed here).
    arms = {"adamw": ("adamw", 8.6e-3, 0.3), "adamw_halflife": ("adamw", 1.2e-3, -0.25), "sgd": ("sgd", 0.086, -0.2),
            "adafactor": ("adafactor", 0.128, 0.3), "merit_halflife": ("merit", 6e-2, 0.5)}

    def grid(centre, exponent, batch):  # x2 apart around the centre scaled to the batch, 3 significant digits
        lr = centre * (batch / 128) ** exponent
        return [float(f"{x:.3g}") for x in (lr / 2, lr, lr * 2)]

    out = tmp_path / "small"
    configs = planned("small_batch", out, tmp_path)
    batches = {name: sorted({int(batch[1:]) for n, batch, _ in configs if n == name}) for name, _, _ in configs}
    assert batches == {"adamw": [1, 512], "adamw_halflife": [1, 2, 4, 8, 32], "sgd": [1, 2, 4, 8, 32],
                       "adafactor": [1, 2, 4, 8, 32], "merit_halflife": [1, 4]}
    for (name, batch, point), config in configs.items():
        b = int(batch[1:])
        steps = 1_048_576 // (64 * b)
        assert (config["batch_size"], config["micro_batch_size"], config["max_tokens"]) == (b, b, 1_048_576)
        assert (config["warmup_steps"], config["eval_interval"], config["log_interval"]) == (
            max(5, round(0.05 * steps)), steps // 8, steps // 16)
        assert (config["lr_schedule"], config["min_lr"], config["grad_clip"]) == ("cosine", 0.0, 0.0)
        assert config["weight_decay"] == (0.1 if b == 512 else 0.0)
        assert point.endswith("_s0") and config["seed"] == config["data_seed"] == 0
        optimizer, centre, exponent = arms[name]
        assert config["optimizer"] == optimizer
        assert sorted(float(p.split("_")[0][2:]) for n, bb, p in configs if (n, bb) == (name, batch)) == \
            grid(centre, exponent, b)
        if name.endswith("_halflife"):
            assert config["batch_half_life_betas"] == "beta2"
            assert config["beta2"] == pytest.approx(0.95 ** (b / 512), rel=1e-12) and config["beta1"] == 0.9
        elif name == "adamw":
            assert config["batch_half_life_betas"] == "" and (config["beta1"], config["beta2"]) == (0.9, 0.95)
        else:
            assert config["batch_half_life_betas"] == "" and config["beta1"] is None and config["beta2"] is None
    assert {configs[key]["optimizer_options"]["momentum"] for key in configs if key[0] == "sgd"} == {0.0}
    assert {configs[key]["optimizer_options"]["decay_rate"] for key in configs if key[0] == "adafactor"} == {0.9999}
    assert configs[("adamw_halflife", "b1", "lr0.00404_s0")]["beta2"] == pytest.approx(0.9999, abs=1e-6)


@pytest.mark.slow  # tiny runs in processes of their own, then the report, the small-batch figure and the archive
def test_the_small_batch_preset_reports_each_point_against_the_authors_large_batch_baseline(tmp_path):
    # Byte shards whose validation split holds a held-out micro-batch of 512 sequences of 16 tokens
    # after the validation one (the fixture's is smaller: batch 512 would report no held-out loss).
    data, out, archive = tmp_path / "data", tmp_path / "small", tmp_path / "small_batch.tar.xz"
    data.mkdir()
    for split, n_docs in (("train", 40), ("val", 60)):
        write_shard(data / f"{split}_000000.bin", np.array(
            [token for doc in range(n_docs) for token in (256, *make_text(60, 1000 * len(split) + doc).encode())],
            dtype=np.uint16))
    # 40,960 tokens: 5 steps of batch 512, the fewest its warmup of 5 steps allows (batch 1: 2,560 steps).
    result = subprocess.run([sys.executable, "-m", "scripts.mini_study", "--preset=small_batch", f"--out={out}",
                             f"--data-dir={data}", "--optimizers=adamw,adamw_halflife,sgd", "--batches=1,512",
                             "--seeds=2", "--tokens=40960", "--extend=0", "--jobs=2", f"--archive={archive}",
                             *(f"--set={t}" for t in [*TINY_STUDY, "heldout_tokens=8192"])], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = find_runs([archive])
    # AdamW with fixed betas at both ends (weight decay 0.1 at 512 only), the others at batch 1; no
    # clipping, one micro-step a step; the archive holds this preset's runs alone.
    assert sorted({(r.folder.relative_to(archive).parts[0], r.batch_size) for r in runs}) == [
        ("adamw", 1), ("adamw", 512), ("adamw_halflife", 1), ("sgd", 1)]
    assert all(r.config["micro_batch_size"] == r.batch_size and r.config["grad_clip"] == 0.0 for r in runs)
    assert all(r.config["weight_decay"] == (0.1 if r.batch_size == 512 else 0.0) for r in runs)
    with tarfile.open(archive) as tar:
        assert {name.split("/")[0] for name in tar.getnames()} == {"adamw", "adamw_halflife", "sgd"}
    text = (out / "report.md").read_text()
    assert report(runs, None, "val/loss", "heldout/loss") == text
    for heading in ("## Small batches: each point against its optimizer's largest batch",
                    "## Small batches: against AdamW at the same batch", "## Small batches: the range of good lrs",
                    "## Small batches: wall time per token"):
        assert heading in text
    # AdamW's weight decay goes with the batch, so both AdamW arms are held against the authors'
    # baseline at 512, paired by seed (both seeds); SGD ran at batch 1 only: its own reference.
    assert "adamw's weight_decay goes with the batch (batch 1: 0.0, batch 512: 0.1)." in text
    largest = first_table(text, "## Small batches: each point against its optimizer's largest batch")
    for label in ("adamw (beta2 by half-life)", "adamw"):
        row = next(line for line in largest.splitlines() if line.startswith(f"| {label} | 1 |"))
        assert "| adamw, batch 512 |" in row and row.count("[") == 2
    assert "| sgd |" not in largest
    same = first_table(text, "## Small batches: against AdamW at the same batch")  # (the control, against the half-life)
    assert next(line for line in same.splitlines() if line.startswith("| adamw | 1 |")).startswith("| adamw | 1 | - | ")
    assert next(line for line in same.splitlines() if line.startswith("| adamw | 1 |")).count("[") == 1
    assert (out / "figures" / "small_batch.png").is_file()
