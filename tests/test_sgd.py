"""SGD is torch's ``torch.optim.SGD``, bitwise, in every dtype, with and without momentum and weight
decay, built by name from a model's groups, on every backend of its fused step (float16: the torch
reference on each; in bfloat16 the kernels are torch's vectorised loop, whose scalar tails round
otherwise: within bfloat16's rounding there); its settings are checked. (Under DDP, ZeRO-1 and FSDP2:
tests/test_sharded.py; resumed: tests/test_train.py.)"""
import copy

import pytest
import torch
from torch import nn

import optim
from helpers import BACKENDS_TRITON_SLOW, bitwise_but_in_bfloat16, require_backend

LRS = [0.2, 0.15, 0.3, 0.05, 0.1]  # a changing lr, as a schedule's


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.fc = nn.Linear(6, 7)
        self.ln = nn.LayerNorm(7)

    def forward(self, idx):
        return self.ln(self.fc(self.emb(idx))).square().mean()


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float16])
@pytest.mark.parametrize("backend_name", BACKENDS_TRITON_SLOW)
def test_sgd_is_torch_sgd_bitwise(dtype, momentum, weight_decay, backend_name):
    backend = require_backend(backend_name)
    if dtype == torch.float16 and backend != "torch":
        pytest.skip("no kernel takes float16: its case is the torch reference's")
    torch.manual_seed(0)
    model = Tiny().to(dtype)
    twin, start = copy.deepcopy(model), copy.deepcopy(model)
    ours = optim.build("sgd", model, lr=LRS[0], momentum=momentum, weight_decay=weight_decay, backend=backend)
    # The shared builder's groups (decay on the hidden matrices only), given to torch's SGD in the same order.
    assert [sorted(group["names"]) for group in ours.param_groups] == [
        ["fc.weight"], ["emb.weight", "fc.bias", "ln.bias", "ln.weight"]]
    by_name = dict(twin.named_parameters())
    reference = torch.optim.SGD([{"params": [by_name[n] for n in group["names"]], "weight_decay": group["weight_decay"]}
                                 for group in ours.param_groups], lr=LRS[0], momentum=momentum)
    assert [group["weight_decay"] for group in ours.param_groups] == [weight_decay, 0.0]
    same = bitwise_but_in_bfloat16(dtype if backend != "torch" else torch.float32)
    pairs = list(zip(model.parameters(), twin.parameters()))
    gen = torch.Generator().manual_seed(1)
    for lr in LRS:
        idx = torch.randint(11, (4, 5), generator=gen)
        for m, opt in ((model, ours), (twin, reference)):
            for group in opt.param_groups:
                group["lr"] = lr
            m(idx).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for (p, q), name in zip(pairs, dict(model.named_parameters())):
            same(p, q, (name, lr))
            assert ours.state[p].keys() == reference.state[q].keys() == ({"momentum_buffer"} if momentum else set())
            if momentum:
                same(ours.state[p]["momentum_buffer"], reference.state[q]["momentum_buffer"], (name, lr))
            if dtype == torch.bfloat16:  # (each step from the same state: a rounding apart does not feed the next)
                with torch.no_grad():
                    q.copy_(p)
                    if momentum:
                        reference.state[q]["momentum_buffer"].copy_(ours.state[p]["momentum_buffer"])
    for p, p0 in zip(model.parameters(), start.parameters()):
        assert not torch.equal(p, p0)


def test_sgd_s_settings_are_checked_and_it_speaks_the_loop_protocol():
    p = nn.Parameter(torch.ones(3))
    for kwargs, words in [({"momentum": 1.0}, r"Invalid momentum value: 1.0 \(must be in \[0, 1\)\)"),
                          ({"momentum": -0.1}, r"Invalid momentum value: -0.1"),
                          ({"lr": float("nan")}, r"Invalid learning rate: nan"),
                          ({"weight_decay": -1.0}, r"Invalid weight_decay value: -1.0")]:
        with pytest.raises(ValueError, match=words):
            optim.SGD([p], **{"lr": 0.1, **kwargs})
    with pytest.raises(ValueError, match=r"Invalid momentum value: 1.5"):  # a group's own too
        optim.SGD([{"params": [p], "momentum": 1.5}], lr=0.1)
    opt = optim.build("sgd", [p], lr=0.1, momentum=0.9, backend="torch")
    assert isinstance(opt, optim.TrainingHooks) and opt.backends() == {"group0": "torch"}
    assert opt._step_supports_amp_scaling  # (the fused step takes the flag)
    p.grad = torch.ones_like(p)
    opt.step_unless(torch.tensor(True))  # dropped on the device: p and the buffer kept
    assert torch.equal(p.detach(), torch.ones(3)) and torch.equal(opt.state[p]["momentum_buffer"], torch.zeros(3))
    opt.step_unless(torch.tensor(False))
    assert torch.equal(p.detach(), torch.full((3,), 0.9)) and torch.equal(opt.state[p]["momentum_buffer"], p.grad)
    # The published settings (Marek et al.'s): no momentum, no weight decay.
    assert optim.settings("sgd", lr=0.2).kwargs == {"lr": 0.2, "weight_decay": 0.0, "momentum": 0.0}
    assert optim.SGD.BATCH_DECAYS == {"momentum": ("momentum", None)}
    assert opt.param_groups[0]["momentum"] == 0.9  # (the key BATCH_DECAYS names)
