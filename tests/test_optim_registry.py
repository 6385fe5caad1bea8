"""The optimizer boundary: a new optimizer is one class and one registry line, the backends
implement one signature per fused operation, and optim_backend reaches the run's records."""
import inspect

import pytest
import torch
from torch import nn

import optim
from configs import ConfigError, load_config
from helpers import ROOT, TINY_RUN, read_metrics, train_here
from optim import backends
from optim.backends import cpp, reference, triton
from train import Trainer
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.run_config import resolve_config

RUN = [*TINY_RUN, "--log_interval=1", "--batch_size=2", "--micro_batch_size=2"]


class Signum(optim.Optimizer):
    """Signum (Bernstein et al., 2018): m = b1*m + (1-b1)*g; p = p * (1 - lr*wd) - lr * sign(m).
    Diagnostic: the fraction of positive momentum signs. ``betas[1]`` is not used."""

    USES_FUSED_OPERATIONS = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.0),
                 weight_decay: float = 0.0, *, backend: str = "auto"):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay}, backend=backend)

    def init_state(self, p: torch.Tensor) -> dict:
        return {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p)}

    def update(self, p: torch.Tensor, grad: torch.Tensor, state: dict, group: dict, index: int,
               skip: torch.Tensor | None, shards) -> None:
        m = state["exp_avg"].lerp_(grad, 1 - group["betas"][0])
        p.mul_(1 - group["lr"] * group["weight_decay"]).add_(m.sign(), alpha=-group["lr"])
        if self.diagnostics_requested:
            self.record_diagnostics(group, index, positive_fraction=(m > 0).float().mean())


def test_a_new_optimizer_steps_by_its_rule_with_the_base_class_checks():
    p = nn.Parameter(torch.tensor([[1.0, -2.0], [0.5, 0.0]], dtype=torch.float64))
    opt = Signum([p], lr=0.1, betas=(0.5, 0.0), weight_decay=0.5)
    for g in ([[3.0, -1.0], [0.0, -2.0]], [[-1.0, -1.0], [1.0, 1.0]]):
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.request_diagnostics()
        opt.step()
    # Hand-computed: m = [[1.5, -0.5], [0, -1]] then [[0.25, -0.75], [0.5, 0]]; decay 0.95 per step.
    expected = [[(1.0 * 0.95 - 0.1) * 0.95 - 0.1, (-2.0 * 0.95 + 0.1) * 0.95 + 0.1],
                [0.5 * 0.95 * 0.95 - 0.1, 0.1 * 0.95]]
    torch.testing.assert_close(p.detach(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)
    assert opt.pop_diagnostics() == {"positive_fraction/group0.0": 0.5}
    assert opt.state[p]["step"].item() == 2 and opt.backends() == {"group0": "torch"}
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        Signum([p], lr=-1)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 0: 1.5"):
        Signum([{"params": [p], "betas": (1.5, 0.0)}])


def test_a_new_optimizer_trains_through_train_py_by_name(byte_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(optim, "_REGISTRY", dict(optim._REGISTRY))  # the registration ends with the test
    monkeypatch.setattr(optim.published, "GPT2", dict(optim.published.GPT2))
    optim.register("signum", Signum)
    with pytest.raises(ValueError, match="already registered"):
        optim.register("Signum", Signum)
    config = load_config(None, [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}",
                                "--optimizer=signum", "--max_steps=3", "--lr=0.01", "--min_lr=0.001"])
    trainer = Trainer(resolve_config(config))
    # No published settings: its own defaults, never another optimizer's.
    assert isinstance(trainer.optimizer, Signum) and trainer.optimizer.defaults["betas"] == (0.9, 0.0)
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    try:
        trainer.train()
    finally:
        trainer.close()
    saved = Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME)
    assert saved.step == 3 and saved.config["optimizer"] == "signum" and saved.optim_backends == {
        "group0": "torch", "group1": "torch"}
    assert all(state["step"].item() == 3 for state in saved.optimizer["state"].values())
    # Sign steps of the scheduled lr (warmup 0: 0.01, then cosine) move every weight by at most their sum.
    moved = max((saved.model[name] - p).abs().max().item() for name, p in start.items())
    assert 0 < moved <= 3 * 0.01 + 1e-6
    steps = [r for r in read_metrics(tmp_path / "default") if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(0 <= r["positive_fraction/transformer.h.0.attn.c_attn.weight"] <= 1 for r in steps)


def test_a_registered_optimizer_must_speak_the_loop_protocol(monkeypatch):
    monkeypatch.setattr(optim, "_REGISTRY", dict(optim._REGISTRY))
    monkeypatch.setattr(optim.published, "GPT2", dict(optim.published.GPT2))
    optim.register("plain_sgd", lambda params, *, lr, weight_decay, backend: torch.optim.SGD(params, lr=lr))
    with pytest.raises(TypeError, match="builds a SGD, which does not implement optim.TrainingHooks"):
        optim.build("plain_sgd", [nn.Parameter(torch.ones(2))], lr=0.1, weight_decay=0.0)


def test_every_backend_implements_each_fused_operation_with_the_declared_signature():
    for name in ("moments_and_ratios", "apply_update", "lion_step", "sophia_step"):
        declared = inspect.signature(getattr(backends.Backend, name), eval_str=True)
        declared = declared.replace(parameters=list(declared.parameters.values())[1:])  # without self
        for module in (reference, cpp, triton):
            assert inspect.signature(getattr(module, name), eval_str=True) == declared, (module.NAME, name)
    assert {module.NAME for module in backends.BY_NAME.values()} == {"torch", "cpp", "triton"}


def test_select_is_per_set_of_tensors(monkeypatch):
    pytest.importorskip("triton")
    assert cpp.load(required=False), "the C++ kernels build here"
    matrix, cube, half = torch.zeros(4, 3), torch.zeros(2, 3, 4), torch.zeros(4, 3, dtype=torch.float16)
    assert backends.select("auto", [matrix], matrix=True) is cpp
    assert backends.select("auto", [cube], matrix=True) is reference  # rows/columns of a 2-D p only
    assert backends.select("auto", [half]) is reference  # a dtype the kernels do not take
    assert backends.select("auto", [matrix, matrix.t()]) is reference  # a non-contiguous tensor
    assert backends.select("torch", [matrix]) is reference
    assert backends.select("auto", [matrix]) is not triton  # "auto" never picks the interpreter
    triton.load(required=True)
    assert backends.select("triton", [matrix]) is triton  # in Triton's interpreter (TRITON_INTERPRET=1)


def test_describe_names_the_backend_of_each_group():
    opt = optim.MERIT([{"params": [nn.Parameter(torch.ones(4, 3)), nn.Parameter(torch.ones(2, 3, 4))]},
                       {"params": [nn.Parameter(torch.ones(5))], "weight_decay": 0.1}], lr=0.1, backend="cpp")
    assert opt.backends() == {"group0": "cpp x1, torch x1", "group1": "cpp"}
    assert opt.describe().splitlines() == ["  group0: 2 tensors, 0.00M elements, weight_decay 0.0: cpp x1, torch x1",
                                           "  group1: 1 tensors, 0.00M elements, weight_decay 0.1: cpp"]
    adamw = optim.build("adamw", [nn.Parameter(torch.ones(3))], lr=0.1)
    assert adamw.backends() == {"group0": "torch (fused)"}


def test_bad_backend_settings_are_clear_errors():
    p = nn.Parameter(torch.ones(3, 2))
    with pytest.raises(ValueError, match="optim_backend='gpu': use one of 'auto', 'torch', 'cpp', 'triton'"):
        optim.MERIT([p], backend="gpu")
    with pytest.raises(ValueError, match="optim_backend='cpp' takes none of these parameters.*float32, bfloat16"):
        optim.Lion([nn.Parameter(torch.ones(3, dtype=torch.float16))], backend="cpp")
    with pytest.raises(ValueError, match="does not apply to AdamW"):
        optim.build("adamw", [p], lr=0.1, backend="cpp")
    with pytest.raises(ConfigError, match="optim_backend='gpu': use one of 'auto', 'torch', 'cpp', 'triton'"):
        resolve_config(load_config(None, ["--optim_backend=gpu", "--max_steps=1"]))


def test_optim_backend_reaches_the_summary_the_metrics_and_the_checkpoint(byte_shards, tmp_path):
    result = train_here(*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--max_steps=2",
                        "--optimizer=lion", "--optim_backend=torch")
    assert "optimizer implementation (optim_backend 'torch')" in result.stdout
    assert "weight_decay 1.0: torch" in result.stdout  # Lion's published weight decay
    saved = Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME)
    assert saved.optim_backends == {"group0": "torch", "group1": "torch"} and saved.config["optim_backend"] == "torch"
    first = read_metrics(tmp_path / "default")[0]
    assert first == {"run_info": {"optim_backend": "torch", "group0": "torch", "group1": "torch"}}
