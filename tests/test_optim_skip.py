"""Dropping a step on the device: torch's ``found_inf`` flag (``step_unless``, the GradScaler
protocol) through every optimizer and backend of the fused operations. A flagged step leaves
parameters and state (step counters included) bitwise as they were, without reading the flag on
the host where the backend runs on the device; an unflagged one is bitwise the plain step."""
import copy
from contextlib import nullcontext

import pytest
import torch

import optim
from helpers import no_host_reads

# Each optimizer with what exercises its operations: MERIT's row/column path and its tensor path,
# LAMB with its step-counting bias correction, Lion, Sophia-G (with a Hessian estimate), Muon (its
# matrices orthogonalised, its AdamW part on the vector).
CASES = {
    "merit": {"weight_decay": 0.1},
    "maxlamb": {"weight_decay": 0.1, "maxlamb": True},
    "lamb_bias_correction": {"weight_decay": 0.1, "bias_correction": True},
    "lion": {"weight_decay": 0.1},
    "sophiag": {"weight_decay": 0.1, "batch_tokens": 64},
    "ademamix": {"weight_decay": 0.1, "run_steps": 10},  # (its warmups over 10 steps: under way)
    "adamw": {"weight_decay": 0.1},
    "muon": {"weight_decay": 0.1},
    "mars": {"weight_decay": 0.1},  # (MARS on the matrices, its AdamW part on the vector)
    "adamw_schedulefree": {"weight_decay": 0.1},
    "soap": {"weight_decay": 0.1, "precondition_frequency": 3},  # (the flagged step's t = 3: a refresh)
    "sgd": {"weight_decay": 0.1, "momentum": 0.9},  # (torch's SGD, a momentum buffer)
    "adafactor": {"min_dim_size_to_factor": 5},  # (6 x 5 factored, 3 x 40 and the vector not; no weight decay)
}


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=gen)) for shape in ((6, 5), (7,), (3, 40))]


def _optimizer(case: str, params, backend: str):
    options = dict(CASES[case])
    name = {"lamb_bias_correction": "lamb", "maxlamb": "merit"}.get(case, case)
    if name in ("adamw", "muon"):
        backend = "auto"  # torch's own kernels
    if name in ("muon", "mars"):  # (which tensors are the hidden matrices, as the shared builder marks them)
        params = [{"params": [p for p in params if p.ndim == 2], "hidden_matrix": True},
                  {"params": [p for p in params if p.ndim != 2], "hidden_matrix": False}]
    return optim.build(name, params, lr=0.01, backend=backend, **options)


def _set_grads(params, step: int, poison: bool = False):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
        if poison:
            p.grad.view(-1)[0] = float("nan")


def _snapshot(params, opt):
    return [p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()["state"])


def _assert_same(a, b):
    (params_a, state_a), (params_b, state_b) = a, b
    assert all(torch.equal(x, y) for x, y in zip(params_a, params_b))
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert state_a[key].keys() == state_b[key].keys()
        for name in state_a[key]:
            assert torch.equal(state_a[key][name].cpu(), state_b[key][name].cpu()), (key, name)


@pytest.mark.parametrize("case", CASES)
def test_a_flagged_step_changes_nothing_and_an_unflagged_one_is_the_plain_step(case, backend):
    if case in ("adamw", "muon", "soap") and backend != "torch":
        pytest.skip(f"{case} runs torch's kernels whatever the backend")
    params, twin = _params(), _params()
    opt, plain = _optimizer(case, params, backend), _optimizer(case, twin, backend)
    if case == "sophiag":
        for o, ps in ((opt, params), (plain, twin)):
            _set_grads(ps, -1)
            o.update_hessian()
    for step in range(3):
        for o, ps in ((opt, params), (plain, twin)):
            _set_grads(ps, step)
        opt.step_unless(torch.tensor(False))
        plain.step()
        _assert_same(_snapshot(params, opt), _snapshot(twin, plain))
    before = _snapshot(params, opt)
    _set_grads(params, 3, poison=True)
    # The C++ kernels and torch's CPU AdamW read a CPU flag on the host (it costs nothing there);
    # LAMB's bias correction, AdEMAMix's schedules and Adafactor's decay read their step counter;
    # Schedule-Free's step count and weight sum are the host's, so it reads the flag there; so does
    # SOAP, whose eigenbasis refresh every precondition_frequency kept steps is a host decision.
    on_device = backend != "cpp" and case not in ("adamw", "lamb_bias_correction", "ademamix", "adamw_schedulefree",
                                                  "soap", "adafactor")
    with no_host_reads() if on_device else nullcontext():
        opt.step_unless(torch.tensor(True))
    _assert_same(_snapshot(params, opt), before)
    for o, ps in ((opt, params), (plain, twin)):
        _set_grads(ps, 4)
    opt.step_unless(torch.tensor(0.0))
    plain.step()
    _assert_same(_snapshot(params, opt), _snapshot(twin, plain))
    if "step" in before[1][0]:
        assert all(s["step"].item() == 4 for s in opt.state.values())  # the flagged step did not count


def test_the_flag_is_torch_grad_scalers(backend):
    """GradScaler hands our optimizers its found_inf (no host read of it): an overflowed float16
    gradient drops the step, the scale backs off, the next step goes through."""
    params = _params()
    opt = _optimizer("merit", params, backend)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)

    def backward(step: int, overflow: bool = False):
        opt.zero_grad(set_to_none=True)
        _set_grads(params, step)
        targets = [p.grad for p in params]
        opt.zero_grad(set_to_none=True)
        scaler.scale(sum((p * t).sum() for p, t in zip(params, targets))).backward()
        if overflow:
            params[1].grad[0] = float("inf")
        scaler.unscale_(opt)

    assert opt._step_supports_amp_scaling
    backward(0)
    scaler.step(opt)
    scaler.update()
    before = _snapshot(params, opt)
    backward(1, overflow=True)
    scaler.step(opt)
    scaler.update()
    _assert_same(_snapshot(params, opt), before)
    assert scaler.get_scale() == 2.0 ** 9
    backward(2)
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(params[0], before[0][0])
    scaler.scale(sum(p.sum() for p in params)).backward()
    with pytest.raises(RuntimeError, match="call scaler.unscale_"):
        scaler.step(opt)  # scaled gradients: not this optimizer's to unscale
