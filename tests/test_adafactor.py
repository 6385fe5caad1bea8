"""Adafactor against optax's own transformations composed as Marek et al. compose them
(martin-marek/batch-size, pretraining/optimizer.py: ``scale_by_factored_rms``, ``clip_by_block_rms``,
``scale_by_learning_rate``, ``scale_by_param_block_rms``, applied with ``optax.apply_updates``), in
float64 (jax's x64 mode) and float32, over steps of a changing lr, on matrices either side of
min_dim_size_to_factor 128, on every backend of its fused sweeps (the C++ and Triton kernels, the
torch reference); and the checks of its settings. (Under DDP, ZeRO-1 and FSDP2:
tests/test_sharded.py.)"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import optim
from helpers import BACKENDS_TRITON_SLOW, TINY_RUN, require_backend, train_here
from optim.adafactor import _decay

# Factored: 130 x 140 (rows the shorter side), 150 x 130 (columns), 128 x 128 (a tie: rows, as optax's
# stable argsort); unfactored: 64 x 300 and 300 x 64 (a side below 128), 127 x 200, a vector, a scalar.
SHAPES = [(130, 140), (150, 130), (128, 128), (64, 300), (300, 64), (127, 200), (140,), ()]
FACTORED = {(130, 140), (150, 130), (128, 128)}
STEPS = 8
LRS = [0.01 * (1 + 0.3 * k) for k in range(STEPS)]  # a changing lr, as a schedule's
FLOAT32_EPS = torch.finfo(torch.float32).eps


def problem(dtype: torch.dtype) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Parameters and STEPS gradients: gradients of different sizes per tensor, growing 2x a step on
    every other tensor (Adafactor's normalised update then exceeds rms 1: clipped), and one vector
    of rms 1e-4 (below the param_rms_floor 1e-3)."""
    gen = torch.Generator().manual_seed(0)
    params = [0.05 * torch.randn(shape, generator=gen, dtype=torch.float64) for shape in SHAPES]
    params[SHAPES.index((140,))].mul_(2e-3)
    grads = [[torch.randn(shape, generator=gen, dtype=torch.float64) * 10.0 ** (i % 3 - 1) * (2.0 ** k if i % 2 else 1)
              for i, shape in enumerate(SHAPES)] for k in range(STEPS)]
    return [p.to(dtype) for p in params], [[g.to(dtype) for g in step] for step in grads]


def optax_adafactor(decay_rate: float, lrs: list[float]) -> optax.GradientTransformation:
    """The authors' ``adafactor`` (pretraining/optimizer.py) with optax's ``scale_by_factored_rms``,
    whose state is the parameter's dtype (theirs: float32; the same for float32 and float64 here)."""
    return optax.chain(optax.scale_by_factored_rms(decay_rate=decay_rate, min_dim_size_to_factor=128),
                       optax.clip_by_block_rms(1.0),
                       optax.scale_by_learning_rate(lambda count: jnp.asarray(lrs)[count]),  # -lr: a descent
                       optax.scale_by_param_block_rms())


def run_both(dtype: torch.dtype, decay_rate: float, backend: str = "auto") -> tuple[list[torch.Tensor], ...]:
    """(the initial parameters, ours after STEPS on ``backend``, optax's after STEPS)."""
    params, grads = problem(dtype)
    ours = [torch.nn.Parameter(p.clone()) for p in params]
    opt = optim.build("adafactor", ours, lr=LRS[0], decay_rate=decay_rate, backend=backend)
    assert {key: opt.defaults[key] for key in ("min_dim_size_to_factor", "clipping_threshold", "param_rms_floor")} \
        == {"min_dim_size_to_factor": 128, "clipping_threshold": 1.0, "param_rms_floor": 1e-3}  # (the published)
    theirs = [jnp.asarray(p.numpy()) for p in params]
    tx = optax_adafactor(decay_rate, LRS)
    state, update = tx.init(theirs), jax.jit(tx.update)  # (one compilation for every step)
    for k in range(STEPS):
        for p, g in zip(ours, grads[k]):
            p.grad = g.clone()
        opt.param_groups[0]["lr"] = LRS[k]
        opt.step()
        updates, state = update([jnp.asarray(g.numpy()) for g in grads[k]], state, theirs)
        theirs = optax.apply_updates(theirs, updates)
    assert all(t.dtype == {torch.float32: np.float32, torch.float64: np.float64}[dtype] for t in theirs)
    return params, [p.detach() for p in ours], [torch.from_numpy(np.array(t)) for t in theirs]


def test_the_problem_clips_some_updates_and_floors_a_parameter_s_rms():
    """Both regimes this file compares are reached: optax's factored update exceeds block rms 1 for
    some tensors and steps (clipped) and not for others, and one parameter's rms is below 1e-3."""
    params, grads = problem(torch.float64)
    with jax.enable_x64(True):
        tx = optax.scale_by_factored_rms(decay_rate=0.8, min_dim_size_to_factor=128)
        state, update = tx.init([jnp.asarray(p.numpy()) for p in params]), jax.jit(tx.update)
        rms = []
        for step in grads:
            updates, state = update([jnp.asarray(g.numpy()) for g in step], state,
                                       [jnp.asarray(p.numpy()) for p in params])
            rms += [float(jnp.sqrt(jnp.mean(u * u))) for u in updates]
    assert max(rms) > 1.5 and min(rms) < 1.0
    assert sorted(p.square().mean().sqrt().item() < 1e-3 for p in params) == [False] * (len(SHAPES) - 1) + [True]


# decay_rate: optax's default and the authors' GPT-2 value. The quick tier runs the C++ kernels (what a
# CPU runs); the full suite the reference too, and the Triton kernels at the authors' setting only:
# its interpreter takes about 10 s a case, and tests/test_sgd_adafactor_kernels.py holds them to the
# reference elsewhere, which these cases hold to optax.
OPTAX_CASES = [
    *(pytest.param(dtype, decay_rate, backend, marks=[pytest.mark.slow] if backend == "torch" else [])
      for dtype in (torch.float64, torch.float32) for decay_rate in (0.8, 0.9999) for backend in ("cpp", "torch")),
    pytest.param(torch.float32, 0.9999, "triton", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("dtype,decay_rate,backend_name", OPTAX_CASES)
def test_adafactor_is_optax_composed_as_the_authors_compose_it(dtype, decay_rate, backend_name):
    backend = require_backend(backend_name)
    with jax.enable_x64(dtype == torch.float64):
        initial, ours, theirs = run_both(dtype, decay_rate, backend)
    for p0, p, q, shape in zip(initial, ours, theirs, SHAPES):
        moved = (q.double() - p0.double()).abs().max().item()
        assert moved > 1e-4 * p0.abs().max().item(), shape  # every parameter moved, the floored one too
        # Float32's rounding of the parameters: within 2 roundings of the largest element, in either
        # dtype (float32: the runs round p differently; float64: optax's beta2_t, a float32 from XLA's
        # float32 pow, is one float32 ulp from ours, float64's value rounded, at some steps).
        error = (p.double() - q.double()).abs().max().item()
        assert error <= 2 * FLOAT32_EPS * q.abs().max().item(), (shape, error)
        if dtype == torch.float64:  # and in float64, the steps themselves agree to float32's rounding
            assert error <= 4 * FLOAT32_EPS * moved, (shape, error / moved)


def test_with_optax_s_own_beta2_the_float64_steps_agree_to_float64_s_rounding(monkeypatch):
    """The one difference above is beta2_t's float32 rounding: given XLA's values of it, every other
    operation of the composition agrees to float64's rounding."""
    from optax._src.factorized import _decay_rate_pow

    def xla_decay(step: int, decay_rate: float) -> tuple[float, float]:
        beta = np.float32(_decay_rate_pow(jnp.asarray(step - 1, jnp.int32), decay_rate))
        return float(beta), float(np.float32(1.0) - beta)

    monkeypatch.setattr(optim.adafactor, "_decay", xla_decay)
    with jax.enable_x64(True):
        initial, ours, theirs = run_both(torch.float64, 0.8)
    for p0, p, q, shape in zip(initial, ours, theirs, SHAPES):
        moved = (q - p0).abs().max().item()
        assert (p - q).abs().max().item() <= 1e-13 * moved, shape


def test_the_state_is_factored_where_optax_factors_it_and_float32_for_bfloat16():
    params = [torch.nn.Parameter(torch.ones(shape, dtype=torch.bfloat16)) for shape in SHAPES]
    opt = optim.build("adafactor", params, lr=0.01)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    for p, shape in zip(params, SHAPES):
        state = opt.state[p]
        if shape in FACTORED:
            assert {k: tuple(v.shape) for k, v in state.items() if k != "step"} == {
                "exp_avg_sq_row": (shape[0],), "exp_avg_sq_col": (shape[1],)}
        else:
            assert state.keys() == {"step", "exp_avg_sq"} and state["exp_avg_sq"].shape == p.shape
        assert all(v.dtype == torch.float32 for v in state.values()) and state["step"].item() == 1


def test_a_bfloat16_parameter_steps_as_its_float32_copy_rounded_once():
    """The update is computed in float32 from the upcast gradient and added in float32, then rounded to
    bfloat16 (the authors' apply_updates without stochastic rounding): bitwise the float32 copy's step."""
    params, grads = problem(torch.bfloat16)
    half = [torch.nn.Parameter(p.clone()) for p in params]
    full = [torch.nn.Parameter(p.float()) for p in params]
    opts = [optim.build("adafactor", ps, lr=0.05, decay_rate=0.9999) for ps in (half, full)]
    for step in grads:
        for ps in (half, full):
            for p, g in zip(ps, step):
                p.grad = g.clone() if ps is half else g.float()
        for opt in opts:
            opt.step()
        for h, f in zip(half, full):
            assert torch.equal(h.detach(), f.detach().to(torch.bfloat16))
            f.data.copy_(h.detach())  # the float32 copy continues from the bfloat16 values
    assert not torch.equal(half[0].detach(), params[0])


def test_beta2_is_optax_s_schedule_rounded_to_float32():
    """beta2_t = 1 - t ** -decay_rate at t = 1, 2, ... (1-based: no averaging at the first step), a
    float32; against XLA's float32 computation, one float32 ulp at most."""
    assert _decay(1, 0.8) == (0.0, 1.0)
    with jax.enable_x64(True):
        from optax._src.factorized import _decay_rate_pow  # optax's schedule (the count is 0-based)
        for decay_rate in (0.8, 0.9999, 1.0):
            for t in (1, 2, 3, 4, 5, 10, 1000, 123_457):
                theirs = float(_decay_rate_pow(jnp.asarray(t - 1, jnp.int32), decay_rate))
                beta, one_minus_beta = _decay(t, decay_rate)
                assert abs(beta - theirs) <= FLOAT32_EPS / 2 and beta == np.float32(beta)
                assert one_minus_beta == np.float32(1.0) - np.float32(beta)


@pytest.mark.parametrize("shape", [(130, 140), (64, 30)])  # factored, and not
@pytest.mark.parametrize("backend_name", BACKENDS_TRITON_SLOW)
def test_a_flagged_step_is_dropped_on_the_device(backend_name, shape):
    """The fused operations take the flag: a flagged step changes nothing (p, its statistics, its
    step count), so the next step is the first, as a twin's that never saw the flag."""
    backend = require_backend(backend_name)
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape, generator=gen))
    twin = torch.nn.Parameter(p.detach().clone())
    opt, twin_opt = (optim.build("adafactor", [q], lr=0.01, backend=backend) for q in (p, twin))
    assert opt._step_supports_amp_scaling
    p.grad = torch.randn(shape, generator=gen)
    twin.grad = p.grad.clone()
    before = p.detach().clone()
    opt.step_unless(torch.tensor(True))
    assert torch.equal(p.detach(), before) and opt.state[p]["step"].item() == 0
    assert all(not t.any() for key, t in opt.state[p].items())  # (the statistics still zero)
    opt.step_unless(torch.tensor(False))
    twin_opt.step()
    assert torch.equal(p.detach(), twin.detach()) and not torch.equal(p.detach(), before)
    assert opt.state[p]["step"].item() == 1


def test_weight_decay_is_refused_and_the_options_are_checked():
    p = torch.nn.Parameter(torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"Invalid weight_decay value: 0.1: Adafactor as Marek et al. run it has no "
                                         r"weight decay; set weight_decay 0"):
        optim.build("adafactor", [p], lr=0.01, weight_decay=0.1)
    with pytest.raises(ValueError, match="Invalid weight_decay value: 0.1"):  # a group's own too
        optim.Adafactor([{"params": [p], "weight_decay": 0.1}], lr=0.01)
    for option, bad, words in [("decay_rate", 0.0, r"must be in \(0, 1\]"), ("decay_rate", 1.5, r"must be in \(0, 1\]"),
                               ("decay_rate", float("nan"), r"must be in \(0, 1\]"),
                               ("min_dim_size_to_factor", 0, "an int >= 1"),
                               ("clipping_threshold", 0.0, "must be > 0, or None"),
                               ("param_rms_floor", -1e-3, "must be >= 0")]:
        with pytest.raises(ValueError, match=f"Invalid {option}: .*{words}"):
            optim.Adafactor([p], lr=0.01, **{option: bad})
    with pytest.raises(ValueError, match=r"Invalid learning rate: -1"):
        optim.Adafactor([p], lr=-1.0)
    with pytest.raises(ValueError, match=r"scalars, vectors and matrices, got a torch.float32 parameter of shape "
                                         r"\(2, 3, 4\)"):
        optim.Adafactor([torch.nn.Parameter(torch.ones(2, 3, 4))], lr=0.01)
    # clipping_threshold None: no clipping (the authors' option), a step of lr x rms(p) x u.
    q = torch.nn.Parameter(torch.full((2, 2), 2.0))
    opt = optim.Adafactor([q], lr=0.5, clipping_threshold=None, param_rms_floor=0.0)
    q.grad = torch.tensor([[1.0, -4.0], [2.0, 0.5]])
    opt.step()  # first step: beta2 0, u = g / sqrt(g^2 + 1e-30) = sign(g); rms(p) = 2
    assert torch.equal(q.detach(), torch.tensor([[1.0, 3.0], [1.0, 1.0]]))


def test_through_train_py_a_weight_decay_is_one_line_before_anything_is_written(byte_shards, tmp_path):
    out = tmp_path / "out"
    result = train_here(*TINY_RUN, "--batch_size=2", "--micro_batch_size=2", "--max_steps=2", "--optimizer=adafactor",
                        "--lr=0.01", "--weight_decay=0.1", f"--data_dir={byte_shards}", f"--out_dir={out}", check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("train.py: "), result.stderr
    assert "Adafactor as Marek et al. run it has no weight decay; set weight_decay 0" in lines[0]
    assert not out.exists()


def test_it_declares_no_decay_that_follows_the_batch():
    # decay_rate is an exponent of the step count (beta2_t = 1 - t ** -decay_rate), no per-step decay.
    assert optim.Adafactor.BATCH_DECAYS == {}
