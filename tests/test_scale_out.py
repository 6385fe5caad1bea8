"""train.py on the scale-out strategies (training/parallel.py), with real gloo processes: ZeRO-1
and FSDP2 train exactly as DDP on the same global batches (parameters, losses, every instrument,
QK-Clip's caps),
their checkpoints resume elsewhere (FSDP2's DCP folder on one process, ZeRO-1's consolidated file
with zero_stage=0), each rank's memory is in the metrics, and the combinations that cannot work
are refused with their fix. (The optimizers themselves under ZeRO-1 and FSDP2, and DCP checkpoints
across 4, 2 and 1 ranks: tests/test_sharded.py.)"""
import json
import re
import subprocess
import sys

import pytest
import torch

from eval.samples import write_fixtures
from helpers import ROOT, TINY_RUN, read_metrics, run_train, train_here
from model import GPT, GPTConfig
from training.checkpoint import CHECKPOINT_NAME, load_model

# Accumulation 2 on 2 ranks (global batch 8, micro-batch 2), a checkpoint every 2 steps.
RUN = [*TINY_RUN, "--log_interval=2", "--lr=0.01", "--min_lr=0.001", "--warmup_steps=2", "--max_steps=4",
       "--batch_size=8", "--micro_batch_size=2", "--checkpoint_interval=2", "--sample_tokens=8",
       "--qk_clip_tau=0.05"]  # (QK-Clip clips some heads)
STRATEGIES = {"ddp": [], "zero1": ["--zero_stage=1"], "fsdp": ["--fsdp"]}

pytestmark = pytest.mark.slow  # torchrun with 2 gloo ranks, in the fixture and the tests


def assert_same_parameters(got: dict, expected: dict, label: str, rel: float = 1e-6) -> None:
    """Within ``rel`` (the norm of the difference against the tensor's): what may differ is the
    summation order of gradient norms over shards (torch's clip_grad_norm_ of DTensors)."""
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert (got[key] - value).norm() <= rel * value.norm(), f"{label}: {key}"


def metrics(run_dir) -> dict:
    """Every logged value by (step, key)."""
    return {(r["step"], k): v for r in read_metrics(run_dir) if "step" in r for k, v in r.items()
            if k not in ("step", "tokens")}


@pytest.fixture(scope="module")
def runs(byte_shards, tmp_path_factory):
    """The same MERIT run under DDP, ZeRO-1 and FSDP2 on 2 ranks: {strategy: (run folder, stdout)}."""
    out = tmp_path_factory.mktemp("scale_out")
    write_fixtures(out / "tasks")  # zero-shot evaluation at the end: each rank scores its share
    return {name: (out / name, run_train(*RUN, f"--data_dir={byte_shards}", f"--out_dir={out}",
                                         f"--run_name={name}", "--zero_shot_tasks=boolq,cb",
                                         f"--zero_shot_data_dir={out / 'tasks'}", *extra, nproc=2).stdout)
            for name, extra in STRATEGIES.items()}


def test_zero1_and_fsdp_train_exactly_as_ddp(runs):
    ddp = load_model(runs["ddp"][0] / CHECKPOINT_NAME)[0].state_dict()
    expected = metrics(runs["ddp"][0])
    for name in ("zero1", "fsdp"):
        run_dir, stdout = runs[name]
        assert f"on cpu ({name})" in stdout and "sample:" in stdout
        model, checkpoint = load_model(run_dir / CHECKPOINT_NAME)
        assert checkpoint.tensors == ("dcp" if name == "fsdp" else "inline") and checkpoint.step == 4
        assert_same_parameters(model.state_dict(), ddp, name)
        got = metrics(run_dir)
        # The losses, the probe, the optimizer's diagnostics, the update statistics and the zero-shot
        # metrics, at every log step.
        # FSDP2 has no gradient noise scale (no rank holds a micro-batch gradient); memory differs.
        compared = {k for k in expected if not k[1].startswith(("memory/", "tokens_per_s"))
                    and not (name == "fsdp" and k[1].startswith("noise_scale/"))}
        assert any(k[1].startswith("trust_ratio_max/") for k in compared)
        assert any(k[1].startswith("update_ratio/") for k in compared)
        assert any(k[1].startswith("zero_shot/boolq/") for k in compared)
        assert any(k[1].startswith("qk_clip/heads_clipped/") and expected[k] > 0 for k in compared)
        assert compared <= got.keys(), sorted(compared - got.keys())[:5]
        for key in compared:
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), (name, key)


def test_each_rank_s_memory_is_reported(runs):
    memory = {name: {k[1]: v for k, v in metrics(run_dir).items() if k[0] == 4 and k[1].startswith("memory/")}
              for name, (run_dir, _) in runs.items()}
    for name, stdout in ((name, stdout) for name, (_, stdout) in runs.items()):
        assert f"memory per rank ({name}, the largest of 2, MiB): params" in stdout
    ddp, zero1, fsdp = memory["ddp"], memory["zero1"], memory["fsdp"]
    assert set(ddp) == {"memory/params", "memory/grads", "memory/optimizer_state", "memory/activations_estimate",
                        "memory/peak"}
    # MERIT keeps m and v: twice the parameters, replicated under DDP; rank 0's share under ZeRO-1
    # (whole parameters), its rows under FSDP2 (parameters and gradients too).
    assert ddp["memory/optimizer_state"] == pytest.approx(2 * ddp["memory/params"], rel=1e-3)
    assert zero1["memory/params"] == ddp["memory/params"]
    assert 0.3 < zero1["memory/optimizer_state"] / ddp["memory/optimizer_state"] < 0.7
    assert 0.45 < fsdp["memory/params"] / ddp["memory/params"] < 0.55
    assert fsdp["memory/optimizer_state"] == pytest.approx(2 * fsdp["memory/params"], rel=1e-3)
    assert all(m["memory/peak"] > 0 for m in memory.values())


def test_a_sharded_run_resumes_on_one_process_and_zero1_without_zero(runs, byte_shards, tmp_path):
    """The step-2 checkpoints of the FSDP2 and ZeRO-1 runs, continued on one plain process."""
    expected = load_model(runs["ddp"][0] / CHECKPOINT_NAME)[0].state_dict()
    for name, suffix in (("fsdp", "dcp"), ("zero1", "pt")):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / f"ckpt_00000002.{suffix}").symlink_to(runs[name][0] / f"ckpt_00000002.{suffix}")
        (run_dir / CHECKPOINT_NAME).symlink_to(f"ckpt_00000002.{suffix}")
        resumed = train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", f"--run_name={name}",
                             "--resume", "--keep_checkpoints=5")
        assert "resuming on 1 ranks from a checkpoint of 2" in resumed.stdout
        assert_same_parameters(load_model(run_dir / CHECKPOINT_NAME)[0].state_dict(), expected, name)


@pytest.mark.parametrize("saved, resumed_with, message", [
    ("fsdp", "--zero_stage=1", r"is sharded \(written with fsdp=True\): resume it with fsdp=True, or with zero_stage=0"),
    ("ddp", "--fsdp", r"is a whole-model file \(written without fsdp\): resume it without fsdp"),
])
def test_a_checkpoint_of_another_layout_is_refused_with_the_fix(runs, byte_shards, tmp_path, saved, resumed_with,
                                                                 message):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    checkpoint = (runs[saved][0] / CHECKPOINT_NAME).resolve()
    (run_dir / checkpoint.name).symlink_to(checkpoint)
    (run_dir / CHECKPOINT_NAME).symlink_to(checkpoint.name)
    result = run_train(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run", "--resume",
                       resumed_with, nproc=2, check=False)
    assert result.returncode != 0
    assert re.search(message, result.stderr), result.stderr[-3000:]


def test_sophia_g_s_hessian_pass_runs_through_each_layout(byte_shards, tmp_path):
    """Sophia-G's extra pass (Trainer.gradients: its own forward/backward over the next global
    batch, clipped, squared into the sharded or partitioned Hessian EMA) gives DDP's parameters,
    under a batch schedule too (8 sequences for 2 steps, then 16: the Hessian scale and the pass's
    batch follow it, through ZeRO-1's delegation to each rank's optimizer)."""
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--optimizer=sophiag", "--sample_tokens=0",
              "--optimizer_options={'hessian_interval': 2}", "--batch_schedule=[(0, 8), (512, 16)]"]
    params = {}
    for name, extra in STRATEGIES.items():
        run_train(*common, f"--run_name={name}", *extra, nproc=2)
        params[name] = load_model(tmp_path / name / CHECKPOINT_NAME)[0].state_dict()
        logged = metrics(tmp_path / name)
        hessian_norms = [v for (_, key), v in logged.items() if key.startswith("hessian_norm/")]
        assert hessian_norms and max(hessian_norms) > 0, name  # the Hessian EMA was refreshed
        assert (logged[(2, "batch/size")], logged[(4, "batch/size")]) == (8, 16), name
    assert_same_parameters(params["zero1"], params["ddp"], "zero1")
    # The pass clips its gradient to norm 1: under FSDP2 that norm is summed over shards, an ulp
    # apart, and Sophia-G's step divides by the Hessian EMA it scales (1.6e-6 after 4 steps here).
    assert_same_parameters(params["fsdp"], params["ddp"], "fsdp", rel=1e-5)


def test_muon_with_its_resolved_settings_runs_through_each_layout(byte_shards, tmp_path):
    """Muon as train.py resolves it (adamw_lr and adamw_weight_decay left None: "follow lr and
    weight_decay"), which ZeRO-1 refused before: its whole groups held the None over the value the
    rank's optimizer resolved. Every layout gives DDP's parameters (Newton-Schulz in float32: in
    bfloat16, with this run's strong QK-Clip, FSDP2 ended 1.5e-4 apart in wte)."""
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--optimizer=muon", "--sample_tokens=0",
              "--zero_shot_tasks=", "--checkpoint_interval=0", "--optimizer_options={'ns_dtype': 'float32'}"]
    params = {}
    for name, extra in STRATEGIES.items():
        run_train(*common, f"--run_name={name}", *extra, nproc=2)
        params[name] = load_model(tmp_path / name / CHECKPOINT_NAME)[0].state_dict()
    assert_same_parameters(params["zero1"], params["ddp"], "zero1")
    assert_same_parameters(params["fsdp"], params["ddp"], "fsdp", rel=1e-5)


def test_schedule_free_adamw_under_zero1_takes_each_step_s_lr_as_ddp_does(byte_shards, tmp_path):
    """Schedule-Free AdamW moves the weights between y and x (an evaluation, then the next step):
    under ZeRO-1 each rank moves its own parameters and the groups are synced back. The lr the loop
    set for the step (here: a warmup, a new lr every step) reached the rank's optimizer only at the
    step, so syncing the groups back after the move restored the previous step's lr (step 2's train
    loss was 5.46 under ZeRO-1, 5.57 under DDP). Now ZeRO-1 gives DDP's weights and losses."""
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--optimizer=adamw_schedulefree",
              "--lr_schedule=constant", "--warmup_steps=3", "--log_interval=1", "--eval_interval=1",
              "--sample_tokens=0", "--zero_shot_tasks=", "--qk_clip_tau=None"]
    params, losses = {}, {}
    for name in ("ddp", "zero1"):
        run_train(*common, f"--run_name={name}", *STRATEGIES[name], nproc=2)
        params[name] = load_model(tmp_path / name / CHECKPOINT_NAME)[0].state_dict()
        losses[name] = [r["train/loss"] for r in read_metrics(tmp_path / name) if "train/loss" in r]
    # (the stale lr moved step 2's loss by 2%: held here to float32's rounding, as the other layouts are)
    assert len(losses["ddp"]) == 4 and losses["zero1"] == pytest.approx(losses["ddp"], rel=1e-6)
    assert_same_parameters(params["zero1"], params["ddp"], "zero1")


def test_a_damaged_sharded_checkpoint_is_a_clear_error_and_its_metadata_builds_nothing(runs, tmp_path):
    import os
    import pickle
    import shutil
    source = (runs["fsdp"][0] / CHECKPOINT_NAME).resolve()
    truncated = shutil.copytree(source, tmp_path / "truncated.dcp")
    shard = next(truncated.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"its DCP files cannot be loaded .*corrupt or of another model"):
        load_model(truncated)

    class Payload:  # what a planted metadata file would make the unpickler run
        def __reduce__(self):
            return os.system, ("touch " + str(tmp_path / "pwned"),)
    planted = shutil.copytree(source, tmp_path / "planted.dcp")
    (planted / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ValueError, match=r"names posix.system, which is not DCP metadata: refusing to load it"):
        load_model(planted)
    assert not (tmp_path / "pwned").exists()


def test_ddp_logs_the_bytes_of_every_gradient_reduction(runs):
    """One all-reduce of the whole gradient a step (on the last of its 2 accumulation micro-steps), in
    float32; ZeRO-1 reduces the same gradients, and FSDP2's reduce-scatter is handed them too."""
    model = load_model(runs["ddp"][0] / CHECKPOINT_NAME)[0]
    gradient = 4 * sum(p.numel() for p in model.parameters())
    for name in STRATEGIES:
        logged = metrics(runs[name][0])
        assert logged[(4, "comm/gradient_bytes")] == 4 * gradient
        assert logged[(4, "comm/gradient_bytes_per_token")] == 4 * gradient / (4 * 8 * 32)


def test_a_communication_hook_sends_what_it_says_and_trains_as_ddp_does_within_it(byte_shards, tmp_path):
    """bf16: half of DDP's bytes (the whole float32 gradient a step: the test above), the weights
    within bfloat16's rounding of the exact mean's (one process, the same 8 rows a step as 2 micro-
    batches). PowerSGD at rank 1: the first two steps exact, then each matrix that compresses by more
    than 2x sent as its two rank-1 factors, (rows + columns) numbers, the rest whole; the loss falls."""
    run = [*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--optimizer=sgd", "--lr=0.5",
           "--max_steps=4", "--log_interval=1", "--batch_size=8", "--micro_batch_size=4", "--grad_clip=0"]
    for hook in ("bf16", "powersgd"):
        run_train(*run, f"--run_name=hook_{hook}", f"--comm_hook={hook!r}", nproc=2)
    train_here(*run, "--run_name=exact")
    model = load_model(tmp_path / "exact" / CHECKPOINT_NAME)[0]
    numbers = sum(p.numel() for p in model.parameters())
    compressed = 0
    for p in model.parameters():
        rows, columns = (p.shape[0], p.numel() // p.shape[0]) if p.ndim > 1 else (0, 0)
        compressed += rows + columns if p.ndim > 1 and 2 * (rows + columns) < rows * columns else p.numel()
    sent = {hook: [metrics(tmp_path / f"hook_{hook}")[(step, "comm/gradient_bytes")] for step in range(1, 5)]
            for hook in ("bf16", "powersgd")}
    assert sent["bf16"] == [2 * numbers * step for step in range(1, 5)]
    assert sent["powersgd"] == [4 * numbers, 8 * numbers, 8 * numbers + 4 * compressed, 8 * numbers + 8 * compressed]
    assert compressed < numbers / 2  # (the tiny model's matrices compress)

    exact = model.state_dict()
    bf16 = load_model(tmp_path / "hook_bf16" / CHECKPOINT_NAME)[0].state_dict()
    assert_same_parameters(bf16, exact, "bf16", rel=2 ** -7)
    losses = [r["train/loss"] for r in read_metrics(tmp_path / "hook_powersgd") if "train/loss" in r]
    assert losses[-1] < losses[0]


def test_the_comm_model_projects_as_computed_by_hand_and_from_a_measured_run(runs, tmp_path):
    out = tmp_path / "comm.json"
    printed = subprocess.run([sys.executable, "-m", "scripts.comm_model", "--json", str(out), "--measured",
                              str(runs["ddp"][0])], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.read_text())
    # GPT-2 Small, 8 groups of 8 GPUs at 989 TFLOP/s and 40% MFU, 512 sequences of 1024 a step; DDP over
    # 1 Gbit/s with 10 ms latency: a ring all-reduce of the float32 gradient, 2 x 7/8 of it, 14 latencies.
    with torch.device("meta"):
        small = GPT(GPTConfig.preset("gpt2"))
    parameters = sum(p.numel() for p in small.parameters())
    compute = small.flops_per_token() * 512 * 1024 / 8 / (8 * 989e12 * 0.4)
    comm = 2 * 7 / 8 * 4 * parameters * 8 / 1e9 + 14 * 0.01
    cell = result["models"]["GPT-2 Small"]["methods"]["DDP"]["1 Gbit/s cross-DC"]
    assert cell["step_s"] == pytest.approx(compute + comm, rel=1e-12)
    assert cell["computing"] == pytest.approx(compute / (compute + comm), rel=1e-12)
    diloco = result["models"]["GPT-2 Small"]["methods"]["DiLoCo H=100"]["1 Gbit/s cross-DC"]
    assert diloco["comm_s"] == pytest.approx(comm / 100, rel=1e-12)  # (the same bytes, once in 100 steps)
    assert f"{(compute + comm) * 1e3:.1f}" in printed
    # docs/scaling_out.md shows this output (the models' tables, before the measured run's).
    assert printed.split("\nmeasured (")[0].strip() in (ROOT / "docs" / "scaling_out.md").read_text()
    # The measured run: its bytes a step are what it logged (the whole float32 gradient a step).
    logged = metrics(runs["ddp"][0])
    assert result["measured"]["bytes_per_step"] == logged[(4, "comm/gradient_bytes")] / 4
