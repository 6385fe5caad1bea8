"""train.py end to end: DDP equivalence, exact resume, checkpoints, errors, and a loss that falls."""

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from configs import INVOCATION_KEYS, load_config
from helpers import ROOT, TINY_RUN, make_text, read_metrics, run_train, train_here
from data.shards import write_shard
from train import Trainer
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.instruments import Probe
from training.parts import Part
from training.validation import Validation
from training.run_config import resolve_config

TINY = [*TINY_RUN, "--log_interval=1", "--lr=0.01", "--min_lr=0.001", "--warmup_steps=2"]


def args(data_dir, out_dir, *extra):
    return [*TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}", *extra]


def load_params(run_dir):
    return Checkpoint.load(run_dir / CHECKPOINT_NAME).model


# The optimizers whose math reaches across tensors or batches (trust ratios, the Hessian pass, Muon's
# orthogonalisation, with QK-Clip's maximum over the micro-batches and ranks); AdamW and Lion take
# the same loop path element by element.
EXTRA = {"sophiag": ["--optimizer_options={'hessian_interval': 2}"], "muon": ["--qk_clip_tau=0.02"]}


@pytest.mark.slow  # torchrun, 2 gloo ranks
@pytest.mark.parametrize("optimizer", ["merit", "lamb", "sophiag", "muon"])
def test_two_ranks_equal_one_rank_with_accumulation(byte_shards, tmp_path, optimizer):
    common = ("--max_steps=5", "--batch_size=4", "--micro_batch_size=2", f"--optimizer={optimizer}",
              *EXTRA.get(optimizer, []))
    run_train(*args(byte_shards, tmp_path, "--run_name=ddp", *common), nproc=2)  # accumulation 1
    train_here(*args(byte_shards, tmp_path, "--run_name=single", *common))  # accumulation 2
    ddp, single = load_params(tmp_path / "ddp"), load_params(tmp_path / "single")
    for name in single:
        torch.testing.assert_close(ddp[name], single[name], atol=1e-5, rtol=0, msg=name)
    ddp_losses = [r["train/loss"] for r in read_metrics(tmp_path / "ddp") if "train/loss" in r]
    single_losses = [r["train/loss"] for r in read_metrics(tmp_path / "single") if "train/loss" in r]
    assert ddp_losses == pytest.approx(single_losses, abs=1e-5)
    # The noise scale read its micro-batch gradients in DDP's comm hook on 2 ranks, and across the
    # accumulation micro-steps on 1: the same micro-batches, so the same estimates.
    ddp_noise, single_noise = ({k: v for r in read_metrics(tmp_path / run) for k, v in r.items()
                                if k.startswith("noise_scale/")} for run in ("ddp", "single"))
    assert {"noise_scale/b_simple_attn_qk", "noise_scale/trace_cov", "noise_scale/grad_sq"} <= ddp_noise.keys()
    assert ddp_noise.keys() == single_noise.keys() and ddp_noise["noise_scale/batch_tokens"] == 4 * 32
    for key, value in ddp_noise.items():
        assert value == pytest.approx(single_noise[key], rel=1e-3), key
    if optimizer == "muon":  # QK-Clip clipped on both: the same heads, by the same factors
        ddp_clip, single_clip = ({k: v for r in read_metrics(tmp_path / run) for k, v in r.items()
                                  if k.startswith("qk_clip/")} for run in ("ddp", "single"))
        assert ddp_clip["qk_clip/heads_clipped/layer_00"] > 0 and ddp_clip.keys() == single_clip.keys()
        for key, value in ddp_clip.items():
            assert value == pytest.approx(single_clip[key], rel=1e-5), key


# MERIT (the default), Muon with QK-Clip, and the state of the others: torch's SGD's momentum buffers,
# Adafactor's row and column statistics (every matrix factored: each has a side of 32) and the vectors'.
@pytest.mark.parametrize("extra, state", [
    ((), {"step", "exp_avg", "exp_avg_sq"}),
    (("--optimizer=muon", "--qk_clip_tau=0.05"), {"momentum_buffer", "step", "exp_avg", "exp_avg_sq"}),
    (("--optimizer=sgd", "--optimizer_options={'momentum': 0.9}"), {"momentum_buffer"}),
    (("--optimizer=adafactor", "--optimizer_options={'min_dim_size_to_factor': 32}"),
     {"step", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"})], ids=["merit", "muon", "sgd", "adafactor"])
def test_resume_continues_bitwise(byte_shards, tmp_path, extra, state):
    common = ("--max_steps=8", "--batch_size=4", "--micro_batch_size=2", "--dropout=0.1", "--checkpoint_interval=3",
              *extra)
    train_here(*args(byte_shards, tmp_path, "--run_name=straight", *common))
    train_here(*args(byte_shards, tmp_path, "--run_name=split", *common, "--stop_at_step=4"))
    assert Checkpoint.load(tmp_path / "split" / "ckpt.pt").step == 4
    train_here(*args(byte_shards, tmp_path, "--run_name=split", *common, "--resume"))

    straight, split = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "split")
    assert [r["step"] for r in split if "train/loss" in r] == list(range(1, 9))  # no gap, no duplicate
    muon = (("qk_clip/min_factor/layer_00", "update_rms/transformer.h.1.mlp.c_fc.weight")
            if "--optimizer=muon" in extra else ())
    for key in ("train/loss", "val/loss", "max_logit/layer_01", "attn_entropy/layer_01/head_01", "output/log_z",
                "update_ratio/layer_01/attn_q", "noise_scale/b_simple", *muon):  # (the noise scale's EMA is checkpointed)
        values = [r[key] for r in straight if key in r]
        assert values and [r[key] for r in split if key in r] == values, key
    a, b = Checkpoint.load(tmp_path / "straight" / "ckpt.pt"), Checkpoint.load(tmp_path / "split" / "ckpt.pt")
    for name in a.model:
        assert torch.equal(a.model[name], b.model[name]), name
    assert a.train_loader == b.train_loader
    assert a.optimizer["state"].keys() == b.optimizer["state"].keys()
    assert {key for x in a.optimizer["state"].values() for key in x} == state
    for x, y in zip(a.optimizer["state"].values(), b.optimizer["state"].values()):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.slow  # torchrun, 2 gloo ranks
def test_two_rank_checkpoint_resumes_on_one_rank_with_the_same_global_batches(byte_shards, tmp_path):
    # Aligned rows follow a cursor through the global stream: the strictest test of its position.
    common = ("--max_steps=6", "--batch_size=4", "--micro_batch_size=2", "--align_documents=True")
    run_train(*args(byte_shards, tmp_path, "--run_name=straight", *common), nproc=2)
    stopped = run_train(*args(byte_shards, tmp_path, "--run_name=split", *common, "--stop_at_step=3"), nproc=2)
    # The run's own resume command is torchrun's, with its arguments but the stop.
    printed = shlex.split(stopped.stdout.rsplit("resume    ", 1)[1].splitlines()[0])
    assert printed == ["torchrun", "--standalone", "--nproc_per_node=2", "train.py",
                       *args(byte_shards, tmp_path, "--run_name=split", *common), "--resume"]
    resumed = train_here(*args(byte_shards, tmp_path, "--run_name=split", *common, "--resume"))  # accumulation 2
    assert "resuming on 1 ranks from a checkpoint of 2" in resumed.stdout

    straight, split = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "split")
    assert [r["step"] for r in split if "train/loss" in r] == list(range(1, 7))
    for key in ("train/loss", "val/loss"):
        assert [r[key] for r in split if key in r] == pytest.approx([r[key] for r in straight if key in r], abs=1e-5)
    a, b = Checkpoint.load(tmp_path / "straight" / "ckpt.pt"), Checkpoint.load(tmp_path / "split" / "ckpt.pt")
    assert a.train_loader == b.train_loader
    for name in a.model:
        torch.testing.assert_close(a.model[name], b.model[name], atol=1e-5, rtol=0, msg=name)


def test_align_documents_reaches_every_loader(byte_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    trainer = Trainer(resolve_config(load_config(None, args(byte_shards, tmp_path, "--align_documents=True", "--max_steps=1", "--warmup_steps=1",
                                                 "--batch_size=2", "--micro_batch_size=2"))))
    eot = trainer.tokenizer.eot_token
    for loader in (trainer.train_loader, trainer.parts.find(Validation).loader):
        assert loader.align_documents and loader.eot_token == eot and loader.vocab_size == trainer.tokenizer.n_vocab
        assert (loader.next_batch()[0][:, 0] == eot).all()
    assert (trainer.parts.find(Probe).batch[:, 0] == eot).all()
    trainer.close()


def test_checkpoint_contents_and_incompatible_resume(byte_shards, tmp_path):
    train_here(*args(byte_shards, tmp_path, "--max_steps=2", "--batch_size=2", "--micro_batch_size=2"))
    state = Checkpoint.load(tmp_path / "default" / "ckpt.pt")
    assert state.step == 2 and state.tokens == 2 * 2 * 32
    assert state.config["optimizer"] == "merit" and state.model_args["n_layer"] == 2
    assert state.optimizer["state"] and len(state.rng) == 1 and state.train_loader
    assert state.code_version and state.optim_backends == {"group0": "cpp", "group1": "cpp"}
    # config.json records the run's config, the invocation's flags (--resume, ...) aside
    recorded = {key: value for key, value in state.config.items() if key not in INVOCATION_KEYS}
    assert json.loads((tmp_path / "default" / "config.json").read_text()) == recorded
    refused = train_here(*args(byte_shards, tmp_path, "--max_steps=4", "--batch_size=2", "--micro_batch_size=2",
                              "--n_embd=64", "--resume"), check=False)
    assert refused.returncode != 0 and "n_embd: checkpoint 32, now 64" in refused.stderr


def small_checkpoint(step: int, value: float) -> Checkpoint:
    return Checkpoint(model={"w": torch.full((3,), value)}, model_args={"n_layer": 2, "n_embd": 32}, optimizer={},
                      scaler={}, step=step, tokens=0, rng=[], train_loader={},
                      config={"tokenizer": "byte", "optimizer": "merit", "batch_size": 4})


def test_incompatible_checkpoint_message(tmp_path):
    with pytest.raises(ValueError, match=r"n_embd: checkpoint 32, now 64"):
        small_checkpoint(1, 1.0).changes_on_resume({"n_layer": 2, "n_embd": 64},
                                                  {"tokenizer": "byte", "optimizer": "merit", "batch_size": 4,
                                                   "stop_at_step": 0}, tmp_path, total_steps=10)
    with pytest.raises(ValueError, match=r"batch_size: checkpoint 4, now 8"):
        small_checkpoint(1, 1.0).changes_on_resume({"n_layer": 2, "n_embd": 32},
                                                  {"tokenizer": "byte", "optimizer": "merit", "batch_size": 8,
                                                   "stop_at_step": 0}, tmp_path, total_steps=10)


def test_a_checkpoint_from_before_the_llama_fields_resumes_and_another_family_is_refused(tmp_path):
    """A GPT-2 checkpoint written before arch, intermediate_size, norm_eps, rope_theta and the soft-caps
    existed is the model those fields' defaults build: resuming it changes nothing; a Llama config is refused."""
    from model import GPTConfig
    now = vars(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    old = {key: now[key] for key in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias",
                                     "scale_attn_by_inverse_layer_idx", "qk_norm")}
    checkpoint = small_checkpoint(1, 1.0)
    checkpoint.model_args = old
    config = {"tokenizer": "byte", "optimizer": "merit", "batch_size": 4, "stop_at_step": 0}
    assert checkpoint.changes_on_resume(now, config, tmp_path, total_steps=10) == []
    with pytest.raises(ValueError, match=r"arch: checkpoint 'gpt2', now 'llama'"):
        checkpoint.changes_on_resume({**now, "arch": "llama"}, config, tmp_path, total_steps=10)


def test_atomic_save_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    small_checkpoint(1, 1.0).save(path)

    def crash(obj, f):
        f.write(b"partial garbage")
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        small_checkpoint(2, 0.0).save(path)
    monkeypatch.undo()
    state = Checkpoint.load(path)
    assert state.step == 1 and torch.equal(state.model["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no temporary left behind


def test_older_checkpoints_load_and_other_versions_are_refused(tmp_path):
    fields = {key: value for key, value in vars(small_checkpoint(5, 2.0)).items()
              if key not in ("parts", "evaluation_pending")}
    noise_scale = {"ema_grad_sq": [1.0], "ema_trace": [3.0]}
    # version 1: before optim_backends and train_window; 2: before noise_scale; 3: before tensors;
    # 4: the noise scale's state in a field of its own (version 5 keeps it in parts); 5: before
    # batch_phases (one batch throughout: the config's); 6: a pending evaluation by its step (7: a bool)
    added = {2: ("optim_backends", "train_window"), 3: ("noise_scale",), 4: ("tensors",), 5: ("changes", "evaluating"),
             6: ("batch_phases",)}
    fields["evaluating"] = 5
    for version in (1, 2, 3, 4, 5, 6):
        newer = [key for later in range(version + 1, 7) for key in added.get(later, ())]
        saved = {**fields, "noise_scale": noise_scale} if version < 5 else {**fields, "parts": {"noise_scale": noise_scale}}
        torch.save({"format_version": version, **{k: v for k, v in saved.items() if k not in newer}},
                   tmp_path / f"v{version}.pt")
        old = Checkpoint.load(tmp_path / f"v{version}.pt")
        assert old.step == 5 and old.tensors == "inline" and torch.equal(old.model["w"], torch.full((3,), 2.0))
        assert old.parts == ({"noise_scale": noise_scale} if version >= 3 else {})
        assert old.batch_phases == ([[0, 0, 4]] if version < 6 else fields["batch_phases"]) and old.changes == []
        assert old.evaluation_pending == (version >= 5)  # (older files pended nothing)
    assert Checkpoint.load(tmp_path / "v1.pt").optim_backends == {}
    fields = vars(small_checkpoint(5, 2.0))
    torch.save({"format_version": 99, **fields}, tmp_path / "v99.pt")
    with pytest.raises(ValueError, match="format version 99, this code reads 1 to 7"):
        Checkpoint.load(tmp_path / "v99.pt")
    torch.save({"format_version": 2, **fields, "extra": 1}, tmp_path / "extra.pt")
    with pytest.raises(ValueError, match=r"unknown \['extra'\]"):
        Checkpoint.load(tmp_path / "extra.pt")


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="corrupt or not a nanoMERIT checkpoint"):
        Checkpoint.load(path)
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*missing.pt: give the path of a checkpoint"):
        Checkpoint.load(tmp_path / "missing.pt")


def test_validation_loss_falls(byte_shards, tmp_path):
    train_here(*args(byte_shards, tmp_path, "--max_steps=60", "--batch_size=8", "--micro_batch_size=8",
                    "--eval_interval=30", "--lr=0.02"))
    val = [r["val/loss"] for r in read_metrics(tmp_path / "default") if "val/loss" in r]
    assert len(val) == 3 and val[-1] < 0.8 * val[0], val  # from ~ln(320) = 5.8 towards the text's entropy
    logits = [r for r in read_metrics(tmp_path / "default") if "max_logit/layer_00" in r]
    assert all(r["max_logit/layer_00"] > 0 for r in logits)


def test_the_small_llama_config_trains_a_llama(byte_shards, tmp_path):
    """configs/llama_cpu.py, shortened (its lr, optimizer and model): a Llama block trains, its loss falls."""
    from training.checkpoint import load_model
    train_here("configs/llama_cpu.py", f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--max_steps=12",
               "--warmup_steps=2", "--block_size=64", "--batch_size=4", "--micro_batch_size=4", "--eval_interval=12",
               "--log_interval=6", "--val_tokens=1024", "--probe_batch_size=2", "--sample_tokens=0")
    records = read_metrics(tmp_path / "llama_cpu")
    val = [r["val/loss"] for r in records if "val/loss" in r]
    assert len(val) == 2 and val[-1] < 0.9 * val[0], val  # from ~ln(320) = 5.8
    assert sorted(k for k in records[-2] if k.startswith("max_logit/layer_") and k.count("/") == 1) == [
        f"max_logit/layer_0{i}" for i in range(4)]
    model, _ = load_model(tmp_path / "llama_cpu" / CHECKPOINT_NAME)
    assert model.config.arch == "llama" and model.config.n_embd == 128
    assert model.lm_head.weight is not model.transformer.wte.weight  # untied, as Llama's


def test_heldout_loss_is_the_model_s_loss_on_the_val_tokens_after_val_tokens(byte_shards, tmp_path):
    """val/loss on the first 512 val tokens, heldout/loss on the 1024 after them: both against the
    final checkpoint's losses computed here from the val shard's tokens."""
    from data.shards import open_shard
    from training.checkpoint import load_model
    train_here(*args(byte_shards, tmp_path, "--max_steps=6", "--batch_size=4", "--micro_batch_size=2",
                     "--heldout_tokens=1024"))
    final = read_metrics(tmp_path / "default")[-1]
    model, _ = load_model(tmp_path / "default" / CHECKPOINT_NAME)
    tokens = torch.from_numpy(open_shard(byte_shards / "val_000000.bin").astype("int64"))

    def mean_loss(start: int, micro_batches: int) -> float:  # micro-batches of 2 x 32 tokens
        losses = []
        for i in range(micro_batches):
            chunk = tokens[start + i * 64: start + i * 64 + 65]
            losses.append(model(chunk[:-1].view(2, 32), chunk[1:].view(2, 32))[1].item())
        return sum(losses) / len(losses)
    with torch.no_grad():
        assert final["val/loss"] == pytest.approx(mean_loss(0, 8), rel=1e-5)
        assert final["heldout/loss"] == pytest.approx(mean_loss(512, 16), rel=1e-5)
    assert all(("heldout/loss" in r) == ("val/loss" in r) for r in read_metrics(tmp_path / "default"))


@pytest.mark.slow  # a real process, signalled
def test_sigterm_saves_and_exits_cleanly(byte_shards, tmp_path):
    cmd = [sys.executable, str(ROOT / "train.py"), *args(byte_shards, tmp_path, "--max_steps=100000",
                                                         "--batch_size=2", "--micro_batch_size=2")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "default" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # what SLURM and torchrun send on preemption
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    state = Checkpoint.load(tmp_path / "default" / "ckpt.pt")
    assert 2 <= state.step < 100000 and "SIGTERM received" in output
    assert output.index("SIGTERM: saving at the next log step") < output.index("SIGTERM received")  # said at once


@pytest.mark.slow  # a real process, signalled during its final zero-shot evaluation
def test_sigterm_during_the_final_evaluation_leaves_it_pending_and_the_resume_runs_only_it(byte_shards, tmp_path):
    from eval.samples import write_fixtures
    write_fixtures(tmp_path / "tasks")
    run = args(byte_shards, tmp_path, "--max_steps=6", "--batch_size=2", "--micro_batch_size=2", "--block_size=128",
               "--zero_shot_tasks=boolq,cb,copa,rte,wic,wsc,piqa,winogrande,arc_easy,arc_challenge,lambada_openai",
               f"--zero_shot_data_dir={tmp_path / 'tasks'}", "--log_interval=2")
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *run], cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics, deadline = tmp_path / "default" / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and not (metrics.exists() and '"step": 6, "tokens"' in metrics.read_text()):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)  # the final train record is written: the evaluations are under way
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    saved = Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME)
    assert saved.step == 6 and saved.evaluation_pending, output  # trained to the end, its evaluation pending
    assert not any(key.startswith("zero_shot/") for r in read_metrics(tmp_path / "default") for key in r)
    trained = [r for r in read_metrics(tmp_path / "default") if "train/loss" in r]

    resumed = train_here(*run, "--resume")  # runs what is missing, and nothing else
    records = read_metrics(tmp_path / "default")
    assert [r for r in records if "train/loss" in r] == trained
    final = {k: v for r in records if r.get("step") == 6 for k, v in r.items()}
    assert "val/loss" in final and {f"zero_shot/{task}/acc" for task in ("boolq", "cb", "piqa")} <= final.keys()
    assert Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME).evaluation_pending is False
    assert "finished 6 steps" in resumed.stdout
    again = train_here(*run, "--resume")
    assert "already finished its 6 steps: nothing to do" in again.stdout


class Sigterm(Part):
    """SIGTERM to this process, as a scheduler sends it: after step ``after_step_number`` (before its
    evaluations), and when the loop begins where ``at_start`` (a resume: before its pending evaluation)."""
    after_step_number, at_start = 6, False

    def __init__(self, run):
        pass

    def start(self) -> None:
        if self.at_start:
            signal.raise_signal(signal.SIGTERM)

    def after_step(self, step) -> None:
        if step.number == self.after_step_number:
            signal.raise_signal(signal.SIGTERM)


def test_an_evaluation_a_stop_left_pending_runs_first_on_any_resume_and_is_said(byte_shards, tmp_path, monkeypatch):
    """SIGTERM before step 6's final zero-shot evaluation: the stop says it is pending; a resume
    stopped again before it trains nothing; a resume that lengthens the run evaluates step 6 as
    the final step it was, then trains on."""
    from eval.samples import write_fixtures
    write_fixtures(tmp_path / "tasks")
    run = args(byte_shards, tmp_path, "--max_steps=6", "--batch_size=2", "--micro_batch_size=2", "--log_interval=2",
               "--zero_shot_tasks=boolq,cb", f"--zero_shot_data_dir={tmp_path / 'tasks'}", "--zero_shot_limit=4",
               f"--extra_parts={__name__}:Sigterm")
    stopped = train_here(*run)
    assert "SIGTERM received, saved step 6, with step 6's evaluation pending (any resume runs it first), exiting" \
        in stopped.stdout + stopped.stderr
    assert "step 6's evaluation, which a stop interrupted, is pending" in stopped.stdout  # (the guide)
    assert Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME).evaluation_pending is True
    longer = ["--resume", "--max_steps=8", "--allow_changes=max_steps"]
    monkeypatch.setattr(Sigterm, "at_start", True)
    again = train_here(*run, *longer)
    assert "step 6's pending evaluation runs first" in again.stdout
    assert "saved step 6, with step 6's evaluation pending" in again.stdout + again.stderr
    saved = Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME)
    assert (saved.step, saved.evaluation_pending) == (6, True)  # nothing trained before it
    assert not any(key.startswith("zero_shot/") for r in read_metrics(tmp_path / "default") for key in r)
    monkeypatch.setattr(Sigterm, "at_start", False)
    train_here(*run, *longer)
    records = read_metrics(tmp_path / "default")
    evaluated = {r["step"] for r in records if "zero_shot/boolq/acc" in r}
    assert evaluated == {6, 8}  # step 6's, the final step of the run it was; then the new final step's
    assert [r["step"] for r in records if "train/loss" in r] == [2, 4, 6, 8]
    assert Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME).evaluation_pending is False


def test_sophia_hessian_hook_runs_every_k_steps_with_the_configured_batch(byte_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = load_config(None, args(byte_shards, tmp_path, "--optimizer=sophiag", "--max_steps=7", "--batch_size=4",
                                    "--micro_batch_size=2", "--log_interval=3",
                                    "--optimizer_options={'hessian_interval': 3}"))
    trainer = Trainer(resolve_config(config))
    assert trainer.optimizer.batch_tokens == 4 * 32  # bs follows the global batch, not a constant
    updates = []
    original = trainer.optimizer.update_hessian

    def recording_update():
        updates.append(trainer.step)
        hessian = [g.abs().sum() for g in (p.grad for p in trainer.model.parameters()) if g is not None]
        assert torch.stack(hessian).sum() > 0  # the sampled-label gradient is there
        original()

    monkeypatch.setattr(trainer.optimizer, "update_hessian", recording_update)
    trainer.train()
    assert updates == [3, 6]
    records = read_metrics(tmp_path / "default")
    win_rates = [v for r in records for k, v in r.items() if k.startswith("win_rate/")]
    assert win_rates and all(0.0 <= v <= 1.0 for v in win_rates)
    assert 0 < max(win_rates)  # h > 0 after the first estimate
    other = Trainer(resolve_config(load_config(None, args(byte_shards, tmp_path, "--optimizer=sophiag", "--max_steps=1", "--warmup_steps=1",
                                               "--batch_size=8", "--micro_batch_size=2", "--run_name=bigger"))))
    assert other.optimizer.batch_tokens == 8 * 32
    other.close()


@pytest.mark.parametrize("optimizer, statistic", [("merit", "clip_fraction"), ("lamb", "trust_ratio"),
                                                  ("adamw", None), ("lion", None)])
def test_optimizer_diagnostics_and_instruments_are_logged_per_layer(byte_shards, tmp_path, optimizer, statistic):
    train_here(*args(byte_shards, tmp_path, f"--optimizer={optimizer}", "--max_steps=4", "--batch_size=2",
                    "--micro_batch_size=2", "--log_interval=2"))
    logged = [r for r in read_metrics(tmp_path / "default") if "train/loss" in r]
    assert [r["step"] for r in logged] == [2, 4]
    for record in logged:
        if statistic:  # the optimizer's own
            assert f"{statistic}/transformer.h.1.attn.c_attn.weight" in record
        # the loop's, for every optimizer (no noise scale: one rank without accumulation)
        for key in ("update_ratio/layer_01/attn_k", "update_ratio/layer_01/mlp_proj", "weight_max_abs/layer_01/attn_q",
                    "max_logit/layer_01", "max_logit/layer_01/head_00", "attn_entropy/layer_01",
                    "attn_entropy/layer_01/head_00", "output/log_z", "output/max_abs_logit"):
            assert math.isfinite(record[key]), key
        assert record["attn_entropy/layer_01"] == min(v for k, v in record.items()
                                                      if k.startswith("attn_entropy/layer_01/head_"))
        assert not any(k.startswith("noise_scale/") for k in record)


def test_sophiag_trains_with_its_published_settings_and_records_them(byte_shards, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    trainer = Trainer(resolve_config(load_config(None, args(byte_shards, tmp_path, "--optimizer=sophiag", "--batch_size=2",
                                                 "--micro_batch_size=2", "--max_steps=2", "--beta1=0.9"))))
    try:
        trainer.train()
    finally:
        trainer.close()
    decayed = next(g for g in trainer.optimizer.param_groups if g["weight_decay"] != 0)
    assert decayed["betas"] == (0.9, 0.99) and decayed["weight_decay"] == 0.2 and decayed["rho"] == 0.05
    assert "betas (0.9, 0.99) (set), rho 0.05 (published)" in capsys.readouterr().out
    for recorded in (json.loads((tmp_path / "default" / "config.json").read_text()),
                     Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME).config):
        assert (recorded["beta1"], recorded["beta2"], recorded["weight_decay"]) == (0.9, 0.99, 0.2)
        assert recorded["optimizer_options"]["rho"] == 0.05


def test_seed_and_data_seed_vary_independently(tmp_path, monkeypatch):
    """seed: the initial weights (and dropout); data_seed: the order of the training shards."""
    monkeypatch.chdir(ROOT)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(6):  # distinct shards, so that their order shows in the first batch
        tokens = [256] + list(make_text(40, 100 + i).encode())
        write_shard(data / f"train_{i:06d}.bin", np.array(tokens, dtype=np.uint16))
    write_shard(data / "val_000000.bin", np.array([256] + list(make_text(40, 0).encode()), dtype=np.uint16))

    def start(*seeds):
        trainer = Trainer(resolve_config(load_config(None, args(data, tmp_path / "runs", "--max_steps=2", "--batch_size=2",
                                                     "--micro_batch_size=2", *seeds))))
        try:
            return next(trainer.model.parameters()).detach().clone(), trainer.train_loader.next_batch()[0]
        finally:
            trainer.close()

    weights, batch = start()
    other_weights, same_batch = start("--seed=7")
    same_weights, other_batch = start("--data_seed=7")
    assert not torch.equal(weights, other_weights) and torch.equal(batch, same_batch)
    assert torch.equal(weights, same_weights) and not torch.equal(batch, other_batch)

