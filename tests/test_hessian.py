"""study/hessian.py and its CLI scripts/hessian.py: the top Hessian eigenvalue and Hutchinson's trace against Hessians known in
closed form (quadratics, least squares) and the dense Hessian of a tiny GPT trained by train.py,
and its command line."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from data.shards import list_shards, open_shard
from helpers import ROOT, train_here
from study import hessian
from training.checkpoint import load_model
from training.run_folder import model_sha256

F64 = torch.float64
FIELDS = {"checkpoint", "step", "model_sha256", "top_eigenvalue", "eigen_iterations", "eigen_converged", "tol", "trace",
          "trace_stderr", "trace_samples", "batches", "batch_size", "block_size", "seed", "seconds"}


@pytest.fixture(autouse=True)
def one_thread():
    """Torch on one thread in these tests: they are thousands of tiny ops, which a thread pool only
    slows down (many times over when other processes share the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def symmetric(eigenvalues, seed: int) -> torch.Tensor:
    """Q diag(eigenvalues) Q^T for a random orthogonal Q (float64)."""
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=seeded(seed), dtype=F64))
    return q @ torch.diag(torch.tensor(eigenvalues, dtype=F64)) @ q.T


def quadratic(A: torch.Tensor, seed: int):
    """(the loss 0.5 x^T A x + b^T x, [x]) at a random x: its Hessian is A everywhere."""
    g = seeded(seed)
    x = torch.randn(len(A), generator=g, dtype=F64).requires_grad_()
    b = torch.randn(len(A), generator=g, dtype=F64)
    return (lambda: 0.5 * x @ A @ x + b @ x), [x]


def rademacher_sd(A: torch.Tensor) -> float:
    """The standard deviation of z^T A z over Rademacher z: Var = 2 sum_{i != j} A_ij^2."""
    return math.sqrt(2 * ((A ** 2).sum() - (A.diagonal() ** 2).sum()).item())


# ---- quadratics: H = A ----

@pytest.mark.parametrize("eigenvalues", [
    [8.0, 4.0, 2.0, 1.0, -3.0, 0.5],  # the dominant eigenvalue is the largest
    [-10.0, 6.0, 3.0, 1.0, -2.0, 0.5],  # the dominant one is negative: the top is still 6, the largest
    [-1.0, -2.0, -5.0, -3.0],  # all negative: the top is -1
])
def test_top_eigenvalue_is_the_largest_algebraic_one(eigenvalues):
    A = symmetric(eigenvalues, seed=0)
    loss, params = quadratic(A, seed=1)
    value, iterations, converged = hessian.top_eigenvalue(loss, params, generator=seeded(0))
    assert converged and 2 <= iterations <= 200  # at most max_iter (100) per power iteration
    assert value == pytest.approx(torch.linalg.eigvalsh(A).max().item(), rel=1e-3)


def test_top_eigenvalue_stops_at_max_iter():
    loss, params = quadratic(symmetric([1.0, 0.99, 0.5], seed=0), seed=1)  # a gap too small for 5 iterations
    value, iterations, converged = hessian.top_eigenvalue(loss, params, tol=1e-12, max_iter=5, generator=seeded(0))
    assert (iterations, converged) == (5, False) and 0.5 < value <= 1.0 + 1e-12


def test_hutchinson_is_exact_on_a_diagonal_hessian():
    # z_i^2 = 1 for Rademacher z, so z^T D z = trace(D) for every sample.
    d = torch.tensor([3.0, -1.0, 0.25, 7.0], dtype=F64)
    x = torch.ones(4, dtype=F64, requires_grad=True)
    mean, stderr = hessian.hutchinson_trace(lambda: 0.5 * (d * x * x).sum(), [x], samples=5, generator=seeded(0))
    assert mean == pytest.approx(d.sum().item(), rel=1e-12) and stderr == pytest.approx(0, abs=1e-12)


def test_hutchinson_trace_of_a_quadratic():
    # Eigenvalues close together keep A near 10 I, with small off-diagonal entries (the estimator's
    # only variance): 2000 samples put the trace within 1e-3 (over 4 standard errors).
    A = symmetric((10 + torch.linspace(-0.5, 0.5, 16)).tolist(), seed=2)
    loss, params = quadratic(A, seed=3)
    samples = 2000
    mean, stderr = hessian.hutchinson_trace(loss, params, samples, generator=seeded(0))
    trace = torch.trace(A).item()
    assert stderr == pytest.approx(rademacher_sd(A) / math.sqrt(samples), rel=0.1)
    assert 1e-3 * trace > 4 * stderr
    assert mean == pytest.approx(trace, rel=1e-3) and abs(mean - trace) < 4 * stderr


def test_hutchinson_stderr_on_a_spread_spectrum():
    A = symmetric([8.0, 4.0, 2.0, 1.0, -3.0, 0.5], seed=0)
    loss, params = quadratic(A, seed=1)
    samples = 400
    mean, stderr = hessian.hutchinson_trace(loss, params, samples, generator=seeded(1))
    assert stderr == pytest.approx(rademacher_sd(A) / math.sqrt(samples), rel=0.2)
    assert abs(mean - torch.trace(A).item()) < 4 * stderr


# ---- least squares over two parameter tensors ----

def least_squares(n=128, d=4, k=2):
    """(the loss mean((X W^T + b - Y)^2) over n rows and k outputs, [W, b], X, c = 2 / (n k)).
    Its Hessian, exactly: for each output j, H restricted to (W_j, b_j) is c Z^T Z with Z = [X 1],
    and outputs do not interact, so H = I_k (x) c Z^T Z. X is centred orthogonal columns of
    distinct scales plus noise: Z^T Z is far from diagonal only by the noise, which keeps the
    trace estimate's variance small enough for 1e-3 in 1000 samples."""
    g = seeded(0)
    centred = torch.randn(n, d, generator=g, dtype=F64)
    q, _ = torch.linalg.qr(centred - centred.mean(0))
    X = math.sqrt(n) * q * torch.tensor([1.0, 1.5, 2.0, 3.0], dtype=F64) + 0.2 * torch.randn(n, d, generator=g,
                                                                                            dtype=F64)
    Y = torch.randn(n, k, generator=g, dtype=F64)
    weight = torch.randn(k, d, generator=g, dtype=F64).requires_grad_()
    bias = torch.randn(k, generator=g, dtype=F64).requires_grad_()
    return (lambda: ((X @ weight.T + bias - Y) ** 2).mean()), [weight, bias], X, 2 / (n * k)


def test_hvp_of_least_squares():
    loss, params, X, c = least_squares()
    g = seeded(1)
    v_weight, v_bias = (torch.randn(p.shape, generator=g, dtype=F64) for p in params)
    hv_weight, hv_bias = hessian.hvp(loss, params, [v_weight, v_bias])
    prediction_change = X @ v_weight.T + v_bias  # (n, k): how the residuals move along v
    torch.testing.assert_close(hv_weight, c * prediction_change.T @ X, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hv_bias, c * prediction_change.sum(0), rtol=1e-12, atol=1e-12)


def test_least_squares_eigenvalue_and_trace():
    loss, params, X, c = least_squares()
    Z = torch.cat([X, torch.ones(len(X), 1, dtype=F64)], dim=1)
    block = c * Z.T @ Z
    value, _, converged = hessian.top_eigenvalue(loss, params, generator=seeded(0))
    assert converged and value == pytest.approx(torch.linalg.eigvalsh(block).max().item(), rel=1e-3)
    mean, stderr = hessian.hutchinson_trace(loss, params, 1000, generator=seeded(0))
    n, k = X.shape[0], params[0].shape[0]
    trace = 2 / n * ((X ** 2).sum().item() + n)  # k * trace(block)
    assert trace == pytest.approx(k * torch.trace(block).item(), rel=1e-12)
    assert 1e-3 * trace > 4 * stderr
    assert mean == pytest.approx(trace, rel=1e-3)
    block_sd = rademacher_sd(torch.kron(torch.eye(k, dtype=F64), block))
    assert stderr == pytest.approx(block_sd / math.sqrt(1000), rel=0.15)


# ---- the command line, on a checkpoint of train.py ----

@pytest.fixture(scope="module")
def checkpoint_file(byte_shards, tmp_path_factory):
    """A GPT small enough (1.3k parameters) for its dense Hessian, trained until its top eigenvalue
    stands clear of the rest, for a fast power iteration (near initialisation the spectrum is
    about symmetric around 0, which power iteration resolves slowly)."""
    out = tmp_path_factory.mktemp("hessian_run")
    train_here("--model=nano", "--n_layer=1", "--n_head=1", "--n_embd=4", "--block_size=8", "--vocab_size=257",
               "--tokenizer=byte", "--max_steps=30", "--lr=3e-2", "--batch_size=2", "--micro_batch_size=2",
               "--eval_interval=100", "--val_tokens=64", "--probe_batch_size=2", f"--data_dir={byte_shards}",
               f"--out_dir={out}", "--run_name=run")
    return out / "run" / "ckpt.pt"


def first_val_batches(data_dir, batches: int, batch_size: int, block_size: int) -> list:
    """The val split's first batches, read straight from its shard (train.py's val batches without
    document alignment: consecutive rows of block_size tokens, targets shifted by one)."""
    tokens = torch.from_numpy(open_shard(list_shards(data_dir, "val")[0]).astype("int64"))
    step = batch_size * block_size
    rows = [tokens[i * step: (i + 1) * step + 1] for i in range(batches)]
    return [(r[:-1].view(batch_size, block_size), r[1:].view(batch_size, block_size)) for r in rows]


def dense_hessian(model, batches) -> torch.Tensor:
    """The Hessian of the mean loss over the batches with respect to every parameter, materialised
    (by torch.autograd.functional, not by the code under test)."""
    sizes = [p.numel() for p in model.parameters()]

    def loss(flat):
        values = {name: piece.view(p.shape) for (name, p), piece in zip(model.named_parameters(), flat.split(sizes))}
        with sdpa_kernel(SDPBackend.MATH):
            return sum(functional_call(model, values, (x, y))[1] for x, y in batches) / len(batches)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return torch.autograd.functional.hessian(loss, flat, vectorize=True).double()


def run_hessian(*args):
    return subprocess.run([sys.executable, "-m", "scripts.hessian", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow  # `python -m scripts.hessian`, a process of its own
def test_cli_matches_the_dense_hessian(checkpoint_file, byte_shards):
    result = run_hessian(checkpoint_file, "--batches=2", "--batch-size=2", "--samples=50", "--tol=1e-7",
                         "--max-iter=500", "--seed=3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "top Hessian eigenvalue" in result.stdout and "hessian.json" in result.stdout
    out = json.loads((checkpoint_file.parent / "hessian.json").read_text())
    assert FIELDS <= out.keys()
    assert (out["checkpoint"], out["step"], out["batches"], out["batch_size"], out["block_size"]) == (
        str(checkpoint_file), 30, 2, 2, 8)
    model, _ = load_model(checkpoint_file)
    assert out["model_sha256"] == model_sha256(model)  # the model it measured (scripts.report checks it)
    assert (out["tol"], out["trace_samples"], out["seed"]) == (1e-7, 50, 3)
    assert all(math.isfinite(out[key]) for key in ("top_eigenvalue", "trace", "trace_stderr", "seconds"))

    H = dense_hessian(model, first_val_batches(byte_shards, 2, 2, 8))
    assert out["eigen_converged"] and 2 <= out["eigen_iterations"] <= 1000
    assert out["top_eigenvalue"] == pytest.approx(torch.linalg.eigvalsh((H + H.T) / 2).max().item(), rel=1e-3)
    assert out["trace_stderr"] > 0 and abs(out["trace"] - torch.trace(H).item()) < 4 * out["trace_stderr"]


@pytest.mark.slow  # `python -m scripts.hessian`, a process of its own
def test_cli_missing_checkpoint(tmp_path):
    missing = tmp_path / "nowhere" / "ckpt.pt"
    result = run_hessian(missing)
    assert result.returncode != 0 and "hessian:" in result.stderr and str(missing) in result.stderr
    assert not (tmp_path / "nowhere").exists()


def test_bad_data_is_refused_with_the_fix(checkpoint_file, byte_shards, tmp_path):
    only_train = tmp_path / "only_train"
    only_train.mkdir()
    shutil.copy(list_shards(byte_shards, "train")[0], only_train)
    config = {"tokenizer": "byte"}
    with pytest.raises((OSError, ValueError), match=f"'val'.*{only_train}|{only_train}.*'val'"):
        hessian.validation_batches(config, only_train, 1, 2, 8)
    with pytest.raises(ValueError, match="fewer or smaller batches"):  # more batches than the val split holds
        hessian.validation_batches(config, byte_shards, 100000, 2, 8)
    with pytest.raises(ValueError, match="at least 2 samples"):
        hessian.hutchinson_trace(lambda: torch.zeros((), requires_grad=True), [], samples=1)
    result = run_hessian(checkpoint_file, "--batches=100000", f"--out={tmp_path / 'h.json'}")
    assert result.returncode == 1 and result.stderr.startswith("hessian: ") and "fewer or smaller" in result.stderr
    assert not (tmp_path / "h.json").exists()
