"""The checks to run on a GPU when one is at hand: one command, a few minutes on an H200.

    python -m scripts.check_cuda                        # CUDA (Triton comes with PyTorch's CUDA builds)
    python -m scripts.check_cuda --device cpu --quick   # the same code on the CPU: Triton's
                                                        # interpreter, small shapes (a test runs this)

1. optimizers: MERIT (and its ablations), LAMB (and its flags), Lion, Sophia-G, AdEMAMix, Schedule-Free
   AdamW, MARS, SGD (with momentum and without) and Adafactor take 20 steps (4 with --quick) on their
   Triton kernels (optim_backend "triton") and, from the same start, on the torch reference ("torch")
   on the same device and dtype, and in float64 on the CPU; fp32 and bf16. Every other step goes
   through ``step_unless`` with a zero found_inf flag on the device (nonfinite="skip"'s path; but for
   LAMB's bias_correction, AdEMAMix and Adafactor, which read their step counters, and Schedule-Free,
   which reads the flag, on the host). On CUDA the Triton steps run under
   torch.cuda.set_sync_debug_mode("error"): a host sync fails them.
2. speed (CUDA only): scripts/bench_optim.py's ratios to torch.optim.AdamW(fused=True) on GPT-2
   Small shapes, fp32 and bf16, for the paper's optimizers, the 2025 benchmark's and the small-batch
   study's (SGD, with momentum and without, and Adafactor).
3. model: training steps (forward, backward, MERIT step) of GPT-2 Small (block 1024, batch 16) and
   Llama-130M (block 256, batch 64: the paper's sequences) under bf16 autocast, with SDPA's flash
   kernel on CUDA, eager and torch.compile'd (CUDA): their losses agree; ms/step, tokens/s, MFU.
4. training (CUDA only): scripts/bench_train.py on GPT-2 Small (block 1024, batch 16) in bf16,
   eager with every optimizer and compiled with AdamW, MERIT and Muon: tokens/s, MFU, the step's
   parts, each whole step against AdamW's; scripts/bench_instruments.py's QK-Clip overhead.
Prints a line per check and writes every number to --json (check_cuda.json); exits 1 if any
check failed.
"""
import argparse
import json
import math
import os
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from optim import LAMB, MARS, MERIT, SGD, Adafactor, AdEMAMix, AdamWScheduleFree, Lion, SophiaG
from training.metrics import peak_bf16_flops

# Each maker takes (params, backend).
OPTIMIZERS = {
    "merit": lambda ps, b: MERIT(ps, lr=0.02, betas=(0.9, 0.95), weight_decay=0.1, backend=b),
    "merit l2": lambda ps, b: MERIT(ps, lr=0.02, weight_decay=0.1, norm="l2", backend=b),
    "merit no clip": lambda ps, b: MERIT(ps, lr=0.02, weight_decay=0.1, elementwise_clip=False, backend=b),
    "merit no lower bound": lambda ps, b: MERIT(ps, lr=0.02, weight_decay=0.1, weightwise_lower_bound=False,
                                                backend=b),
    "maxlamb": lambda ps, b: MERIT(ps, lr=0.02, weight_decay=0.1, maxlamb=True, backend=b),
    "lamb": lambda ps, b: LAMB(ps, lr=0.02, weight_decay=0.1, backend=b),
    "lamb bias correction": lambda ps, b: LAMB(ps, lr=0.02, weight_decay=0.1, bias_correction=True, backend=b),
    "lion": lambda ps, b: Lion(ps, lr=1e-3, weight_decay=0.1, backend=b),
    "sophiag": lambda ps, b: SophiaG(ps, lr=1e-3, weight_decay=0.1, batch_tokens=4096, hessian_interval=2,
                                     backend=b),
    "ademamix": lambda ps, b: AdEMAMix(ps, lr=1e-3, weight_decay=0.1, alpha=8.0, beta3=0.999, alpha_warmup=8,
                                       beta3_warmup=8, backend=b),
    "adamw schedulefree": lambda ps, b: AdamWScheduleFree(ps, lr=1e-3, weight_decay=0.1, backend=b),
    # (its matrices' correction is the fused operation; AdamW is torch's kernel on both backends)
    "mars": lambda ps, b: MARS([{"params": [p for p in ps if p.ndim == 2], "hidden_matrix": True},
                                {"params": [p for p in ps if p.ndim != 2], "hidden_matrix": False}],
                               lr=3e-3, weight_decay=0.1, backend=b),
    "sgd": lambda ps, b: SGD(ps, lr=0.2, backend=b),
    "sgd momentum": lambda ps, b: SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.1, backend=b),
    "adafactor": lambda ps, b: Adafactor(ps, lr=0.01, decay_rate=0.9999, backend=b),
}
# (a step counter or the flag read on the host: not flagged)
HOST_READS = ("lamb bias correction", "ademamix", "adamw schedulefree", "adafactor")
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # max |diff| / max |reference|, vs the torch reference
failures = []
results = {}  # every measured number, written to --json


def report(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name:<44}{detail}", flush=True)
    if not ok:
        failures.append(name)


def run_optimizer(make, backend, shapes, device, dtype, steps, flagged: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter((0.5 * torch.randn(s, generator=gen, dtype=torch.float64)).to(device, dtype))
              for s in shapes]
    grads = [[torch.randn(s, generator=gen, dtype=torch.float64) * (1 + k % 3) for s in shapes] for k in range(steps)]
    opt = make(params, backend)
    check_syncs = device.type == "cuda" and backend == "triton"
    for k, gs in enumerate(grads):
        for p, g in zip(params, gs):
            p.grad = g.to(device, dtype)
        if k == steps - 1:
            opt.request_diagnostics()  # the diagnostics' counts sync, once, here
        with syncs_forbidden() if check_syncs and k < steps - 1 else nullcontext():
            if flagged and k % 2:
                opt.step_unless(torch.zeros((), device=device))
            else:
                opt.step()
        if isinstance(opt, SophiaG) and opt.extra_pass_due(k + 1):
            for p, g in zip(params, gs):
                p.grad = 0.1 * g.to(device, dtype)
            opt.update_hessian()
    return [p.detach().double().cpu() for p in params]


class syncs_forbidden:
    def __enter__(self):
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")


def check_optimizers(device: torch.device, quick: bool) -> None:
    # (a quick matrix of sides >= 128: Adafactor factors it)
    shapes = [(130, 140), (7,)] if quick else [(2304, 768), (768, 3072), (1024, 768), (768,), (2304,)]
    steps = 4 if quick else 20
    for name, make in OPTIMIZERS.items():
        flagged = name not in HOST_READS
        reference = run_optimizer(make, "torch", shapes, torch.device("cpu"), torch.float64, steps, flagged=False)
        for dtype in (torch.float32, torch.bfloat16):
            label = f"optimizer {name} {str(dtype).removeprefix('torch.')}"
            stepped = {}
            for backend in ("triton", "torch"):
                try:
                    stepped[backend] = run_optimizer(make, backend, shapes, device, dtype, steps, flagged)
                except RuntimeError as error:  # a host sync, a kernel that failed
                    report(f"{label} ({backend})", False, f"{type(error).__name__}: {error}")
                    break
            else:
                vs_torch = max((a - b).abs().max() / b.abs().max() for a, b in zip(stepped["triton"], stepped["torch"]))
                vs_fp64 = max((a - b).abs().max() / b.abs().max() for a, b in zip(stepped["triton"], reference))
                report(label, vs_torch <= TOLERANCE[dtype],
                       f"vs torch reference {vs_torch:.1e}, vs float64 {vs_fp64:.1e}")


def check_speed(device: torch.device) -> None:
    from study import bench_optim

    for dtype in (torch.float32, torch.bfloat16):
        for name in ("merit", "lamb", "lion", "sophiag", "adamw", "muon", "dmuon", "ademamix", "mars", "soap",
                     "adamw_schedulefree", "sgd", "sgd momentum 0.9", "adafactor"):
            ms, base, ratio, newton_schulz_ms, state = bench_optim.bench(name, device, dtype, steps=20, warmup=3)
            share = f", Newton-Schulz {newton_schulz_ms:.2f} ms" if newton_schulz_ms is not None else ""
            print(f"      speed {name:<18} {str(dtype).removeprefix('torch.'):<9}{ms:8.2f} ms/step, "
                  f"fused AdamW {base:6.2f} ms, ratio {ratio:.2f}{share}", flush=True)
            results[f"optimizer step {name} {str(dtype).removeprefix('torch.')}"] = {
                "ms": ms, "fused_adamw_ms": base, "ratio": ratio, "newton_schulz_ms": newton_schulz_ms,
                "state_per_parameter_byte": state}


# GPT-2 Small as bench_train's overrides (KEY=VALUE) of configs/default.py.
GPT2_SMALL = ["model=gpt2", "block_size=1024", "tokenizer=gpt2", "batch_size=16", "micro_batch_size=16",
              "dtype=bfloat16", "device=cuda", "probe_batch_size=4"]


def check_train(device: torch.device) -> None:
    from study.bench import DEFAULT_CONFIG, instrument_costs, step_costs
    from train import SECTIONS, Trainer

    runs = {"eager": (False, ["adamw", "merit", "lamb", "lion", "sophiag", "muon"]),
            "compiled": (True, ["adamw", "merit", "muon"])}
    for label, (compiled, names) in runs.items():
        # (bench_train's command line: --steps=10 --compare NAMES, its warmup 3 and parts by default)
        measured = step_costs(DEFAULT_CONFIG, [*GPT2_SMALL, f"compile={compiled}"], steps=10, warmup=3, parts=True,
                              compare=names, trainer_class=Trainer, sections=SECTIONS)
        results[f"train GPT-2 Small bf16 {label}"] = measured
        ratios = ", ".join(f"{name} {measured['compare'][name]['ratio']:.3f}x" for name in names[1:])
        report(f"train GPT-2 Small bf16 {label}", math.isfinite(measured["tokens_per_s"]),
               f"{measured['tokens_per_s']:,.0f} tokens/s, {measured['flops'] / 1e12:.0f} TFLOP/s; against "
               f"AdamW: {ratios}")
    overhead = instrument_costs(DEFAULT_CONFIG, GPT2_SMALL, steps=10, trainer_class=Trainer)
    results["instruments GPT-2 Small bf16"] = overhead
    report("QK-Clip overhead GPT-2 Small bf16", math.isfinite(overhead["qk_clip_ratio"]),
           f"{100 * (overhead['qk_clip_ratio'] - 1):+.1f}% a step")


def check_model(device: torch.device, quick: bool) -> None:
    """Both families: GPT-2 Small and Llama-130M (the MERIT paper's second), nano shapes with --quick."""
    presets = {"gpt2": "nano", "llama_130m": "llama_nano"} if quick else {"gpt2": "gpt2", "llama_130m": "llama_130m"}
    for family, preset in presets.items():
        vocab = 512 if quick else (50304 if family == "gpt2" else 32128)
        config = GPTConfig.preset(preset, block_size=64 if quick else (1024 if family == "gpt2" else 256),
                                  vocab_size=vocab)
        check_model_steps(device, quick, family, config, batch=4 if quick else (16 if family == "gpt2" else 64))


def check_model_steps(device: torch.device, quick: bool, family: str, config: GPTConfig, batch: int) -> None:
    torch.manual_seed(0)
    idx = torch.randint(0, config.vocab_size, (batch, config.block_size + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]
    flash = nullcontext()
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        flash = sdpa_kernel(SDPBackend.FLASH_ATTENTION)  # fails loudly if flash cannot run
    losses = {}
    for compiled in (False, True) if device.type == "cuda" else (False,):
        torch.manual_seed(1)
        model = GPT(config).to(device)
        opt = MERIT(model.parameters(), lr=2e-4, betas=(0.9, 0.95), weight_decay=0.1)
        step_fn = torch.compile(model) if compiled else model
        times = []
        for step in range(3 + (3 if quick else 10)):
            start = time.perf_counter()
            with flash, torch.autocast(device.type, dtype=torch.bfloat16):
                _, loss = step_fn(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            if step == 0:
                losses[compiled] = loss.item()
        ms = 1e3 * sorted(times[3:])[len(times[3:]) // 2]
        tokens_per_s = batch * config.block_size / (ms / 1e3)
        mfu = model.estimate_mfu(tokens_per_s, peak_bf16_flops("H200"))
        label = f"model {family} {'compiled' if compiled else 'eager'} bf16 train step"
        results[label] = {"ms": ms, "tokens_per_s": tokens_per_s, "mfu": mfu, "first_step_s": times[0]}
        report(label, torch.isfinite(loss).item(),
               f"{ms:.1f} ms/step, {tokens_per_s:,.0f} tokens/s, MFU {100 * mfu:.1f}% of H200 bf16 "
               f"(first step {times[0]:.1f} s, loss {losses[compiled]:.4f})")
    if len(losses) == 2:
        report(f"model {family} compiled loss == eager loss", abs(losses[True] - losses[False]) < 2e-2,
               f"{losses[True]:.4f} vs {losses[False]:.4f}")
    ref = F.cross_entropy(model(x)[0].float().view(-1, config.vocab_size), y.reshape(-1))
    report(f"model {family} fp32 loss finite", torch.isfinite(ref).item(), f"{ref.item():.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small shapes and models (the CPU self-test)")
    parser.add_argument("--json", default="check_cuda.json", help="where every measured number is written")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is first imported, below
    elif not torch.cuda.is_available():
        sys.exit("check_cuda: no CUDA device here (use --device cpu --quick to run the checks on the CPU)")
    import triton

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton interpreter)"
    print(f"{name}; torch {torch.__version__}, triton {triton.__version__}", flush=True)
    check_optimizers(device, args.quick)
    if device.type == "cuda":
        check_speed(device)
    check_model(device, args.quick)
    if device.type == "cuda":
        check_train(device)
    results["failures"] = failures
    with open(args.json, "w") as file:
        json.dump({"device": name, "torch": torch.__version__, **results}, file, indent=2)
    print("all checks passed" if not failures else f"FAILED: {', '.join(failures)}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
