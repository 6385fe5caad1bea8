"""What optim/base.py keeps of each parameter from step to step (its plan: whether it is whole,
its row sharding, the backend each ``implementation`` call chose): a step of a kept plan is
bitwise the step of a fresh optimizer in the same state, and the plans follow whatever can change
them: another gradient layout, a tensor put in a parameter's place (as FSDP2's fully_shard does),
a group added, a state loaded."""
import copy
import gc
import weakref
from collections import defaultdict

import pytest
import torch

import optim
from optim import backends
from optim.merit import MERIT


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=gen)) for shape in ((6, 5), (7,), (3, 40))]


def _grads(params, step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen) for p in params]


def _step(opt, params, grads) -> None:
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()


def _fresh_twin(opt, params):
    """A copy of ``opt`` and of its parameters ``params``, with no plans (pickling keeps none)."""
    twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin_of = {id(p): q for p, q in zip(params, twin_params)}
    twin = copy.deepcopy(opt)
    for group, twin_group in zip(opt.param_groups, twin.param_groups):
        twin_group["params"] = [twin_of[id(p)] for p in group["params"]]
    twin.state = defaultdict(dict, {twin_of[id(p)]: copy.deepcopy(state) for p, state in opt.state.items()})
    assert not twin._plans
    return twin, twin_params


def _assert_same(params_a, opt_a, params_b, opt_b) -> None:
    for p, q in zip(params_a, params_b):
        assert torch.equal(p, q)
        for key, value in opt_a.state[p].items():
            assert torch.equal(value, opt_b.state[q][key]), key


# The optimizers of the fused operations, with what their build needs (AdEMAMix: its warmups' length).
OPTIONS = {"merit": {}, "lamb": {}, "lion": {}, "ademamix": {"run_steps": 10}, "adamw_schedulefree": {}}


@pytest.mark.parametrize("name", OPTIONS)
def test_a_planned_step_is_the_fresh_optimizer_s_step(name, backend):
    params = _params()
    opt = optim.build(name, params, lr=0.01, backend=backend, **OPTIONS[name])
    for step in range(3):
        _step(opt, params, _grads(params, step))
        twin, twin_params = _fresh_twin(opt, params)
        grads = _grads(params, step + 10)
        _step(opt, params, grads)
        _step(twin, twin_params, grads)
        _assert_same(params, opt, twin_params, twin)


def test_a_strided_gradient_after_contiguous_ones_takes_the_backend_it_fits():
    """The C++ kernels take contiguous tensors only: a choice kept from contiguous gradients would
    hand them a strided one (and they would refuse it)."""
    params = _params()
    opt = MERIT(params, lr=0.01, backend="cpp")
    _step(opt, params, _grads(params, 0))
    twin, twin_params = _fresh_twin(opt, params)
    grads = _grads(params, 1)
    grads[2] = grads[2].t().contiguous().t()  # the same values, strided
    assert not grads[2].is_contiguous() and not backends.cpp.takes([params[2], grads[2]])
    _step(opt, params, grads)
    _step(twin, twin_params, grads)
    _assert_same(params, opt, twin_params, twin)


def test_a_tensor_put_in_a_parameter_s_place_is_planned_for():
    params = _params()
    opt = MERIT(params, lr=0.01)
    _step(opt, params, _grads(params, 0))
    replacement = torch.nn.Parameter(params[0].detach().clone().double())
    opt.param_groups[0]["params"][0] = replacement
    opt.state[replacement] = {key: value.double() if key != "step" else value
                              for key, value in opt.state.pop(params[0]).items()}
    params[0] = replacement
    twin, twin_params = _fresh_twin(opt, params)
    grads = [g.to(p.dtype) for g, p in zip(_grads(params, 1), params)]
    _step(opt, params, grads)
    _step(twin, twin_params, grads)
    _assert_same(params, opt, twin_params, twin)
    assert all(plan.param is p for plan, p in zip(opt._plans[0], params))


def test_a_group_added_is_stepped():
    first, second = _params(0), _params(1)
    opt = MERIT(first, lr=0.01)
    _step(opt, first, _grads(first, 0))
    opt.add_param_group({"params": second, "lr": 0.02})
    before = [p.detach().clone() for p in second]
    for p, g in zip(first + second, _grads(first + second, 1)):
        p.grad = g
    opt.step()
    assert all(not torch.equal(p, b) for p, b in zip(second, before))
    assert [len(plans) for plans in opt._plans] == [3, 3]


def test_a_loaded_state_lets_go_of_the_state_it_replaces():
    params = _params()
    opt = MERIT(params, lr=0.01)
    _step(opt, params, _grads(params, 0))
    saved = copy.deepcopy(opt.state_dict())
    _step(opt, params, _grads(params, 1))
    old = weakref.ref(opt.state[params[0]]["exp_avg"])
    twin, twin_params = _fresh_twin(opt, params)
    opt.load_state_dict(copy.deepcopy(saved))
    twin.load_state_dict(copy.deepcopy(saved))  # (load_state_dict keeps the tensors it is given)
    gc.collect()
    assert old() is None  # not kept alive by a plan's choices
    grads = _grads(params, 2)
    _step(opt, params, grads)
    _step(twin, twin_params, grads)
    _assert_same(params, opt, twin_params, twin)


class _Copying(MERIT):
    """A MERIT whose update hands implementation() a new tensor every step (a copy of m)."""

    def implementation(self, group, p, *tensors, shards=None):
        return super().implementation(group, p, *(t.clone() for t in tensors[:1]), *tensors[1:], shards=shards)


def test_choices_of_new_tensors_every_step_do_not_pile_up():
    params = _params()
    opt = _Copying(params, lr=0.01)
    for step in range(10):
        _step(opt, params, _grads(params, step))
    assert max(len(plan.backends) for plan in opt._plans[0]) <= 4
