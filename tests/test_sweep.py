"""scripts/sweep.py: the plan of a grid, a real local sweep under torchrun on 2 ranks (finished
points skipped, an interrupted one resumed; one-process points run without torchrun: the
mini-study's, tests/test_mini_study.py), and the SLURM array script. (The report and figures of
real runs: tests/test_mini_study.py.)"""
import json
import math
import os
import subprocess
import sys

import pytest

from configs import ConfigError, load_config
from eval.samples import write_fixtures
from helpers import ROOT, TINY, train_here
from study.report import report
from study.runs import Run, Study
from study.sweep import grid_and_fixed, key_values, plan

BASE = dict(TINY, log_interval=2, batch_size=4, micro_batch_size=2, max_steps=4, warmup_steps=2, lr=0.01,
            min_lr=0.001, checkpoint_interval=2)


def base_config(tmp_path, data_dir, **changes):
    path = tmp_path / "base.py"
    path.write_text("\n".join(f"{k} = {v!r}" for k, v in {**BASE, "data_dir": str(data_dir), **changes}.items()))
    return path


def sweep(*args, check=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "-m", "scripts.sweep", *map(str, args)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 or not check, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def rows(output: str) -> dict[str, dict]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("point "))
    header = lines[start].split()
    table = {}
    for line in lines[start + 1:]:
        cells = line.split(maxsplit=len(header) - 1)  # the last column (status) may hold spaces
        if len(cells) == len(header):
            table[cells[0]] = dict(zip(header, cells))
    return table


def test_dry_run_prints_the_plan_of_a_2x2x2_grid_and_writes_nothing(tmp_path, byte_shards):
    base = base_config(tmp_path, byte_shards, max_steps=40, warmup_steps=8)
    result = sweep(base, "--name=plan", f"--out-dir={tmp_path}", "--grid=optimizer=adamw,merit",
                   "--grid=batch_size=4,16", "--grid=lr=1e-3,3e-3", "--lr-scaling=sqrt", "--warmup-scaling=tokens",
                   "--dry-run")
    plan = rows(result.stdout)
    assert len(plan) == 8 and "8 points" in result.stdout
    for optimizer in ("adamw", "merit"):
        for lr in (1e-3, 3e-3):
            small, large = plan[f"{optimizer}_b4_lr{lr:g}"], plan[f"{optimizer}_b16_lr{lr:g}"]
            # sqrt scaling from the base batch 4: x2 at batch 16; min_lr keeps the base ratio 1/10.
            assert (float(small["lr"]), float(large["lr"])) == pytest.approx((lr, 2 * lr), rel=1e-2)
            assert float(large["min_lr"]) == pytest.approx(float(large["lr"]) / 10, rel=1e-2)
            # warmup held in tokens: 8 steps of 4 sequences are 2 steps of 16.
            assert (small["warmup"], large["warmup"], small["status"]) == ("8", "2", "new")
    assert not (tmp_path / "plan").exists()


@pytest.mark.slow  # the sweep launches its points under torchrun
def test_a_local_sweep_skips_finished_points_and_resumes_an_interrupted_one(tmp_path, byte_shards):
    base = base_config(tmp_path, byte_shards)
    common = [base, "--name=local", f"--out-dir={tmp_path}", "--grid=optimizer=adamw,merit"]
    sweep(*common)  # writes the point configs
    folder = tmp_path / "local"
    assert sorted(p.name for p in folder.iterdir()) == ["adamw", "merit"]
    # merit is interrupted after its checkpoint at step 2 (as a killed or preempted job leaves it).
    train_here(str(folder / "merit" / "point.py"), "--stop_at_step=2")
    assert rows(sweep(*common, "--dry-run").stdout)["merit"]["status"] == "at step 2"

    first = sweep(*common, "--launch=local", "--nproc-per-node=2")
    assert "adamw: new" in first.stdout and "merit: at step 2" in first.stdout
    assert "torch.distributed.run --standalone --nproc_per_node=2 train.py" in first.stdout
    assert "resumed" in first.stdout and "all 2 points finished" in first.stdout
    for name in ("adamw", "merit"):
        records = [json.loads(line) for line in (folder / name / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "train/loss" in r] == [2, 4]  # one run, no step twice
        assert json.loads((folder / name / "config.json").read_text())["optimizer"] == name
    again = sweep(*common, "--launch=local", "--nproc-per-node=2")
    assert "adamw: finished, skipped" in again.stdout and "merit: finished, skipped" in again.stdout
    assert "resumed" not in again.stdout


def test_the_slurm_script_is_valid_bash_with_the_multi_node_torchrun_flags(tmp_path, byte_shards):
    base = base_config(tmp_path, byte_shards, batch_size=16)  # micro-batches of 2 on 2 x 4 ranks
    result = sweep(base, "--name=cluster", f"--out-dir={tmp_path}", "--grid=seed=0,1", "--grid=lr=1e-3,3e-3",
                   "--launch=slurm", "--nodes=2", "--gpus-per-node=4", "--time=02:00:00", "--partition=gpu")
    script = tmp_path / "cluster" / "sweep.sbatch"
    assert f"sbatch {script}" in result.stdout
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    directives = {line.split("=")[0]: line.split("=", 1)[1] for line in text.splitlines()
                  if line.startswith("#SBATCH --") and "=" in line}
    assert directives["#SBATCH --array"] == "0-3%4" and directives["#SBATCH --nodes"] == "2"
    assert directives["#SBATCH --gpus-per-node"] == "4" and directives["#SBATCH --partition"] == "gpu"
    assert directives["#SBATCH --signal"].startswith("B:USR1@") and "#SBATCH --requeue" in text
    for flag in ('--nnodes="$SLURM_NNODES"', "--nproc_per_node=4", "--rdzv_backend=c10d",
                 '--rdzv_endpoint="$HEAD:$PORT"', "--resume=auto", "scontrol requeue", "trap requeue USR1"):
        assert flag in text, flag
    # The array's point files, read by bash itself.
    listed = subprocess.run(["bash", "-c", f"eval \"$(sed -n '/^POINTS=(/,/^)/p' {script})\"; "
                             "printf '%s\\n' \"${POINTS[@]}\""], capture_output=True, text=True).stdout.split()
    assert len(listed) == 4 and all(os.path.isfile(p) for p in listed)
    assert sorted(os.path.basename(os.path.dirname(p)) for p in listed) == [
        f"s{s}_lr{lr:g}" for s in (0, 1) for lr in (1e-3, 3e-3)]
    point = load_config(sorted(listed)[0])
    assert (point.seed, point.lr, point.run_name, point.resume) == (0, 1e-3, "s0_lr0.001", "auto")


def test_the_plan_refuses_a_point_whose_zero_shot_tasks_cannot_run(tmp_path, byte_shards):
    """A misspelled task, or a missing local task file, is found at planning, not when the point
    has trained."""
    write_fixtures(tmp_path / "tasks")
    base = base_config(tmp_path, byte_shards, zero_shot_data_dir=str(tmp_path / "tasks"))
    with pytest.raises(ConfigError, match=r"zero_shot_tasks='hellaswg'.*did you mean 'hellaswag'"):
        plan(str(base), {"zero_shot_tasks": ["copa", "hellaswg"]}, [], tmp_path / "sweep", "none", "steps", None)
    (tmp_path / "tasks" / "copa.jsonl").unlink()
    with pytest.raises(ConfigError, match=r"zero_shot_data_dir=.*copa"):
        plan(str(base), {"zero_shot_tasks": ["copa"]}, [], tmp_path / "sweep", "none", "steps", None)


@pytest.mark.slow  # the CLI in processes, a local launch
def test_a_sweep_folder_holds_one_sweep_and_a_point_is_what_its_file_says(tmp_path, byte_shards):
    base = base_config(tmp_path, byte_shards)
    first = ["--name=one", f"--out-dir={tmp_path}", "--grid=lr=0.003,0.01"]
    sweep(base, *first)  # the point files only
    files = {path: path.read_bytes() for path in (tmp_path / "one").glob("*/point.py")}
    assert len(files) == 2
    other = sweep(base, *first, "--set", "max_steps=6", check=False)
    assert other.returncode == 1 and "point lr0.003's file" in other.stderr and \
        "differs from this plan (max_steps: written 4, now 6)" in other.stderr, other.stderr
    more = sweep(base, "--name=one", f"--out-dir={tmp_path}", "--grid=lr=0.003,0.01,0.03", check=False)
    assert more.returncode == 1 and "holds the points lr0.003, lr0.01; this plan adds lr0.03: pass --add-points" \
        in more.stderr, more.stderr
    assert {path: path.read_bytes() for path in files} == files  # nothing rewritten
    sweep(base, "--name=one", f"--out-dir={tmp_path}", "--grid=lr=0.003,0.01,0.03", "--add-points")
    assert (tmp_path / "one" / "lr0.03" / "point.py").is_file()
    assert {path: path.read_bytes() for path in files} == files

    # A point is finished only if its run trained what its file says: a longer run in its folder is not it.
    point = tmp_path / "one" / "lr0.01"
    train_here(str(point / "point.py"), "--max_steps=6", f"--out_dir={tmp_path / 'one'}")
    status = rows(sweep(base, *first, "--dry-run").stdout)["lr0.01"]["status"]
    assert status == "another run: max_steps 6, not 4"
    launched = sweep(base, "--name=one", f"--out-dir={tmp_path}", "--grid=lr=0.01", "--launch=local", check=False)
    assert launched.returncode == 1 and "lr0.01: FAILED: its folder holds another run: max_steps 6, not 4" \
        in launched.stdout + launched.stderr


def test_half_life_beta_scaling_keeps_each_decay_s_half_life_in_tokens(tmp_path, byte_shards):
    """beta_new = beta ** (T_new / T_old) (Marek et al. 2025) from the resolved value at the base
    batch: a half-life of t tokens, t = T ln(0.5) / ln(beta), the same at every batch."""
    base = base_config(tmp_path, byte_shards, max_steps=40)
    grid = {"optimizer": ["adamw", "muon"], "batch_size": [4, 16, 64]}
    plain = {(p.config.optimizer, p.config.batch_size): p.config for p in plan(
        str(base), grid, [], tmp_path, "none", "none", base_batch=16)}
    scaled = {(p.config.optimizer, p.config.batch_size): p.config for p in plan(
        str(base), grid, [], tmp_path, "none", "none", base_batch=16, betas=("beta2", "momentum"))}
    tokens = 32  # block_size: tokens a step are batch x 32

    def half_life(beta, batch):
        return batch * tokens * math.log(0.5) / math.log(beta)

    for optimizer in ("adamw", "muon"):
        at_base = plain[optimizer, 16]
        assert scaled[optimizer, 16].beta2 == at_base.beta2  # the base batch keeps the published value
        for batch in (4, 64):
            config = scaled[optimizer, batch]
            assert half_life(config.beta2, batch) == pytest.approx(half_life(at_base.beta2, 16), rel=1e-12)
            assert config.beta1 == at_base.beta1  # not asked for
        assert scaled[optimizer, 4].beta2 > at_base.beta2 > scaled[optimizer, 64].beta2  # a smaller batch: nearer 1
    muon = scaled["muon", 64].optimizer_options["momentum"]  # Muon's momentum 0.95 published, x4 the tokens
    assert muon == pytest.approx(0.95 ** 4, rel=1e-12)
    assert scaled["adamw", 64].beta2 == pytest.approx(0.95 ** 4, rel=1e-12)  # AdamW's published beta2 0.95
    with pytest.raises(ConfigError, match=r"the decays beta3 belong to none of the grid's optimizers: give decays "
                                          r"they declare \(beta1, beta2, momentum\)"):
        plan(str(base), grid, [], tmp_path, "none", "none", base_batch=16, betas=("beta2", "beta3"))
    result = sweep(base, "--name=betas", f"--out-dir={tmp_path}", "--grid=batch_size=4,16", "--base-batch=16",
                   "--beta-scaling=half-life", "--dry-run")
    assert rows(result.stdout)["b4"]["beta2"] == f"{0.95 ** 0.25:.6g}"

    # The report: each optimizer's beta2 goes with the batch (named once), not into the points' labels.
    runs = [Run(tmp_path / f"{name[0]}_{name[1]}", config.to_dict(), [{"step": 40, "val/loss": 2.0}])
            for name, config in scaled.items()]
    assert {Study(runs).label(run) for run in runs} == {"adamw", "muon"}
    text = report(runs, target=None)
    assert (f"adamw's beta2 goes with the batch (batch 4: {0.95 ** 0.25}, batch 16: 0.95, batch 64: {0.95 ** 4})"
            in text), text
    assert "muon's momentum goes with the batch (batch 4: " in text


def test_a_key_given_twice_is_refused_before_anything_is_written(tmp_path, byte_shards):
    """Of two --grid lr=... the later used to replace the earlier: one axis, half the points."""
    base = base_config(tmp_path, byte_shards)
    result = sweep(base, "--name=twice", f"--out-dir={tmp_path}", "--grid", "lr=1e-3", "--grid", "lr=2e-3",
                   check=False)
    assert result.returncode == 1 and result.stderr == (
        "sweep: --grid lr=2e-3 repeats the key lr of --grid lr=1e-3 (one axis per key): give its values in one, "
        "--grid lr=1e-3,2e-3\n"), result.stderr
    assert not (tmp_path / "twice").exists()
    with pytest.raises(ConfigError, match=r"^--set lr=0.02 repeats the key lr of --set lr=0.03: give each key once$"):
        key_values(["lr=0.03", "seed=1", "lr=0.02"], "--set")
    with pytest.raises(ConfigError, match=r"^--grid lr=0.1,0.2 and --set lr=0.3 name the same key: the grid's values "
                                          r"replace the --set one at every point; drop one of them$"):
        grid_and_fixed(["lr=0.1,0.2"], ["lr=0.3"])
    assert grid_and_fixed(["lr=1e-3,abc", "optimizer=adamw"], ["seed=2"]) == (
        {"lr": [1e-3, "abc"], "optimizer": ["adamw"]}, ["--seed=2"])


def test_grid_values_go_through_the_schema_when_the_plan_is_made(tmp_path, byte_shards):
    """A value of the wrong type (the lr axis used to multiply it: TypeError), and a batch that does
    not divide into micro-batches over the launch's ranks, are refused at planning, naming the point."""
    base = str(base_config(tmp_path, byte_shards, micro_batch_size=4))  # batch 4, lr 0.01, min_lr 0.001
    with pytest.raises(ConfigError, match=r"^--grid point lr='abc': config key 'lr' in the command line must be float, "
                                          r"got str 'abc'$"):
        plan(base, {"lr": [1e-3, "abc"]}, [], tmp_path / "sweep", "none", "none", None)
    with pytest.raises(ConfigError, match=r"^--grid point batch_size=10: batch_size=10 is not divisible by "
                                          r"micro_batch_size=4 x world_size=1 = 4"):
        plan(base, {"batch_size": [8, 10]}, [], tmp_path / "sweep", "none", "none", None)
    with pytest.raises(ConfigError, match=r"^--grid point batch_size=4: batch_size=4 is not divisible by "
                                          r"micro_batch_size=4 x world_size=2 = 8"):
        plan(base, {"batch_size": [8, 4]}, [], tmp_path / "sweep", "none", "none", None, world_size=2)
    with pytest.raises(ConfigError, match=rf"^the base config {base}: batch_size=6 is not divisible"):
        plan(base, {}, ["--batch_size=6"], tmp_path / "sweep", "none", "none", None)  # no --grid: one point
    # An lr below the base's min_lr (0.001) plans: min_lr follows it at the base's ratio, 1/10.
    [point] = plan(base, {"lr": [5e-4]}, [], tmp_path / "sweep", "none", "none", None)
    assert (point.config.lr, point.config.min_lr) == (5e-4, pytest.approx(5e-5, rel=1e-12))
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("flag, hint", [
    ("overwrite=True", "--resume=False --overwrite=True"),
    ("stop_at_step=5", "--stop_at_step=5"),
])
@pytest.mark.slow  # (seconds: the tool runs several times)
def test_an_invocation_flag_in_set_or_grid_is_refused_naming_how_to_pass_it(tmp_path, byte_shards, flag, hint):
    # An invocation flag is what one run of train.py does with its folder, not a point's setting: written
    # into every point it was dropped (overwrite) or stopped the sweep's runs for good (stop_at_step).
    key = flag.split("=")[0]
    with pytest.raises(ConfigError, match=f"--set {flag}: {key} is an invocation flag"):
        grid_and_fixed([], [flag])
    with pytest.raises(ConfigError, match=f"--grid {flag}: {key} is an invocation flag"):
        grid_and_fixed([flag], [])
    base = base_config(tmp_path, byte_shards)
    result = sweep(base, "--name=flags", f"--out-dir={tmp_path}", "--set", flag, "--launch=local", check=False)
    assert result.returncode == 1 and f"{key} is an invocation flag" in result.stderr, result.stderr
    assert hint in result.stderr and str(tmp_path / "flags") in result.stderr, result.stderr
    assert not (tmp_path / "flags").exists()  # refused before anything is written
    # The same rule where the base config file sets the flag itself.
    key_value = dict([flag.split("=")])
    with pytest.raises(ConfigError, match=f"the base config {base} sets {flag}: {key} is an invocation flag"):
        plan(str(base_config(tmp_path, byte_shards, **{key: eval(key_value[key])})), {}, [], tmp_path / "flags",
             "none", "none", None)
    assert "--set KEY=VALUE" in sweep("--help").stdout and "invocation flag" in sweep("--help").stdout


@pytest.mark.slow  # (seconds: the tool runs several times)
def test_a_hand_edited_point_is_named_with_both_ways_out_and_dry_run_marks_it(tmp_path, byte_shards):
    base = base_config(tmp_path, byte_shards)
    command = [base, "--name=edit", f"--out-dir={tmp_path}", "--grid=lr=0.003,0.01"]
    sweep(*command)
    point = tmp_path / "edit" / "lr0.01" / "point.py"
    point.write_text(point.read_text().replace("max_steps = 4", "max_steps = 6"))
    refused = sweep(*command, "--launch=local", check=False)
    assert refused.returncode == 1, refused.stdout
    message = refused.stderr
    assert f"point lr0.01's file {point} differs from this plan (max_steps: written 6, now 4)" in message, message
    assert f"delete {point} and rerun this command with --add-points" in message, message  # restore it
    assert "as a point of its own" in message and "run_name" in message, message  # or take the edit as a new one
    dry = sweep(*command, "--dry-run")
    assert rows(dry.stdout)["lr0.01"]["status"] == "edited: max_steps: written 6, now 4", dry.stdout
    assert rows(dry.stdout)["lr0.003"]["status"] == "new"
    # The first way out: the file deleted, the sweep writes it again from the plan and goes on.
    point.unlink()
    sweep(*command, "--add-points")
    assert "max_steps = 4" in point.read_text()
