"""GPT-2's tanh GELU through kernels/csrc/gelu.cpp, against the function written out in float64."""
import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernels
from model import GPT, GPTConfig, TanhGELU

ROOT = Path(__file__).resolve().parents[1]


def gelu_tanh_64(x):
    """The function as GPT-2 defines it, in float64."""
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def inputs(n=4099, seed=0):
    """Normal activations at three scales, the far tails and exact zeros; a ragged length."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.tensor([0.1, 1.0, 4.0]).repeat(n // 3 + 1)[:n]
    x[:6] = torch.tensor([0.0, -0.0, -12.0, 12.0, -40.0, 40.0])
    return x


@pytest.fixture(scope="module", autouse=True)
def built():
    assert kernels.build() is None, "the C++ kernels build here"


def test_the_forward_is_the_function_to_float32_rounding():
    x = inputs()
    y, expected = kernels.gelu_tanh(x), gelu_tanh_64(x)
    assert y.dtype == torch.float32
    # a few float32 roundings of the output, or of x where the output cancels to near 0
    tolerance = 8 * torch.finfo(torch.float32).eps * torch.maximum(expected.abs(), 1e-3 * x.double().abs())
    assert torch.all((y.double() - expected).abs() <= tolerance)
    assert torch.equal(y[[0, 1, 3, 5]], torch.tensor([0.0, 0.0, 12.0, 40.0]))


def test_the_backward_and_its_own_backward_are_the_function_s_derivatives():
    x = inputs(1031)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    x32 = x.clone().requires_grad_()
    (dx,) = torch.autograd.grad(kernels.gelu_tanh(x32), x32, grad, create_graph=True)
    (d2x,) = torch.autograd.grad(dx, x32, torch.ones_like(dx))
    x64 = x.double().requires_grad_()
    (dx64,) = torch.autograd.grad(gelu_tanh_64(x64), x64, grad.double(), create_graph=True)
    (d2x64,) = torch.autograd.grad(dx64, x64, torch.ones_like(dx64))
    # Both carry 1 - s, which float32 holds only to s's rounding (s -> 1 as x grows), times du/dx's
    # factor of 1 + x^2: a few roundings of that scale.
    scale = grad.double().abs() * (1 + x.double() ** 2)
    eps = torch.finfo(torch.float32).eps
    assert torch.all((dx.double() - dx64).abs() <= 16 * eps * (scale + dx64.abs()))
    assert torch.all((d2x.double() - d2x64).abs() <= 16 * eps * (scale + d2x64.abs()))


def test_an_element_s_result_does_not_depend_on_where_it_sits():
    """Any offset and length (whole vectors, a partial one, tasks split by threads) give the
    same bits, forward and backward: a sequence's activations are the same anywhere in a batch."""
    x, grad = inputs(70_001), inputs(70_001, seed=1)
    whole = kernels.gelu_tanh(x), torch.ops.nanomerit.gelu_tanh_backward(grad, x)
    for start, stop in ((1, 70_001), (3, 20), (17, 70_000), (40_000, 40_005)):
        part = kernels.gelu_tanh(x[start:stop].clone())
        assert torch.equal(part, whole[0][start:stop])
        part = torch.ops.nanomerit.gelu_tanh_backward(grad[start:stop].clone(), x[start:stop].clone())
        assert torch.equal(part, whole[1][start:stop])


def test_the_mlp_takes_the_kernel_for_float32_cpu_and_torch_s_gelu_otherwise():
    x = inputs(512).reshape(4, 128)
    assert torch.equal(TanhGELU()(x), kernels.gelu_tanh(x))
    assert torch.equal(TanhGELU()(x.double()), F.gelu(x.double(), approximate="tanh"))
    assert torch.equal(TanhGELU()(x.t()), F.gelu(x.t(), approximate="tanh"))  # not contiguous
    assert torch.equal(TanhGELU()(x.bfloat16()), F.gelu(x.bfloat16(), approximate="tanh"))


def test_a_model_in_float32_computes_what_torch_s_gelu_would_to_float32_rounding(monkeypatch):
    calls = []
    monkeypatch.setattr(kernels, "gelu_tanh", lambda x: calls.append(x.shape) or torch.ops.nanomerit.gelu_tanh(x))
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=128, block_size=32, bias=False))
    idx = torch.randint(0, 128, (2, 32))
    logits, loss = model(idx, idx)
    assert calls == [(2, 32, 256)] * 2  # the kernel ran, in each block's MLP
    for block in model.transformer.h:
        block.mlp.gelu.forward = lambda x: F.gelu(x, approximate="tanh")
    torch_logits, torch_loss = model(idx, idx)
    torch.testing.assert_close(logits, torch_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, torch_loss, rtol=1e-6, atol=0)


def test_a_failed_build_falls_back_to_torch_s_gelu_with_one_warning(monkeypatch):
    monkeypatch.setattr(kernels, "_gelu_kernel_built", kernels._gelu_kernel_built)  # restored after
    monkeypatch.setattr(kernels, "build", lambda: RuntimeError("build log\n...\nError building extension"))
    kernels._warn_gelu_fallback.cache_clear()
    x = inputs(64)
    try:
        with pytest.warns(RuntimeWarning, match="could not be built.*Error building extension.*torch's tanh GELU"):
            first = TanhGELU()(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            second = TanhGELU()(x)
    finally:
        kernels._warn_gelu_fallback.cache_clear()
    assert torch.equal(first, F.gelu(x, approximate="tanh")) and torch.equal(second, first)


def test_torch_compile_traces_the_kernel():
    x = inputs(256).requires_grad_()
    TanhGELU()(x)  # eager, as a run's first validation: builds, and tells traced code it is built
    traced = []

    def backend(graph, example_inputs):
        traced.extend(str(node.target) for node in graph.graph.nodes)
        return torch._dynamo.backends.debugging.aot_eager(graph, example_inputs)

    compiled = torch.compile(lambda t: TanhGELU()(t) * 2, backend=backend, fullgraph=True)
    y = compiled(x)
    assert "nanomerit.gelu_tanh" in traced  # the kernel is in the graph, not torch's GELU
    y.sum().backward()
    expected = x.detach().clone().requires_grad_()
    (2 * kernels.gelu_tanh(expected)).sum().backward()
    assert torch.equal(y, 2 * kernels.gelu_tanh(x.detach())) and torch.equal(x.grad, expected.grad)


@pytest.mark.slow
def test_bench_gelu_prints_what_it_measured(tmp_path):
    """scripts/bench_gelu on a small activation and two rounds of one step: its table and ratios
    are those of its --json."""
    result = subprocess.run([sys.executable, "-m", "scripts.bench_gelu", "--rows=64", "--width=96", "--rounds=2",
                             "--steps=1", f"--json={tmp_path / 'gelu.json'}"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads((tmp_path / "gelu.json").read_text())
    ours = measured["activation"]["kernel"]
    for name in ("kernel", "torch tanh", "torch erf"):
        ms = measured["activation"][name]
        ratio = (ms["forward_ms"] + ms["backward_ms"]) / (ours["forward_ms"] + ours["backward_ms"])
        assert re.search(rf"^{name}\s+{ms['forward_ms']:.3f}\s+{ms['backward_ms']:.3f}\s+{ratio:.2f}x$",
                         result.stdout, re.M)
    step = measured["step_ms"]
    assert f"{step['kernel']:.1f} ms with the kernel, {step['torch tanh']:.1f} ms with torch's tanh GELU: " \
           f"{step['torch tanh'] / step['kernel']:.3f}x" in result.stdout
