"""The optimizers' Triton backend (optim/backends/triton.py) beyond what the shared tests check
through the ``backend`` fixture (every optimizer against its naive reference and the torch
reference, run in Triton's interpreter): every kernel configuration a step launches compiles for
the H200 (sm_90) with IEEE division and square root and no FMA contraction, so the GPU computes
the bits the interpreter computed; and without Triton a clear error or one warning."""
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import optim
from helpers import ROOT, require_backend
from optim import LAMB, MARS, MERIT, SGD, Adafactor, AdamWScheduleFree, AdEMAMix, Lion, SophiaG, backends
from optim.backends import reference, triton

# Compiles the recorded configurations (argv[1], JSON) for sm_90, as Triton does before a launch
# on a GPU (no interpreter here: TRITON_INTERPRET is unset), and prints what the PTX contains.
COMPILE = """
import json, sys
import triton.language as tl
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from optim.backends import triton_kernels

dtypes = {t.name: t for t in (tl.float32, tl.float64, tl.bfloat16)}
report = []
for config in json.load(open(sys.argv[1])):
    constexprs = {k: dtypes[v[1]] if isinstance(v, list) else v for k, v in config["constexprs"].items()}
    source = ASTSource(fn=getattr(triton_kernels, config["kernel"]), signature=config["signature"],
                       constexprs=constexprs)
    compiled = compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False})
    lines = [line.split()[0] for line in compiled.asm["ptx"].splitlines() if line.startswith("\\t") and line.split()]
    report.append({"config": config, "cubin_bytes": len(compiled.asm["cubin"]),
                   "inexact": sorted({op for op in lines if "approx" in op or "full" in op or op.startswith("fma")}),
                   "ieee": sorted({op for op in lines if op.startswith(("div.rn", "sqrt.rn"))})})
print(json.dumps(report))
"""


def _describe(kernel, args: tuple, constexprs: dict) -> dict:
    """A launch as the compile script needs it: kernel name, Triton signature, constexpr values."""
    params = list(inspect.signature(kernel.fn).parameters.values())
    signature = {}
    for param, arg in zip(params, args):
        if isinstance(arg, torch.Tensor):
            signature[param.name] = "*" + {torch.float32: "fp32", torch.bfloat16: "bf16",
                                           torch.float64: "fp64", torch.int32: "i32"}[arg.dtype]
        elif isinstance(arg, bool):
            signature[param.name] = "i1"
        elif isinstance(arg, int):
            signature[param.name] = "i32" if -2**31 <= arg < 2**31 else "i64"
        else:  # floats: the kernels declare them float64
            signature[param.name] = param.annotation.name
    signature.update({name: "constexpr" for name in constexprs})
    values = {k: ["dtype", v.name] if hasattr(v, "primitive_bitwidth") else v for k, v in constexprs.items()}
    return {"kernel": kernel.fn.__name__, "signature": signature, "constexprs": values}


@pytest.mark.slow  # a process of its own, compiling or interpreting every kernel
def test_every_launch_compiles_for_sm90_with_exact_arithmetic(monkeypatch, tmp_path):
    require_backend("triton")
    launches = {}
    launch = triton._launch

    def record(kernel, grid, *args, **constexprs):
        described = _describe(kernel, args, constexprs)
        launches[json.dumps(described, sort_keys=True)] = described
        launch(kernel, grid, *args, **constexprs)

    monkeypatch.setattr(triton, "_launch", record)
    on = {"backend": "triton"}
    makers = [lambda ps, o=o: MERIT(ps, lr=0.1, weight_decay=0.1, **o, **on)
              for o in ({}, {"norm": "l2"}, {"maxlamb": True}, {"elementwise_clip": False})]
    makers += [lambda ps: LAMB(ps, lr=0.1, weight_decay=0.1, bias_correction=True, **on),
               lambda ps: Lion(ps, lr=0.1, weight_decay=0.1, **on), lambda ps: Lion(ps, lr=0.1, **on),
               lambda ps: SophiaG(ps, lr=0.1, weight_decay=0.1, batch_tokens=8, **on),
               lambda ps: SophiaG(ps, batch_tokens=8, **on)]
    makers += [lambda ps: AdEMAMix(ps, lr=0.1, weight_decay=0.1, alpha_warmup=3, beta3_warmup=3, **on),
               lambda ps: AdEMAMix(ps, lr=0.1, alpha_warmup=0, beta3_warmup=0, **on),
               lambda ps: AdamWScheduleFree(ps, lr=0.1, weight_decay=0.1, **on),
               lambda ps: AdamWScheduleFree(ps, lr=0.1, **on)]
    makers += [lambda ps: MARS([{"params": ps[:1], "hidden_matrix": True}, {"params": ps[1:], "hidden_matrix": False}],
                               lr=0.1, weight_decay=0.1, **on)]  # (its correction: the vector takes torch's AdamW)
    makers += [lambda ps: SGD(ps, lr=0.1, **on), lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1, **on),
               lambda ps: Adafactor(ps, lr=0.1, **on), lambda ps: Adafactor(ps, lr=0.1, clipping_threshold=None, **on)]
    factoring = makers[-2:]  # (given a matrix of sides >= 128 too: Adafactor factors it)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for make in makers:
            shapes = ((6, 20), (7,), *([(128, 130)] if make in factoring else []))
            params = [nn.Parameter(torch.randn(s, dtype=dtype)) for s in shapes]
            opt = make(params)
            # MERIT counts clipped elements on diagnostic steps; a found_inf flag masks the stores
            # (the kernels differ in that only, so float32's flagged variants are compiled).
            for diagnose, flagged in ((False, False), (True, False), (False, dtype == torch.float32)):
                if diagnose:
                    opt.request_diagnostics()
                for p in params:
                    p.grad = torch.randn(p.shape, dtype=dtype)
                if flagged:
                    opt.step_unless(torch.tensor(False))
                else:
                    opt.step()
    # Schedule-Free drops a flagged step on the host (optim/schedulefree.py): its flagged kernel, called here.
    y, g, z, v = torch.randn(4, 7).unbind()
    triton.schedulefree_step(y, g, z, v.abs(), lr=0.1, y_lr=-0.1, ckp1=0.5, wd=0.1, beta2=0.999, bias_correction2=0.5,
                             eps=1e-8, skip=torch.tensor(False))
    configs = list(launches.values())
    assert {c["kernel"] for c in configs} == {"moments_and_norms", "trust_ratios", "apply_update", "lion_step",
                                              "sophia_step", "ademamix_step", "schedulefree_step", "mars_correction",
                                              "sgd_step", "adafactor_statistics", "adafactor_sums", "adafactor_apply"}
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compile every one, here
    result = subprocess.run([sys.executable, "-c", COMPILE, str(tmp_path / "configs.json")], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report) == len(configs)
    for entry in report:
        assert entry["cubin_bytes"] > 0
        # No approximate division / sqrt, no contracted FMA: an FMA only where torch's add(..., alpha=)
        # computes one (SGD's step, Adafactor's v), asked for with tl.fma (IEEE: fma.rn).
        fused = {op for op in entry["inexact"] if op.startswith("fma.rn.")}
        assert entry["inexact"] == sorted(fused) and (not fused or entry["config"]["kernel"] in (
            "sgd_step", "adafactor_sums")), entry
    # The divisions and square roots that are there are the IEEE ones, in each compute type.
    ieee = set().union(*(entry["ieee"] for entry in report))
    assert {"div.rn.f32", "div.rn.f64", "sqrt.rn.f32", "sqrt.rn.f64"} <= ieee


def test_without_triton_a_named_backend_is_an_error_and_auto_warns_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "optim.backends.triton_kernels", None)  # the import fails
    monkeypatch.delattr(optim.backends, "triton_kernels", raising=False)
    triton._import.cache_clear()
    backends.common.warn_once.cache_clear()
    try:
        p = nn.Parameter(torch.randn(5, 4))
        with pytest.raises(RuntimeError, match="Triton is not available.*pip install triton, or use optim_backend"):
            MERIT([p], lr=0.1, backend="triton")
        with pytest.warns(RuntimeWarning, match="Triton is not available") as record:
            for _ in range(2):  # what "auto" does for CUDA tensors
                assert not triton.load(required=False)
        assert len([w for w in record if "Triton is not available" in str(w.message)]) == 1
        assert backends.select("triton", [p]) is reference  # not ready: the reference runs
    finally:
        triton._import.cache_clear()
        backends.common.warn_once.cache_clear()


@pytest.mark.slow  # a process of its own, compiling or interpreting every kernel
def test_check_cuda_script_runs_its_checks_on_the_cpu(tmp_path):
    # scripts/check_cuda.py is what a GPU session runs; here its code runs on the CPU (Triton's
    # interpreter, small shapes), so that it works the first time a GPU is at hand.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script sets it itself
    out = tmp_path / "check_cuda.json"
    result = subprocess.run([sys.executable, "-m", "scripts.check_cuda", "--device", "cpu", "--quick",
                             f"--json={out}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    optimizer_checks = [line for line in lines if line.startswith("PASS  optimizer ")]
    assert len(optimizer_checks) == 2 * 15  # fp32 and bf16 for each optimizer and ablation
    for family in ("gpt2", "llama_130m"):
        assert any(line.startswith(f"PASS  model {family} eager bf16 train step") for line in lines)
    assert lines[-1] == "all checks passed"
    written = json.loads(out.read_text())
    assert written["failures"] == [] and written["model llama_130m eager bf16 train step"]["tokens_per_s"] > 0
