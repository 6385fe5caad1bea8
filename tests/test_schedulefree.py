"""Schedule-Free AdamW (optim/schedulefree.py): against a naive float64 transcription of
docs/optimizers.md on each backend, bitwise against the ``schedulefree`` package (its operations,
fed the loop's warmed-up lr), its state_dict and eval()/train(), invalid settings; and in the
training loop: validation, the probe, the sample and the checkpoint at the average x, a resume
that continues bitwise, and the HF export, zero-shot evaluation and Hessian tool reading x."""
import copy
import io
import json
import math
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import numpy as np
import pytest
import schedulefree
import torch
from torch import nn

import optim
from configs import ConfigError, load_config
from helpers import TINY_RUN, read_metrics, train_here
from optim import AdamWScheduleFree
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.run_config import resolve_config
from training.schedule import LrSchedule

STEPS, WARMUP, LR = 20, 5, 0.05


def warmed_up(lr: float, k: int, warmup: int) -> float:
    """The package's lr of step k + 1 with ``warmup_steps``: ``lr * sched``, its expression."""
    return lr * ((k + 1) / warmup) if k < warmup else lr


class NaiveScheduleFreeAdamW:
    """docs/optimizers.md's Schedule-Free AdamW element by element in float64, written from the
    spec: the three sequences z, x and y kept apart (the optimizer keeps z and y, not x)."""

    def __init__(self, p, betas, eps, wd, r=0.0, weight_lr_power=2.0):
        self.z = np.array(p, dtype=np.float64)
        self.x, self.y, self.v = self.z.copy(), self.z.copy(), np.zeros_like(self.z)
        (self.b1, self.b2), self.eps, self.wd, self.r, self.power = betas, eps, wd, r, weight_lr_power
        self.t, self.lr_max, self.weight_sum = 0, 0.0, 0.0

    def step(self, g, lr):
        self.t += 1
        self.lr_max = max(self.lr_max, lr)
        weight = self.t ** self.r * self.lr_max ** self.power
        self.weight_sum += weight
        c = weight / self.weight_sum
        z, x, y, v = self.z, self.x, self.y, self.v
        for i in np.ndindex(z.shape):
            v[i] = self.b2 * v[i] + (1 - self.b2) * g[i] * g[i]
            u = g[i] / (math.sqrt(v[i] / (1 - self.b2 ** self.t)) + self.eps) + self.wd * y[i]
            z[i] = z[i] - lr * u
            x[i] = (1 - c) * x[i] + c * z[i]
            y[i] = (1 - self.b1) * z[i] + self.b1 * x[i]


def _data(seed, dtype=torch.float64):
    """Initial (matrix, vector) and STEPS gradients: a zero row in the matrix, a zero column in its
    gradients (v stays 0 there: u is the decay alone)."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    matrix = rand(5, 7)
    matrix[2] = 0
    grads = []
    for k in range(STEPS):
        g = rand(5, 7) * (1 + k % 3)
        g[:, 4] = 0
        grads.append((g, rand(4)))
    return (matrix, rand(4)), grads


def _groups(a, b):
    """A decayed matrix with the defaults; a vector with betas, r and weight_lr_power of its own."""
    return [{"params": [a], "weight_decay": 0.1},
            {"params": [b], "betas": (0.8, 0.95), "r": 1.0, "weight_lr_power": 1.0}]


def _set_lr(opt, k):
    for group in opt.param_groups:  # the training loop's warmup, as it sets it
        group["lr"] = warmed_up(LR, k, WARMUP)


def test_matches_naive_reference_and_evaluates_at_x(backend):
    (pa, pb), grads = _data(0)
    a, b = nn.Parameter(pa.clone()), nn.Parameter(pb.clone())
    opt = AdamWScheduleFree(_groups(a, b), lr=LR, backend=backend)
    refs = (NaiveScheduleFreeAdamW(pa.numpy(), (0.9, 0.999), 1e-8, 0.1),
            NaiveScheduleFreeAdamW(pb.numpy(), (0.8, 0.95), 1e-8, 0.0, r=1.0, weight_lr_power=1.0))
    for k, gs in enumerate(grads):
        _set_lr(opt, k)
        a.grad, b.grad = (g.clone() for g in gs)
        opt.step()
        for p, ref, g in zip((a, b), refs, gs):
            ref.step(g.numpy(), warmed_up(LR, k, WARMUP))
            for ours, theirs in ((p, ref.y), (opt.state[p]["z"], ref.z), (opt.state[p]["exp_avg_sq"], ref.v)):
                assert np.abs(ours.detach().numpy() - theirs).max() <= 1e-10
    assert [g["k"] for g in opt.param_groups] == [STEPS, STEPS]
    assert opt.eval() and not opt.eval()  # idempotent
    for p, ref in zip((a, b), refs):
        assert np.abs(p.detach().numpy() - ref.x).max() <= 1e-10
    assert opt.train() and not opt.train()
    for p, ref in zip((a, b), refs):
        assert np.abs(p.detach().numpy() - ref.y).max() <= 1e-10


def _package_and_ours(dtype=torch.float32):
    (pa, pb), grads = _data(1, dtype)
    ours = [nn.Parameter(pa.clone()), nn.Parameter(pb.clone())]
    theirs = [nn.Parameter(pa.clone()), nn.Parameter(pb.clone())]
    opt = AdamWScheduleFree(_groups(*ours), lr=LR, backend="torch")
    package = schedulefree.AdamWScheduleFree(_groups(*theirs), lr=LR, warmup_steps=WARMUP)
    package.train()  # (the package starts in eval mode and must be told)
    return grads, (opt, ours), (package, theirs)


def _assert_bitwise(opt, ours, package, theirs):
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)
        for key in ("z", "exp_avg_sq"):
            assert torch.equal(opt.state[p][key], package.state[q][key]), key
    for group, theirs_group in zip(opt.param_groups, package.param_groups):
        for key in AdamWScheduleFree.GROUP_STATE:
            assert group[key] == theirs_group[key], key


def test_is_the_package_bitwise_fed_the_loops_warmup_and_so_are_x_and_y():
    """The package with warmup_steps computes lr * sched itself; we get that lr from the loop. Its
    operations in its order (foreach, its default; bitwise on CPU, where foreach loops the per-tensor
    operations): every parameter, state tensor and group scalar is bitwise the package's, and so is
    x after eval() and y after train(), and the steps after that round trip."""
    grads, (opt, ours), (package, theirs) = _package_and_ours()
    for k, gs in enumerate(grads):
        if k == 12:
            opt.eval(), package.eval()
            _assert_bitwise(opt, ours, package, theirs)
            opt.train(), package.train()
        _set_lr(opt, k)
        for ps in (ours, theirs):
            for p, g in zip(ps, gs):
                p.grad = g.clone()
        opt.step()
        package.step()
        _assert_bitwise(opt, ours, package, theirs)


def test_the_loops_constant_schedule_is_the_packages_warmup():
    """LrSchedule("constant"): the warmup's lr * (k+1) / W is the package's lr * ((k+1) / W) up to
    the order of two roundings (1 ulp apart at about a quarter of the steps), then the peak exactly,
    for good."""
    lr, warmup_steps, step_tokens = 1e-3, 2000, 64 * 1024  # the benchmark's 124M run
    schedule = LrSchedule(total=128_000 * step_tokens, warmup=warmup_steps * step_tokens, decay_start=0, lr=lr,
                          min_lr=0.0, kind="constant")
    for k in [*range(0, warmup_steps, 7), warmup_steps - 1]:
        assert schedule(k * step_tokens, step_tokens) == pytest.approx(warmed_up(lr, k, warmup_steps), rel=5e-16)
    assert all(schedule(k * step_tokens, step_tokens) == lr for k in (warmup_steps, 50_000, 127_999))


def test_fed_the_loops_warmup_it_is_the_package_with_warmup_steps():
    """The run's own lr sequence (LrSchedule "constant", the warmup in tokens) against the package's
    warmup_steps: the lr 1 ulp apart at some warmup steps, so float32 rounding apart at most."""
    grads, (opt, ours), (package, theirs) = _package_and_ours()
    step_tokens = 128
    schedule = LrSchedule(total=STEPS * step_tokens, warmup=WARMUP * step_tokens, decay_start=0, lr=LR, min_lr=0.0,
                          kind="constant")
    for k, gs in enumerate(grads):
        for group in opt.param_groups:
            group["lr"] = schedule(k * step_tokens, step_tokens)
        for ps in (ours, theirs):
            for p, g in zip(ps, gs):
                p.grad = g.clone()
        opt.step()
        package.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(opt.state[p]["z"], package.state[q]["z"], rtol=1e-6, atol=1e-7)
    assert [g["lr_max"] for g in opt.param_groups] == [g["lr_max"] for g in package.param_groups] == [LR, LR]


def test_state_dict_round_trip_continues_bitwise_from_x():
    """A checkpoint holds x (eval()) with z and the group scalars; loaded into a new optimizer over
    x's weights, train() gives the y the saving optimizer's train() gives, and the steps go on
    bitwise alike."""
    grads, (opt, ours), _ = _package_and_ours()
    for k in range(8):
        _set_lr(opt, k)
        for p, g in zip(ours, grads[k]):
            p.grad = g.clone()
        opt.step()
    opt.eval()
    buf = io.BytesIO()  # through torch.save, as a checkpoint would, so nothing is shared
    torch.save(opt.state_dict(), buf)
    clones = [nn.Parameter(p.detach().clone()) for p in ours]
    resumed = AdamWScheduleFree(_groups(*clones), lr=LR, backend="torch")
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    assert [g["train_mode"] for g in resumed.param_groups] == [False, False]
    with pytest.raises(RuntimeError, match="call optimizer.train"):
        resumed.step()
    for o in (opt, resumed):
        o.train()
    for k in range(8, STEPS):
        for o, ps in ((opt, ours), (resumed, clones)):
            _set_lr(o, k)
            for p, g in zip(ps, grads[k]):
                p.grad = g.clone()
            o.step()
    _assert_bitwise(opt, ours, resumed, clones)
    twin = copy.deepcopy(resumed)  # (pickling keeps the backend and the group scalars)
    assert twin.backend == "torch" and twin.param_groups[0]["k"] == STEPS


def test_non_finite_steps_are_dropped_on_the_host_and_count_nothing():
    p = nn.Parameter(torch.ones(3))
    opt = optim.build("adamw_schedulefree", [p], lr=0.1)
    assert not opt._step_supports_amp_scaling  # (the group scalars live on the host)
    p.grad = torch.ones(3)
    opt.step_unless(torch.tensor(True))
    assert opt.param_groups[0]["k"] == 0 and not opt.state and torch.equal(p, torch.ones(3))
    opt.step_unless(torch.tensor(False))
    assert opt.param_groups[0]["k"] == 1 and not torch.equal(p, torch.ones(3))


COMMON_INVALID = [({"lr": -0.1}, "-0.1"), ({"lr": float("nan")}, "nan"), ({"betas": (1.0, 0.99)}, "1.0"),
                  ({"betas": (0.9, -0.5)}, "-0.5"), ({"weight_decay": -0.01}, "-0.01"), ({"eps": -1e-8}, "-1e-08")]


@pytest.mark.parametrize("kwargs, bad", [*COMMON_INVALID, ({"betas": (0.0, 0.99)}, "0.0.*dividing by beta1"),
                                         ({"r": -1.0}, "r: -1.0"), ({"weight_lr_power": float("inf")}, "inf")])
def test_invalid_hyperparameters_raise_naming_the_value(kwargs, bad):
    p = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=bad):
        AdamWScheduleFree([p], **kwargs)
    with pytest.raises(ValueError, match=bad):  # a param group's own value is checked too
        AdamWScheduleFree([{"params": [p], **kwargs}])
    with pytest.raises(ValueError, match=bad):
        optim.build("adamw_schedulefree", [p], **{"lr": 1e-3, **kwargs})


def test_published_settings_are_the_benchmarks():
    """scripts/124m/sf-adamw.sh of the 2025 benchmark: betas (0.9, 0.9999), weight decay 0.1, r 0 and
    weight_lr_power 2; eps the package's 1e-8 (the script sets none)."""
    settings = optim.settings("adamw_schedulefree", lr=1e-3)
    assert {key: value for key, (value, _) in settings.items()} == {
        "lr": 1e-3, "betas": (0.9, 0.9999), "eps": 1e-8, "weight_decay": 0.1, "r": 0.0, "weight_lr_power": 2.0}
    constructor = optim.build("adamw_schedulefree", nn.Linear(2, 2), lr=1e-3, defaults="constructor")
    assert (constructor.defaults["betas"], constructor.defaults["weight_decay"]) == ((0.9, 0.999), 0.0)


# --- the training loop ---
RUN = [*TINY_RUN, "--optimizer=adamw_schedulefree", "--lr_schedule=constant", "--lr=0.01", "--warmup_steps=2",
       "--max_steps=8", "--batch_size=4", "--micro_batch_size=2", "--log_interval=2", "--eval_interval=4",
       "--checkpoint_interval=3", "--dropout=0.1", "--sample_tokens=8"]


@pytest.fixture(scope="module")
def run(byte_shards, tmp_path_factory):
    """A run trained in this process (one thread, as ``train_here``), its Trainer kept: the model
    holds x at the end (the final save put it there), and the y of each move to x is recorded."""
    from train import Trainer
    out = tmp_path_factory.mktemp("schedulefree")
    trainer = Trainer(resolve_config(load_config(None, [*RUN, f"--data_dir={byte_shards}", f"--out_dir={out}",
                                                        "--run_name=straight"])))
    ys, to_x = [], trainer.optimizer.eval

    def eval_recording_y() -> bool:
        y = [p.detach().clone() for p in trainer.model.parameters()]
        moved = to_x()
        if moved:
            ys.append(y)
        return moved

    trainer.optimizer.eval = eval_recording_y
    threads, printed = torch.get_num_threads(), io.StringIO()
    torch.set_num_threads(1)
    try:
        with redirect_stdout(printed), redirect_stderr(io.StringIO()):
            trainer.train()
    finally:
        trainer.close()
        torch.set_num_threads(threads)
    run_dir = out / "straight"
    x = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    y = dict(zip(x, ys[-1]))
    return SimpleNamespace(trainer=trainer, x=x, y=y, dir=run_dir, out=out, printed=printed.getvalue(),
                           checkpoint=Checkpoint.load(run_dir / CHECKPOINT_NAME))


def _val_loss(model, byte_shards) -> float:
    """The model's mean loss on the first 512 val tokens, as 8 micro-batches of 2 x 32 tokens."""
    from data.shards import open_shard
    tokens = torch.from_numpy(open_shard(byte_shards / "val_000000.bin").astype("int64"))
    model.eval()
    with torch.no_grad():
        return sum(model(tokens[i * 64: i * 64 + 64].view(2, 32), tokens[i * 64 + 1: i * 64 + 65].view(2, 32))[1].item()
                   for i in range(8)) / 8


def _gpt(run, weights: dict):
    """A GPT of the run's shape with ``weights`` (a name -> tensor dict of its parameters)."""
    from model import GPT
    model = GPT(run.checkpoint.model_config(run.dir))
    model.load_state_dict(weights, strict=False)
    return model


def test_the_checkpoint_validation_probe_and_sample_are_at_x(run, byte_shards):
    """The checkpoint's model is x = y + (1 - 1/b1)(z - y), from the last y and the checkpoint's z in
    float64 (float32 rounding apart); the final val/loss is that model's loss and not y's; the
    final probe and the sample are x's; the optimizer state holds z with the parameters at x."""
    checkpoint, beta1 = run.checkpoint, run.trainer.optimizer.param_groups[0]["betas"][0]
    z = {name: run.trainer.optimizer.state[p]["z"] for name, p in run.trainer.model.named_parameters()}
    for name, y in run.y.items():
        y, zz = y.double(), z[name].double()
        torch.testing.assert_close(checkpoint.model[name].double(), y + (1 - 1 / beta1) * (zz - y),
                                   rtol=1e-6, atol=1e-7, msg=name)
        assert torch.equal(checkpoint.model[name], run.x[name]), name
    assert all(not g["train_mode"] for g in checkpoint.optimizer["param_groups"])
    final = {k: v for r in read_metrics(run.dir) if r.get("step") == 8 for k, v in r.items()}
    at_x, at_y = _val_loss(_gpt(run, run.x), byte_shards), _val_loss(_gpt(run, run.y), byte_shards)
    assert final["val/loss"] == pytest.approx(at_x, rel=1e-5)
    assert abs(at_x - at_y) > 100 * 1e-5 * at_x  # (the two points are told apart)
    from training.instruments import Probe, probe_record
    probe = probe_record(_gpt(run, run.x), run.trainer.parts.find(Probe).batch)
    assert final["max_logit/layer_01"] == pytest.approx(probe["max_logit/layer_01"], rel=1e-6)
    from training.console import Console
    sample = run.trainer.parts.find(Console).sample(_gpt(run, run.x), 8)
    assert f"sample:\n{sample}" in run.printed


def test_a_resumed_run_continues_bitwise(run, byte_shards):
    """Stopped at step 4 (a log step: the probe moved to x already), resumed from the checkpoint's x
    and z: the same metrics, final weights, every state tensor and the group scalars as the run
    that did not stop."""
    split = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={run.out}", "--run_name=split"]
    train_here(*split, "--stop_at_step=4")
    assert Checkpoint.load(run.out / "split" / CHECKPOINT_NAME).step == 4
    train_here(*split, "--resume")
    straight, resumed = read_metrics(run.dir), read_metrics(run.out / "split")
    for key in ("train/loss", "val/loss", "max_logit/layer_01", "update_ratio/layer_01/attn_q"):
        values = [r[key] for r in straight if key in r]
        assert values and [r[key] for r in resumed if key in r] == values, key
    a, b = run.checkpoint, Checkpoint.load(run.out / "split" / CHECKPOINT_NAME)
    assert all(torch.equal(a.model[name], b.model[name]) for name in a.model)
    assert a.optimizer["state"].keys() == b.optimizer["state"].keys()
    for x, y in zip(a.optimizer["state"].values(), b.optimizer["state"].values()):
        assert x.keys() == y.keys() == {"z", "exp_avg_sq"} and all(torch.equal(x[k], y[k]) for k in x)
    # (The resumed groups hold torch's "differentiable" too: load_state_dict's __setstate__ adds it.)
    assert [{key: g[key] for key in h} for g, h in zip(b.optimizer["param_groups"], a.optimizer["param_groups"])] \
        == a.optimizer["param_groups"]
    assert [g["k"] for g in b.optimizer["param_groups"]] == [8, 8]


def test_the_hf_export_is_x(run, tmp_path):
    from safetensors.torch import load_file
    from hf import export
    out = export(run.dir / CHECKPOINT_NAME, tmp_path / "hf")
    exported = load_file(out / "model.safetensors")
    for name in ("transformer.wte.weight", "transformer.h.1.mlp.c_fc.weight"):
        weight = exported[name] if name.endswith("wte.weight") else exported[name].t()  # (HF's Conv1D: transposed)
        assert torch.equal(weight, run.x[name]) and not torch.equal(weight, run.y[name]), name


def test_zero_shot_evaluation_of_the_checkpoint_is_of_x(run, tmp_path, monkeypatch):
    """``python -m eval`` records the sha256 of the weights it evaluated: x's."""
    import datasets
    import huggingface_hub
    import eval.__main__ as cli
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    bars = datasets.is_progress_bar_enabled(), not huggingface_hub.utils.are_progress_bars_disabled()
    try:
        with redirect_stdout(io.StringIO()):
            cli.main(["--ckpt", str(run.dir / CHECKPOINT_NAME), "--tasks", "lambada_openai", "--samples", "--limit",
                      "1", "--out", str(tmp_path / "results.json")])
    finally:  # (it turns the progress bars off)
        if bars[0]:
            datasets.enable_progress_bars()
        if bars[1]:
            huggingface_hub.utils.enable_progress_bars()
    evaluated = json.loads((tmp_path / "results.json").read_text())["model_sha256"]
    assert evaluated == cli.model_sha256(_gpt(run, run.x)) != cli.model_sha256(_gpt(run, run.y))


@pytest.mark.slow  # `python -m scripts.hessian`, a process of its own (tests import no script)
def test_the_hessian_tool_differentiates_at_x(run, byte_shards, tmp_path):
    """The CLI's eigenvalue and trace are study/hessian.py's at x, computed here on the same batch
    with the same seed, and not at y."""
    import functools
    import os
    import subprocess
    import sys
    from helpers import ROOT
    from study.hessian import batch_loss, hutchinson_trace, top_eigenvalue, validation_batches
    out = tmp_path / "hessian.json"
    result = subprocess.run([sys.executable, "-m", "scripts.hessian", str(run.dir / CHECKPOINT_NAME), "--batches=1",
                             "--batch-size=1", "--samples=2", "--max-iter=3", f"--out={out}"], capture_output=True,
                            text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    cli = json.loads(out.read_text())
    (x, y), = validation_batches(run.checkpoint.config, byte_shards, 1, 1, 32)

    def measures(weights):
        model = _gpt(run, weights).eval()
        params, generator = list(model.parameters()), torch.Generator().manual_seed(0)
        loss_fns = [functools.partial(batch_loss, model, x, y)]
        eigenvalue = top_eigenvalue(loss_fns, params, 1e-4, 3, generator)[0]
        return eigenvalue, hutchinson_trace(loss_fns, params, 2, generator)[0]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (the CLI's)
    try:
        at_x, at_y = measures(run.x), measures(run.y)
    finally:
        torch.set_num_threads(threads)
    assert (cli["top_eigenvalue"], cli["trace"]) == pytest.approx(at_x, rel=1e-6)
    assert (cli["top_eigenvalue"], cli["trace"]) != pytest.approx(at_y, rel=1e-3)


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_a_decaying_lr_schedule_is_refused_naming_the_fix(schedule):
    config = load_config(None, ["--optimizer=adamw_schedulefree", "--max_steps=10", f"--lr_schedule={schedule}"])
    with pytest.raises(ConfigError, match=f"no decaying lr_schedule \\('{schedule}'\\): set lr_schedule='constant'"):
        resolve_config(config)
    with pytest.raises(ConfigError, match="use 'cosine', 'wsd' or 'constant'"):
        load_config(None, ["--lr_schedule=linear", "--max_steps=10"])
    resolved = resolve_config(load_config(None, ["--optimizer=adamw_schedulefree", "--max_steps=10",
                                                 "--lr_schedule=constant"]))
    assert resolved.config.beta2 == 0.9999 and resolved.config.optimizer_options == {"r": 0.0, "weight_lr_power": 2.0}
