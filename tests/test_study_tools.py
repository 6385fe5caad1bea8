"""study/report.py and study/plot.py (and their CLIs scripts/report.py, scripts/plot.py) on run
folders with known values, their tables checked against values computed here by hand; on real
runs in tests/test_mini_study.py."""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile

import matplotlib.colors
import matplotlib.pyplot as plt
import pytest
import torch

from helpers import ROOT
from model import GPT, GPTConfig
from study import plot
from study.report import first_table, report
from study.runs import Study, find_runs, pack_runs, study_runs
from training.checkpoint import Checkpoint
from training.run_folder import model_sha256

BLOCK = 8
# (optimizer, batch, lr, seed) -> the final validation loss; the curve falls linearly to it.
FINALS = {
    ("adamw", 4, 1e-3, 0): 2.00, ("adamw", 4, 1e-3, 1): 2.10, ("adamw", 4, 3e-3, 0): 1.80, ("adamw", 4, 3e-3, 1): 1.90,
    ("merit", 4, 1e-2, 0): 1.70, ("merit", 4, 1e-2, 1): 1.72,
    ("adamw", 16, 3e-3, 0): 2.50, ("adamw", 16, 3e-3, 1): 2.70,
    ("merit", 16, 1e-2, 0): 1.60, ("merit", 16, 1e-2, 1): 1.62,
}
STEPS = (0, 10, 20, 30, 40)
# The held-out loss is the validation loss plus HELDOUT_PER_LR x lr at every step: chosen on it, AdamW
# at batch 4 would take lr 1e-3 (mean 2.25 against 2.45), where val/loss takes 3e-3.
HELDOUT_PER_LR = 200.0


def write_run(folder, optimizer, batch, lr, seed, final, options=None, diverged_at=None):
    folder.mkdir(parents=True)
    config = {"optimizer": optimizer, "batch_size": batch, "lr": lr, "min_lr": lr / 10, "seed": seed,
              "optimizer_options": options or {}, "qk_norm": None, "max_steps": STEPS[-1]}
    (folder / "config.json").write_text(json.dumps(config))
    records = [{"run_info": {"optim_backend": "auto"}}]
    for i, step in enumerate(STEPS):
        loss = 4.0 - (4.0 - final) * i / (len(STEPS) - 1)
        record = {"step": step, "tokens": step * batch * BLOCK, "val/loss": loss,
                  "heldout/loss": loss + HELDOUT_PER_LR * lr}
        if step:
            # layer 0's logit peaks at step 20 at 10 x (1 + seed); layer 1's grows to 5 x step.
            record.update({"train/loss": loss + 0.1, "max_logit/layer_00": (10.0 if step == 20 else 3.0) * (1 + seed),
                           "max_logit/layer_01": 5.0 * step})
            # the per-head keys beside them (head 0 holds the layer's max) and the other instruments
            record.update({f"max_logit/layer_{layer:02d}/head_{head:02d}":
                           record[f"max_logit/layer_{layer:02d}"] / (1 + head) for layer in (0, 1) for head in (0, 1, 2)})
            record.update({f"attn_entropy/layer_{layer:02d}": 2.0 - 0.01 * step * (1 + layer) for layer in (0, 1)})
            record.update({"noise_scale/b_simple": 100.0 + step, "noise_scale/batch_tokens": batch * BLOCK})
            if optimizer == "merit":
                for layer in (0, 1):
                    name = f"transformer.h.{layer}.attn.c_attn.weight"
                    record.update({f"clip_fraction/{name}": 0.01 * layer + 0.001 * step,
                                   f"trust_ratio_min/{name}": 0.5, f"trust_ratio_max/{name}": 2.0 + layer})
        records.append(record)
        if step == diverged_at:
            break
    records[-1]["zero_shot/piqa/acc"] = 0.5 + final / 10
    (folder / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")


@pytest.fixture
def study(tmp_path):
    for (optimizer, batch, lr, seed), final in FINALS.items():
        write_run(tmp_path / "sweep" / f"{optimizer}_b{batch}_lr{lr:g}_s{seed}", optimizer, batch, lr, seed, final)
    write_run(tmp_path / "sweep" / "maxlamb_b4", "merit", 4, 1e-2, 0, 1.9, options={"maxlamb": True})
    # A point whose run stopped at step 20 (diverged): a better loss so far, yet never the best lr.
    write_run(tmp_path / "sweep" / "adamw_b4_lr0.01_s0", "adamw", 4, 1e-2, 0, 0.5, diverged_at=20)
    write_checkpoint_and_hessian(tmp_path / "sweep" / "merit_b16_lr0.01_s0", 12.5, 3400.0)
    return tmp_path / "sweep"


def write_checkpoint_and_hessian(folder, top_eigenvalue, trace, seed=0):
    """The run's final checkpoint (a tiny model of its own) and a hessian.json of that model."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=BLOCK, vocab_size=320))
    Checkpoint.of_model(model, "byte", step=STEPS[-1]).save(folder / f"ckpt_{STEPS[-1]:08d}.pt")
    (folder / "hessian.json").write_text(json.dumps({"step": STEPS[-1], "model_sha256": model_sha256(model),
                                                     "top_eigenvalue": top_eigenvalue, "trace": trace}))


def cli(name: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"scripts.{name}", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)


def _cell(values, lr, edge=False):
    """A loss-table cell computed here: mean ± std [± t(0.975, n-1) std / sqrt(n)] (lr, n)."""
    n, mean = len(values), statistics.fmean(values)
    where = f"lr {lr:g}{', on the grid edge' if edge else ''}, n={n}"
    if n == 1:
        return f"{mean:.3f} ({where})"
    std = statistics.stdev(values)
    return f"{mean:.3f} ± {std:.3f} [±{T_975[n - 1] * std / math.sqrt(n):.3f}] ({where})"


T_975 = {1: 12.706, 2: 4.303}  # Student's t, two-sided 95%, by degrees of freedom


def test_report_tables_hold_the_hand_computed_values(study, tmp_path):
    result = cli("report", study, "--target", "2.3", "--out", tmp_path / "report.md")
    text = result.stdout
    assert result.returncode == 0 and (tmp_path / "report.md").read_text() == text
    runs = find_runs([study])
    assert len(runs) == len(FINALS) + 2 and "# Study report: 12 runs, 5 points" in text
    assert "| adamw | 4 | 0.01 | did not finish | 0 of 1 |" in text
    assert "Did not finish" in text and "adamw batch 4 lr 0.01 seed 0 (last logged step 20 of 40)" in text
    # AdamW at batch 4: lr 3e-3 wins (mean 1.85 against 2.05), inside its grid (1e-3 to 1e-2).
    assert f"| adamw | {_cell([1.8, 1.9], 3e-3)} | {_cell([2.5, 2.7], 3e-3, edge=True)} |" in text
    assert f"| merit (maxLAMB) | {_cell([1.9], 1e-2, edge=True)} | - |" in text
    # The grid keeps the losing lr too, with its max logits: layer 1's 5 x 40 = 200 is the largest.
    half = T_975[1] * statistics.stdev([2.0, 2.1]) / math.sqrt(2)
    assert f"| adamw | 4 | 0.001 | 2.050 ± {statistics.stdev([2.0, 2.1]):.3f} [±{half:.3f}] | 2 of 2 | 200 | 200 |" in text
    # Paired by seed against AdamW at the same batch: merit b4 (1.70, 1.72) - adamw (1.80, 1.90) =
    # (-0.10, -0.18): mean -0.14, interval +- 12.706 x 0.0566 / sqrt(2); against AdamW's batch 4 mean.
    diffs = [1.70 - 1.80, 1.72 - 1.90]
    half = T_975[1] * statistics.stdev(diffs) / math.sqrt(2)
    mean = statistics.fmean(diffs)
    assert f"| merit | 4 | {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}] | {1.71 - 1.85:+.3f} (batch 4) |" in text
    assert f"| merit | 16 | {statistics.fmean([1.6 - 2.5, 1.62 - 2.7]):+.3f} [" in text
    assert "| merit (maxLAMB) | 4 | +0.100 (1 seed) | +0.050 (batch 4) |" in text  # (seed 0: 1.9 - 1.8)
    # And against MERIT: AdamW's paired differences are MERIT's against AdamW, negated; against MERIT's
    # batch 4 mean (1.71). No Muon runs: no section against Muon.
    against_merit = text[text.index("## Against merit"):text.index("## Every lr")]
    assert f"| adamw | 4 | {-mean:+.3f} [{-mean - half:+.3f}, {-mean + half:+.3f}] | {1.85 - 1.71:+.3f} (batch 4) |" \
        in against_merit and "## Against muon" not in text
    # Max logit: layer 0 peaks at 10 (seed 0) and 20 (seed 1), mean 15; ends at 3 and 6 -> 4.5.
    assert "| adamw | 4 | 0.003 (selected) | 15 / 4.5 | 200 / 200 |" in text
    assert "| adamw | 4 | 0.01 | 10 / 10 | 100 / 100 |" in text  # the diverged lr: up to its step 20
    # Steps to 2.3, interpolated: the curve falls from 4.0 to the final loss in 4 equal steps of 10.
    # adamw b4 lr 3e-3, finals 1.8 and 1.9: 2.35 and 2.425 at step 30, 1.8 and 1.9 at 40, so 2.3 at
    # 30 + 10 x 0.05 / 0.55 and 30 + 10 x 0.125 / 0.525; adamw b16 (2.5, 2.7) never.
    steps = statistics.fmean([30 + 10 * 0.05 / 0.55, 30 + 10 * 0.125 / 0.525])
    assert f"| adamw | 4 | {steps:.1f} | {steps * 4 * BLOCK:,.0f} |" in text
    assert "| adamw | 16 | not reached | - |" in text
    assert "| merit | 16 | 12.50 | 3400.0 |" in text  # the Hessian of the one seed that has one
    assert "piqa/acc" in text and "selected on val/loss, reported on val/loss" in text


def test_report_defaults_the_target_to_the_worst_best_point(study):
    text = report(find_runs([study]), target=None)
    assert "## Steps and tokens to val/loss 2.600" in text  # adamw b16's mean


def test_two_model_sizes_at_one_batch_are_two_points_never_averaged(tmp_path):
    """GPT-2 Small at two lrs and GPT-2 Medium at one, at batch 1024: two rows, each named by its
    shape; Small's best lr is its own, Medium's value its own."""
    for name, n_layer, lr, final in (("small_a", 12, 6e-4, 3.47), ("small_b", 12, 3e-4, 3.50),
                                     ("medium", 24, 3e-4, 3.17)):
        write_run(tmp_path / name, "adamw", 1024, lr, 0, final)
        config = json.loads((tmp_path / name / "config.json").read_text())
        (tmp_path / name / "config.json").write_text(json.dumps({**config, "n_layer": n_layer}))
    text = report(find_runs([tmp_path]), target=None)
    assert "2 points" in text
    assert f"| adamw, n_layer=12 | {_cell([3.47], 6e-4, edge=True)} |" in text
    assert f"| adamw, n_layer=24 | {_cell([3.17], 3e-4, edge=True)} |" in text
    assert "3.335" not in text  # the mean of Medium and a Small run


def test_a_schedule_an_optimizer_fixes_goes_with_it_and_older_records_read_as_the_default(tmp_path):
    """Schedule-Free's constant schedule is said once, not in every label, so its row is paired with
    AdamW's; a record without a key (older than it) is a run of its default: one point with a new one."""
    for name, optimizer, lr, seed, final, schedule in (("sf_s0", "adamw_schedulefree", 1e-3, 0, 2.9, "constant"),
                                                       ("sf_s1", "adamw_schedulefree", 1e-3, 1, 2.7, "constant"),
                                                       ("adamw_s0", "adamw", 1e-3, 0, 3.0, None),
                                                       ("adamw_s1", "adamw", 1e-3, 1, 3.0, "cosine")):
        write_run(tmp_path / name, optimizer, 16, lr, seed, final)
        if schedule:
            config = json.loads((tmp_path / name / "config.json").read_text())
            (tmp_path / name / "config.json").write_text(json.dumps({**config, "lr_schedule": schedule}))
    text = report(find_runs([tmp_path]), target=None)
    assert "lr_schedule goes with the optimizer (adamw: cosine, adamw_schedulefree: constant)." in text
    assert f"| adamw | {_cell([3.0, 3.0], 1e-3, edge=True)} |" in text  # (the seed without the key joins)
    assert f"| adamw_schedulefree | {_cell([2.9, 2.7], 1e-3, edge=True)} |" in text
    assert "| adamw_schedulefree | 16 | -0.200 [" in text  # against AdamW, paired by seed


def test_an_lr_with_a_diverged_seed_is_never_selected(tmp_path):
    """lr 1e-2: seed 0 ends at 1.5, seed 1 diverged; lr 3e-3: both seeds finish at 1.9. The
    survivor's 1.5 would win; the lr is out: 3e-3 is selected, and the report says why."""
    write_run(tmp_path / "a0", "adamw", 4, 1e-2, 0, 1.5)
    write_run(tmp_path / "a1", "adamw", 4, 1e-2, 1, 1.4, diverged_at=20)
    for seed in (0, 1):
        write_run(tmp_path / f"b{seed}", "adamw", 4, 3e-3, seed, 1.9)
    text = report(find_runs([tmp_path]), target=None)
    assert f"| adamw | {_cell([1.9, 1.9], 3e-3, edge=True)} |" in text
    assert "| adamw | 4 | 0.01 | 1.500 | 1 of 2 |" in text


def test_a_replica_run_that_lost_a_group_reads_as_its_effective_batch(tmp_path):
    """A replica group's run whose last record says 3/4 of its tokens reached its weights (a group gone
    for part of the run) averaged 0.75 x its batch of 16; one whose record lost none is its batch."""
    for name, lost in (("whole", 0), ("short", 1)):
        write_run(tmp_path / name, "adamw", 16, 1e-3, 0 if name == "whole" else 1, 2.0)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        records[-1].update({"replicas/tokens_trained": records[-1]["tokens"] * (4 - lost) // 4,
                            "replicas/tokens_lost": records[-1]["tokens"] * lost // 4})
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
    runs = {run.name: run for run in find_runs([tmp_path])}
    assert (runs["whole"].effective_batch, runs["short"].effective_batch) == (16, 12.0)
    assert "adamw batch 16 lr 0.001 seed 1: 12.0." in report(list(runs.values()), target=None)


def test_the_report_says_whether_each_run_s_replica_groups_ended_with_one_model(tmp_path):
    """Two runs of two replica groups each (replica_0, replica_1): one whose groups' final weights
    digests agree, one whose do not; the report names each run's verdict."""
    for run, digests in (("agreed", ("aa", "aa")), ("split", ("aa", "bb"))):
        for group, digest in enumerate(digests):
            folder = tmp_path / run / f"replica_{group}"
            write_run(folder, "adamw", 16, 1e-3, group, 2.0)
            records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            records[-1]["replicas/weights_sha256"] = digest
            (folder / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
    text = report(find_runs([tmp_path]), target=None)
    assert ("Replica groups' final weights (their digests, docs/scaling_out.md): agreed (groups 0, 1): one model; "
            "split (groups 0, 1): DIFFERENT MODELS, groups 0 | 1.") in text


def test_a_merit_ablation_is_never_merit(study):
    best = Study(find_runs([study])).best()
    assert {label for label, _ in best} == {"adamw", "merit", "merit (maxLAMB)"}
    # (by the folders' names, which the fixture wrote: the plain MERIT runs, never the ablation)
    assert {point: [r.name for r in s.runs] for point, s in best.items()} == {
        ("adamw", 4): ["adamw_b4_lr0.003_s0", "adamw_b4_lr0.003_s1"],
        ("adamw", 16): ["adamw_b16_lr0.003_s0", "adamw_b16_lr0.003_s1"],
        ("merit", 4): ["merit_b4_lr0.01_s0", "merit_b4_lr0.01_s1"],
        ("merit", 16): ["merit_b16_lr0.01_s0", "merit_b16_lr0.01_s1"],
        ("merit (maxLAMB)", 4): ["maxlamb_b4"]}


@pytest.mark.slow  # matplotlib, every figure
def test_plot_writes_every_figure(study, tmp_path):
    out = tmp_path / "figures"
    result = cli("plot", study, "--out", out, "--report-on", "heldout/loss")
    assert result.returncode == 0, result.stderr
    assert "12 runs, lrs selected on val/loss, losses drawn on heldout/loss ->" in result.stdout
    names = sorted(p.name for p in out.iterdir())
    assert names == ["attn_entropy.png", "max_logit.png", "max_logit_heads.png", "merit_diagnostics.png",
                     "noise_scale.png", "peak_logit.png", "scaling.png", "val_loss.png"]
    for path in out.iterdir():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000
    # The per-layer averages behind the diagnostics figure.
    merit = next(r for r in find_runs([study]) if r.name == "merit_b16_lr0.01_s0")
    steps, clip = plot.per_layer(merit, "clip_fraction")[1]
    assert steps == [10, 20, 30, 40] and clip == pytest.approx([0.02, 0.03, 0.04, 0.05])
    # The heatmaps' cells: layer 0 at step 20 is 10 (seed 0), layer 1 is 5 x 20; head h holds 1 / (1 + h) of it.
    assert [v for row in plot.head_logits(merit, 20) for v in row] == pytest.approx([10.0, 5.0, 10 / 3, 100.0, 50.0, 100 / 3])


@pytest.mark.slow  # the scripts as processes of their own
def test_no_runs_is_a_clear_error(tmp_path):
    for name, args in (("report", [tmp_path]), ("plot", [tmp_path, "--out", tmp_path / "f"])):
        result = cli(name, *args)
        assert result.returncode == 1 and f"{name}: no runs that logged val/loss under {tmp_path}" in result.stderr


def test_an_archive_of_the_runs_gives_the_same_report(study, tmp_path):
    runs = find_runs([study])
    archive = tmp_path / "runs.tar.xz"
    pack_runs(runs, study, archive)
    packed = find_runs([archive])
    assert [r.folder.relative_to(archive) for r in packed] == [r.folder.relative_to(study) for r in runs]
    assert [r.hessian for r in packed] == [r.hessian for r in runs] and any(r.hessian for r in packed)
    assert report(packed, target=None) == report(runs, target=None)
    first = archive.read_bytes()
    pack_runs(runs, study, archive)
    assert archive.read_bytes() == first  # the same runs, the same bytes


def test_a_hessian_of_another_model_is_not_the_runs_and_a_note_says_so(study, tmp_path, capsys):
    """The run's folder got another checkpoint at the Hessian's step (the run started over, its
    hessian.json left by the earlier model): neither the report nor an archive shows it as the
    run's, and the CLIs name it, as they do a hessian.json that records no model, or whose
    checkpoint is gone."""
    folder = study / "merit_b16_lr0.01_s0"
    assert "## Hessian\n\n| point | batch | top eigenvalue | trace |" in report(find_runs([study]), target=None)
    earlier = json.loads((folder / "hessian.json").read_text())["model_sha256"]
    torch.manual_seed(2)  # the new model at step 40
    Checkpoint.of_model(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=BLOCK, vocab_size=320)), "byte",
                        step=STEPS[-1]).save(folder / "ckpt_00000040.pt")
    (study / "adamw_b16_lr0.003_s0" / "hessian.json").write_text(json.dumps({"step": 40, "top_eigenvalue": 1.0}))
    (study / "adamw_b4_lr0.003_s0" / "hessian.json").write_text(json.dumps(
        {"step": 30, "model_sha256": "ab" * 32, "top_eigenvalue": 1.0}))
    runs = study_runs(argparse.Namespace(paths=[study], select_on="val/loss"), "report")
    note = capsys.readouterr().err
    assert note.startswith("report: not shown as their runs' (another model's, or not known to be the run's): ")
    assert (f"{folder / 'hessian.json'}: its model (step 40, model_sha256 {earlier[:12]}) is not this run's "
            f"checkpoint of that step, ckpt_00000040.pt: another model's") in note
    assert (f"{study / 'adamw_b16_lr0.003_s0' / 'hessian.json'}: it records no model_sha256, so no checkpoint of "
            f"this run can be told to be its model (measure again)") in note
    assert (f"{study / 'adamw_b4_lr0.003_s0' / 'hessian.json'}: the run folder holds no checkpoint of its step 30 to "
            f"match its model (model_sha256 {'ab' * 6})") in note
    assert not any(r.hessian for r in runs) and "## Hessian" not in report(runs, target=None)
    pack_runs(runs, study, tmp_path / "runs.tar.xz")
    with tarfile.open(tmp_path / "runs.tar.xz") as tar:
        assert not any(name.endswith("hessian.json") for name in tar.getnames())


def _loss_table_means(text: str, label: str) -> list[float]:
    """The means of ``label``'s row of a report's final-loss table, batch by batch ("-" left out)."""
    row = next(line for line in first_table(text, "## Final").splitlines() if line.startswith(f"| {label} |"))
    return [float(cell.split()[0]) for cell in row.strip("|").split("|")[1:] if cell.strip() != "-"]


def test_scaling_draws_the_report_metric_at_the_lr_chosen_on_the_select_metric(study):
    """Chosen on val/loss, reported on heldout/loss: each point's line holds the report's means, the
    held-out loss of the seeds at the val/loss-selected lr (computed here from FINALS); chosen on
    heldout/loss, AdamW at batch 4 moves to lr 1e-3."""
    runs = find_runs([study])
    for select_on, adamw_lr in (("val/loss", 3e-3), ("heldout/loss", 1e-3)):
        fig = plot.plot_scaling(Study(runs, select_on), "heldout/loss")
        ax = fig.axes[0]
        lines = {line.get_label(): line for line in ax.get_lines()}
        expected = {label: [statistics.fmean(final + HELDOUT_PER_LR * lr for (o, b, lr, _), final in FINALS.items()
                                             if o == optimizer and b == batch and lr == best)
                            for batch, best in lrs]
                    for label, optimizer, lrs in (("adamw", "adamw", [(4, adamw_lr), (16, 3e-3)]),
                                                  ("merit", "merit", [(4, 1e-2), (16, 1e-2)]))}
        expected["merit (maxLAMB)"] = [1.9 + HELDOUT_PER_LR * 1e-2]
        text = report(runs, None, select_on, "heldout/loss")
        for label, means in expected.items():
            assert list(lines[label].get_xdata()) == ([4] if label == "merit (maxLAMB)" else [4, 16])
            assert list(lines[label].get_ydata()) == pytest.approx(means)
            assert _loss_table_means(text, label) == [round(m, 3) for m in means]  # the table's numbers
        assert ax.get_ylabel() == "final heldout/loss"
        assert "Final heldout/loss" in ax.get_title() and f"selected on {select_on}" in ax.get_title()
        plt.close(fig)


def test_the_loss_over_tokens_draws_the_report_metric(study):
    """val_loss.png's curves: the report metric over tokens, the mean of the seeds at the selected lr
    (the curve falls linearly from 4.0 to the final loss, plus the held-out shift)."""
    fig = plot.plot_loss(Study(find_runs([study]), "val/loss"), "heldout/loss")
    panel = next(ax for ax in fig.axes if ax.get_title().startswith("batch 4\n"))
    adamw = next(line for line in panel.get_lines() if line.get_label() == "adamw")
    curve = [statistics.fmean(4.0 - (4.0 - final) * i / (len(STEPS) - 1) for final in (1.8, 1.9))
             + HELDOUT_PER_LR * 3e-3 for i in range(len(STEPS))]
    assert list(adamw.get_xdata()) == [step * 4 * BLOCK for step in STEPS]
    assert list(adamw.get_ydata()) == pytest.approx(curve)
    assert "adamw 0.003" in panel.get_title() and panel.get_ylabel() == "heldout/loss"
    title = " ".join(fig.get_suptitle().split())  # (wrapped to the figure's width)
    assert title.startswith("heldout/loss over training") and "selected on val/loss" in title
    plt.close(fig)


@pytest.mark.slow  # (the tool run as a process)
def test_plot_help_names_every_input_and_both_metrics():
    result = cli("plot", "--help")
    assert result.returncode == 0, result.stderr
    help_text = " ".join(result.stdout.split())
    for words in ("run folders", "sweep folders", "folders above them", ".tar.xz archives of runs",
                  "--select-on SELECT_ON", "--report-on REPORT_ON", "(default: --select-on)"):
        assert words in help_text


def _luminance(colour) -> float:
    """WCAG's relative luminance of an sRGB colour: white is 1, black 0."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in matplotlib.colors.to_rgb(colour)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def test_every_line_shows_on_white_and_a_layer_keeps_its_colour(study):
    """Every layer and point colour has a luminance below 0.5 (tab10's lightest, its olive, is 0.47;
    viridis's pale yellow end 0.78), and a layer has one colour in every per-layer figure, named in
    a legend large enough to read."""
    figure_study = Study(find_runs([study]), "val/loss")
    figures = [plot.plot_max_logits(figure_study), plot.plot_attention_entropy(figure_study),
               plot.plot_merit_diagnostics(figure_study)]
    by_layer = {}
    for fig in figures:
        for ax in fig.axes:
            for line in ax.get_lines():
                if line.get_label().startswith("layer "):
                    by_layer.setdefault(line.get_label(), set()).add(matplotlib.colors.to_hex(line.get_color()))
    assert sorted(by_layer) == ["layer 0", "layer 1"] and all(len(c) == 1 for c in by_layer.values())
    for fig in figures[:2]:
        legend = fig.legends[0]
        assert [t.get_text() for t in legend.get_texts()] == ["layer 0", "layer 1"]
        assert min(t.get_fontsize() for t in legend.get_texts()) >= 10
    colours = [*plot.layer_colours(24), *plot.point_colours(figure_study).values()]
    assert max(map(_luminance, colours)) < 0.5 < _luminance(matplotlib.colormaps["viridis"](1.0))
    for fig in figures:
        plt.close(fig)


def test_the_cure_table_and_labels_hold_hand_written_capped_logits_and_log_z(tmp_path):
    """Soft-capped and z-loss points get their own labels (their keys would otherwise name every point),
    and a table of the largest layer's raw and capped logit, the output's, and the final log Z."""
    settings = {"adamw": {}, "softcap": {"attn_logit_softcap": 15.0, "final_logit_softcap": 10.0},
                "zloss": {"z_loss": 1e-4}}
    for name, extra in settings.items():
        folder = tmp_path / name
        write_run(folder, "adamw", 4, 1e-3, 0, 2.0)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "attn_logit_softcap": None,
                                                        "final_logit_softcap": None, "z_loss": 0.0, **extra}))
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        for record in records[1:]:  # step 0 logs no instruments
            if record["step"]:
                step = record["step"]
                record.update({"output/max_abs_logit": 0.5 * step, "output/log_z": 7.0 + step / 100})
                if name == "softcap":
                    record.update({"max_logit_capped/layer_00": 1.0, "max_logit_capped/layer_01": 0.25 * step,
                                   "output/max_abs_logit_capped": 0.2 * step})
        (folder / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
    text = report(find_runs([tmp_path]), None, "val/loss", None)
    table = first_table(text, "## Logits raw and soft-capped, and log Z")
    # Layer 1's raw logit 5 x step (peak and final 200 at step 40) is the largest layer's; capped 0.25 x
    # step: 10; the output's 0.5 x step: 20, capped 0.2 x step: 8; log Z at step 40: 7.4.
    assert "| adamw + softcap 15/10 | 4 | 0.001 (selected) | 200 / 200 | 10 / 10 | 20 / 20 | 8 / 8 | 7.4 |" in table
    assert "| adamw + z_loss 0.0001 | 4 | 0.001 (selected) | 200 / 200 | - | 20 / 20 | - | 7.4 |" in table
    assert "| adamw | 4 | 0.001 (selected) | 200 / 200 | - | 20 / 20 | - | 7.4 |" in table


# A sequence-length warmup's study (scripts/mini_study.py --preset seq_len_warmup): AdamW and MERIT, each
# plain and with the warmup, two seeds. A warmup's steps train fewer tokens than they read: its runs
# log the tokens trained and read at each step (WARMUP_TOKENS, tokens read: the plain runs' tokens).
WARMUP_TOKENS = (0, 200, 500, 800, 1120)  # trained by STEPS' ends; a plain run's: step x 4 x BLOCK


@pytest.fixture
def warmups(tmp_path):
    for optimizer, lr in (("adamw", 3e-3), ("merit", 1e-2)):
        for warm in (False, True):
            for seed in (0, 1):
                folder = tmp_path / "warmup" / f"{optimizer}{'_slw' * warm}_s{seed}"
                write_run(folder, optimizer, 4, lr, seed, 2.0 - 0.1 * warm + 0.01 * seed)
                config = json.loads((folder / "config.json").read_text())
                if warm:
                    config.update({"seq_len_warmup_start": 8, "seq_len_warmup_steps": 20})
                (folder / "config.json").write_text(json.dumps(config))
                records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
                for i, record in enumerate(records[1:]):
                    step = record["step"]
                    if warm:
                        record.update({"tokens": WARMUP_TOKENS[i], "batch/tokens_read": step * 4 * BLOCK})
                    if step and optimizer == "adamw":  # (v's largest element: 1e-3 x step, x 2 for seed 1)
                        record.update({"second_moment/max": 1e-3 * step * (1 + seed),
                                       "second_moment/l2": 0.1 * step / (1 + warm)})
                (folder / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
    return tmp_path / "warmup"


def test_a_warmup_s_label_table_and_second_moment_hold_the_hand_written_values(warmups):
    """A warmup's points are labelled by its start and duration (with its pacing, multiple and reshape
    where not the defaults), compared with their optimizer's plain point, and their tokens trained and
    read, and every run's second moment beside its max logit, tabled as logged."""
    text = report(find_runs([warmups]), None, "val/loss", None)
    # The final losses: 1.90 and 1.91 with the warmup, 2.00 and 2.01 without, paired by seed: -0.1 each.
    assert "| adamw + seq_len_warmup 8 over 20 steps | 4 | -0.100 [-0.100, -0.100] |" in first_table(
        text, "## Against adamw")
    assert "| merit + seq_len_warmup 8 over 20 steps | 4 | -0.100 [-0.100, -0.100] |" in first_table(
        text, "## Against merit")
    warmup = first_table(text, "## Sequence-length warmup")
    # 40 steps; 1,120 tokens trained of 40 x 4 x 8 = 1,280 read: 160 (12.5%) read, not trained.
    assert "| adamw + seq_len_warmup 8 over 20 steps | 4 | 0.003 | 40 | 1,120 | 1,280 | 12.5% |" in warmup
    assert "| adamw | 4 | 0.003 | 40 | 1,280 | 1,280 | 0.0% |" in warmup
    moments = first_table(text, "## The second moment and the max attention logit")
    # v's largest element at step 40: 0.04 and 0.08 (mean 0.06); l2 0.1 x 40 = 4, halved with the
    # warmup; the logit's largest layer is layer 1's 5 x step (200); MERIT logged no second moment.
    assert "| adamw | 4 | 0.003 (selected) | 0.06 / 0.06 | 4 / 4 | 200 / 200 |" in moments
    assert "| adamw + seq_len_warmup 8 over 20 steps | 4 | 0.003 (selected) | 0.06 / 0.06 | 2 / 2 | 200 / 200 |" \
        in moments
    assert "| merit | 4 | 0.01 (selected) | - | - | 200 / 200 |" in moments
    run = next(r for r in find_runs([warmups]) if r.name == "adamw_slw_s0")
    run.config.update({"seq_len_warmup_pacing": "root", "seq_len_warmup_root_degree": 3.0,
                       "seq_len_warmup_multiple": 16, "seq_len_warmup_reshape": True, "seq_len_warmup_steps": 0,
                       "seq_len_warmup_tokens": 65536})
    assert run.optimizer_label == "adamw + seq_len_warmup 8 over 65,536 tokens, root 3, multiple 16, reshaped"


def test_the_warmup_figure_draws_each_signal_against_the_tokens_trained(warmups, study):
    """seq_len_warmup.png: the loss, the largest layer's max logit and v's largest element against
    the tokens trained (a warmup's own), the seeds' mean; not drawn for runs without a warmup."""
    fig = plot.plot_seq_len_warmup(Study(find_runs([warmups]), "val/loss"), "val/loss")
    loss, logit, moment = fig.axes[:3]
    line = {ax: {l.get_label(): l for l in ax.get_lines()} for ax in (loss, logit, moment)}
    warm = line[loss]["adamw + seq_len_warmup 8 over 20 steps"]
    assert list(warm.get_xdata()) == list(WARMUP_TOKENS)
    assert list(warm.get_ydata()) == pytest.approx([statistics.fmean(4.0 - (4.0 - f) * i / 4 for f in (1.9, 1.91))
                                                    for i in range(5)])
    assert list(line[logit]["merit"].get_ydata()) == [max(3.0 * 1.5 if s != 20 else 15.0, 5.0 * s) for s in STEPS[1:]]
    assert list(line[moment]["adamw"].get_xdata()) == [s * 4 * BLOCK for s in STEPS[1:]]
    assert list(line[moment]["adamw"].get_ydata()) == pytest.approx([1.5e-3 * s for s in STEPS[1:]])
    assert "merit" not in line[moment] and moment.get_yscale() == "log" and logit.get_yscale() == "symlog"
    plt.close(fig)
    assert plot.plot_seq_len_warmup(Study(find_runs([study]), "val/loss"), "val/loss") is None


# The small-batch section (a report of runs that reach batch 1, scripts/mini_study.py --preset small_batch):
# (label, optimizer, batch, lr, seed) -> the final validation loss (the held-out loss is the same
# plus HELDOUT_PER_LR x lr). AdamW with fixed betas at batches 8 and 32, AdamW with beta2 by
# half-life (0.95 ** (B / 32)) at 1 and 8, SGD at 1 and 8; seeds 0 and 1 at the best lr, seed 0 at
# the others.
SMALL = {
    ("fixed", "adamw", 8, 3e-3, 0): 2.30, ("fixed", "adamw", 8, 3e-3, 1): 2.34, ("fixed", "adamw", 8, 1e-3, 0): 2.40,
    ("fixed", "adamw", 32, 3e-3, 0): 2.60, ("fixed", "adamw", 32, 3e-3, 1): 2.68, ("fixed", "adamw", 32, 1e-2, 0): 2.65,
    ("half", "adamw", 1, 3e-3, 0): 2.10, ("half", "adamw", 1, 3e-3, 1): 2.12, ("half", "adamw", 1, 1e-3, 0): 2.12,
    ("half", "adamw", 1, 1e-2, 0): 2.50,
    ("half", "adamw", 8, 3e-3, 0): 2.25, ("half", "adamw", 8, 3e-3, 1): 2.31, ("half", "adamw", 8, 1e-2, 0): 2.40,
    ("sgd", "sgd", 1, 0.3, 0): 2.00, ("sgd", "sgd", 1, 0.3, 1): 2.02, ("sgd", "sgd", 1, 0.1, 0): 2.05,
    ("sgd", "sgd", 1, 1.0, 0): 2.015,
    ("sgd", "sgd", 8, 1.0, 0): 2.50, ("sgd", "sgd", 8, 1.0, 1): 2.56, ("sgd", "sgd", 8, 0.3, 0): 2.60,
}
# Tokens a second each run logged: 1,000 x the micro-batch (a point's runs alike), so its wall time is known.
MICRO = {1: 1, 8: 4, 32: 16}


@pytest.fixture
def small_batches(tmp_path):
    for (arm, optimizer, batch, lr, seed), final in SMALL.items():
        folder = tmp_path / "small" / f"{arm}_b{batch}_lr{lr:g}_s{seed}"
        write_run(folder, optimizer, batch, lr, seed, final)
        config = json.loads((folder / "config.json").read_text())
        config.update({"micro_batch_size": MICRO[batch], "beta1": None, "beta2": None})
        if optimizer == "adamw":
            config.update({"beta1": 0.9, "beta2": 0.95 ** (batch / 32) if arm == "half" else 0.95,
                           "batch_half_life_betas": "beta2" if arm == "half" else ""})
        (folder / "config.json").write_text(json.dumps(config))
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        for record in records:
            if record.get("step"):
                record["tokens_per_s"] = 1000.0 * MICRO[batch]
        (folder / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
    return tmp_path / "small"


def _paired(a: list[float], b: list[float]) -> str:
    """A paired difference cell computed here: mean [mean -+ t(0.975, n-1) std / sqrt(n)] of a - b."""
    diffs = [x - y for x, y in zip(a, b)]
    mean, half = statistics.fmean(diffs), T_975[len(diffs) - 1] * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def _heldout(arm: str, batch: int, lr: float) -> list[float]:
    return [final + HELDOUT_PER_LR * lr for (a, _, b, l, _), final in SMALL.items() if (a, b, l) == (arm, batch, lr)]


def test_the_small_batch_section_holds_the_hand_computed_values(small_batches):
    text = report(find_runs([small_batches]), None, "val/loss", "heldout/loss")  # (batch 1: the section by itself)
    # AdamW with beta2 by half-life is a point of its own beside AdamW's fixed betas, its beta2 named
    # once, batch by batch; the fixed arm's is one value at every batch, so not named.
    assert f"adamw (beta2 by half-life)'s beta2 goes with the batch (batch 1: {0.95 ** (1 / 32)}, batch 8: " \
           f"{0.95 ** 0.25})." in text and "adamw's beta2" not in text
    assert f"| adamw (beta2 by half-life) | {_cell(_heldout('half', 1, 3e-3), 3e-3)} | " in text
    # Against the optimizer's largest batch, paired by seed: AdamW's is the fixed arm's 32 (for both
    # arms), SGD's its 8.
    largest = first_table(text, "## Small batches: each point against its optimizer's largest batch")
    fixed32 = _heldout("fixed", 32, 3e-3)
    assert (f"| adamw (beta2 by half-life) | 1 | {_mean_cell(_heldout('half', 1, 3e-3))} | adamw, batch 32 | "
            f"{_paired(_heldout('half', 1, 3e-3), fixed32)} |") in largest
    assert f"| adamw | 8 | {_mean_cell(_heldout('fixed', 8, 3e-3))} | adamw, batch 32 | " \
           f"{_paired(_heldout('fixed', 8, 3e-3), fixed32)} |" in largest
    assert f"| sgd | 1 | {_mean_cell(_heldout('sgd', 1, 0.3))} | sgd, batch 8 | " \
           f"{_paired(_heldout('sgd', 1, 0.3), _heldout('sgd', 8, 1.0))} |" in largest
    assert "| adamw | 32 |" not in largest and "| sgd | 8 |" not in largest  # (the references themselves)
    # Against each AdamW point at the same batch: the half-life arm against the fixed one at 8 (the
    # control), SGD against both where they ran; a row with neither is left out.
    same = first_table(text, "## Small batches: against AdamW at the same batch")
    assert same.splitlines()[0] == ("| point | batch | Δ vs adamw, paired by seed [95%] | Δ vs adamw (beta2 by "
                                    "half-life), paired by seed [95%] |")
    assert f"| adamw | 8 | - | {_paired(_heldout('fixed', 8, 3e-3), _heldout('half', 8, 3e-3))} |" in same
    assert f"| sgd | 1 | - | {_paired(_heldout('sgd', 1, 0.3), _heldout('half', 1, 3e-3))} |" in same
    assert (f"| sgd | 8 | {_paired(_heldout('sgd', 8, 1.0), _heldout('fixed', 8, 3e-3))} | "
            f"{_paired(_heldout('sgd', 8, 1.0), _heldout('half', 8, 3e-3))} |") in same
    assert "| adamw | 32 |" not in same and "| adamw (beta2 by half-life) | 1 |" not in same
    # The range of good lrs, on seed 0's val/loss. SGD at batch 1: 2.05, 2.00, 2.015 at 0.1, 0.3, 1:
    # within 1% of 2.00 (2.02) are 0.3 and 1, on the grid's edge; interpolated in log lr, the low end
    # is 0.4 of the way from 0.3 to 0.1 ((2.02 - 2.00) / (2.05 - 2.00)), the high end the edge, 1.
    lrs = first_table(text, "## Small batches: the range of good lrs")
    low = 0.3 * (0.1 / 0.3) ** 0.4
    assert f"| sgd | 1 | 3 | 0.3 (2.000) | 0.3, 1 | ≥ {1 / 0.3:.3g} | ≥ {1 / low:.3g} |" in lrs
    # AdamW with beta2 by half-life at batch 1: 2.12, 2.10, 2.50 at 1e-3, 3e-3, 1e-2: 1e-3 and 3e-3 within
    # 2.121, the low end the grid's edge, the high end 0.021 / 0.4 of the way from 3e-3 to 1e-2.
    high = 3e-3 * (1e-2 / 3e-3) ** (0.021 / 0.40)
    assert (f"| adamw (beta2 by half-life) | 1 | 3 | 0.003 (2.100) | 0.001, 0.003 | ≥ 3 | ≥ {high / 1e-3:.3g} |"
            in lrs)
    # AdamW (fixed) at batch 32: 2.60 at 3e-3, 2.65 at 1e-2 (above 2.626): the best alone, its width 1,
    # the low end the edge, the high end 0.026 / 0.05 of the way to 1e-2.
    assert f"| adamw | 32 | 2 | 0.003 (2.600) | 0.003 | ≥ 1 | ≥ {(1e-2 / 3e-3) ** (0.026 / 0.05):.3g} |" in lrs
    # The wall time: each run logged 1,000 x its micro-batch tokens a second: 1e6 / (1,000 x micro)
    # seconds per million tokens, batch x 8 tokens / (1,000 x micro) seconds per step.
    wall = first_table(text, "## Small batches: wall time per token")
    assert "| adamw (beta2 by half-life) | 1 | 1 x 1 | 40 | 1000.0 | 8.00 | 4 |" in wall
    assert "| adamw | 8 | 4 x 2 | 40 | 250.0 | 16.00 | 3 |" in wall
    assert "| adamw | 32 | 16 x 2 | 40 | 62.5 | 16.00 | 3 |" in wall
    assert "## Small batches" not in report(find_runs([small_batches]), None, "val/loss", "heldout/loss",
                                            small_batch=False)


def test_a_weight_decay_set_by_the_batch_goes_with_the_batch_not_into_the_labels(small_batches):
    """The small-batch authors' AdamW decays its weights at their large batch only (0.1 there, 0
    below): a weight decay that takes one value at each batch of a point is said once, batch by batch,
    as the decays a batch sets are, and the point keeps its label ("adamw", not "adamw,
    weight_decay=0.1"), so that it is still the reference of AdamW with beta2 by half-life."""
    for folder in small_batches.iterdir():
        config = json.loads((folder / "config.json").read_text())
        config["weight_decay"] = 0.1 if (config["optimizer"], config["batch_size"]) == ("adamw", 32) else 0.0
        (folder / "config.json").write_text(json.dumps(config))
    text = report(find_runs([small_batches]), None, "val/loss", "heldout/loss")
    assert "adamw's weight_decay goes with the batch (batch 8: 0.0, batch 32: 0.1)." in text
    assert "weight_decay=" not in text
    largest = first_table(text, "## Small batches: each point against its optimizer's largest batch")
    assert (f"| adamw (beta2 by half-life) | 1 | {_mean_cell(_heldout('half', 1, 3e-3))} | adamw, batch 32 | "
            f"{_paired(_heldout('half', 1, 3e-3), _heldout('fixed', 32, 3e-3))} |") in largest


def _mean_cell(values: list[float]) -> str:
    n, mean, std = len(values), statistics.fmean(values), statistics.stdev(values)
    return f"{mean:.3f} ± {std:.3f} [±{T_975[n - 1] * std / math.sqrt(n):.3f}]"


def test_an_lr_range_stops_at_a_diverged_neighbour(tmp_path):
    """The lr next to the best diverged (seed 0 did not finish): the range ends at the best, and its
    interpolated end there too (nothing to interpolate to); the best lr's other neighbour is within
    the margin."""
    for lr, final, diverged in ((1e-3, 2.01, None), (3e-3, 2.00, None), (1e-2, 1.5, 20)):
        write_run(tmp_path / f"lr{lr:g}", "adamw", 4, lr, 0, final, diverged_at=diverged)
    text = report(find_runs([tmp_path]), None, small_batch=True)  # (batch 4 alone: asked for)
    table = first_table(text, "## Small batches: the range of good lrs")
    assert "| adamw | 4 | 3 | 0.003 (2.000) | 0.001, 0.003 | ≥ 3 | ≥ 3 |" in table


def test_the_small_batch_figure_draws_each_optimizer_s_points_with_their_seeds(small_batches, tmp_path):
    """A panel per optimizer (AdamW first), a line per point: its means at the selected lrs, error bars
    from the lowest to the highest seed; AdamW's points grey in SGD's panel."""
    runs = find_runs([small_batches])
    fig = plot.plot_small_batch(Study(runs), "heldout/loss")
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["adamw", "sgd"]
    bars = {container.get_label(): container for ax in axes for container in ax.containers}
    assert sorted(bars) == ["adamw", "adamw (beta2 by half-life)", "sgd"]
    x, y = bars["sgd"].lines[0].get_data()
    sgd = [_heldout("sgd", 1, 0.3), _heldout("sgd", 8, 1.0)]
    assert list(x) == [1, 8] and list(y) == pytest.approx([statistics.fmean(v) for v in sgd])
    segments = bars["sgd"].lines[2][0].get_segments()  # (the error bars: lowest to highest seed)
    ends = [y for v in sgd for y in (min(v), max(v))]
    assert [y for s in segments for y in (s[0][1], s[1][1])] == pytest.approx(ends)
    grey = [line for line in axes[1].get_lines() if line.get_color() == "grey"]
    assert len(grey) == 2  # AdamW's two points, in SGD's panel
    plt.close(fig)


@pytest.mark.slow  # matplotlib, every figure twice
def test_the_small_batch_figure_is_drawn_where_the_runs_reach_one_sequence(small_batches, tmp_path):
    runs = find_runs([small_batches])
    [figure] = [p for p in plot.draw_all(runs, tmp_path / "a", "val/loss", "heldout/loss")
                if p.name == "small_batch.png"]
    assert "small_batch.png" not in {p.name for p in plot.draw_all([r for r in runs if r.batch_size > 1],
                                                                   tmp_path / "b", "val/loss", "heldout/loss")}
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # (seconds: the tool runs several times)
def test_the_report_of_a_path_that_does_not_exist_says_so(tmp_path):
    missing = tmp_path / "NONEXISTENT"
    result = cli("report", missing)  # (the script as a process: tests import packages, never a script)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"report: {missing} does not exist: give run folders (each with config.json and "
                                     f"metrics.jsonl), folders of them, or .tar.xz archives of them")
