"""The project's C++/OpenMP kernels for CPU tensors, built into one extension on first use.

``csrc/`` holds them: the optimizers' fused passes (``trust_ratio.cpp``, ``sign.cpp``,
``adam_family.cpp``, ``sgd.cpp``, ``adafactor.cpp``, wrapped by optim/backends/cpp.py), the training
loop's sum of squares (``norm.cpp``, for training/clipping.py) and GPT-2's tanh GELU (``gelu.cpp``,
wrapped here for model.py); ``common.h`` is what they share. ``build`` compiles them with
``torch.utils.cpp_extension.load`` into torch's extensions directory (``TORCH_EXTENSIONS_DIR``,
default ``~/.cache/torch_extensions``) the first time, and loads them from there afterwards; torch's
build lock there makes concurrent ranks wait for one build. Building needs a C++ compiler and ninja
(the pip package is found); without them each user falls back to torch's own ops, with one warning.
"""
import functools
import math
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor

SOURCES = [Path(__file__).with_name("csrc") / name for name in
           ("trust_ratio.cpp", "sign.cpp", "adam_family.cpp", "sgd.cpp", "adafactor.cpp", "norm.cpp", "gelu.cpp")]


@functools.cache
def build() -> Exception | None:
    """Build (or reuse) and load the extension, once per process: None, or why it failed."""
    from torch.utils import cpp_extension
    # One build per instruction set, with the flags of the kernels torch itself picked for this CPU,
    # so a shared cache never hands a machine code it cannot run; CPU_CAPABILITY selects the same
    # width of ATen's vector types (at::vec) as torch's own kernels use.
    isa = torch.backends.cpu.get_cpu_capability()
    flags = {"AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"],
             "AVX2": ["-mavx2", "-mfma"]}.get(isa, [])
    capability = isa if flags else "DEFAULT"
    name = f"nanomerit_kernels_{isa.lower()}"
    start = time.perf_counter()
    try:
        _put_pip_ninja_on_path()
        # -ffp-contract=off: no fused multiply-adds, so an element's result does not depend on
        # whether it falls in a vectorised loop body or in its scalar peel or tail, which move with
        # the tensor's address and length: a row shard (FSDP2) steps bitwise like the whole tensor.
        cpp_extension.load(name, [str(s) for s in SOURCES], is_python_module=False,
                           extra_cflags=["-O3", "-fopenmp", "-fno-math-errno", "-ffp-contract=off", *flags,
                                         f"-DCPU_CAPABILITY={capability}", f"-DCPU_CAPABILITY_{capability}"],
                           extra_ldflags=["-fopenmp"])
    except Exception as error:  # no compiler, no ninja, a read-only cache, ...
        return error
    _register_gelu_autograd()
    print(f"kernels: C++ kernels {name} built or loaded in {time.perf_counter() - start:.1f} s",
          file=sys.stderr, flush=True)
    return None


def ready() -> bool:
    """Whether ``build`` has built and loaded the extension in this process."""
    return build.cache_info().currsize > 0 and build() is None


def failure(error: Exception) -> str:
    """A build failure in one line: its type and the build log's last lines, not the whole log."""
    last_lines = " | ".join(str(error).strip().splitlines()[-3:])
    return f"the C++ kernels could not be built ({type(error).__name__}: {last_lines})"


def _put_pip_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the pip package installs it next to the interpreter."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"


def gelu_tanh_takes(x: Tensor) -> bool:
    """Whether ``gelu_tanh`` runs the kernel on ``x``: a contiguous float32 CPU tensor, once built.
    An eager call builds the extension (once: a failure warns and leaves torch's GELU); code that
    torch.compile traces takes whether it is built (a run validates eagerly before it trains)."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or not x.is_contiguous():
        return False
    if torch.compiler.is_compiling():
        return _gelu_kernel_built
    return _build_gelu_kernel()


_gelu_kernel_built = False  # what _build_gelu_kernel found, for traced code (which cannot build)


def _build_gelu_kernel() -> bool:
    global _gelu_kernel_built
    error = build()
    if error is not None:
        _warn_gelu_fallback(failure(error))
    _gelu_kernel_built = error is None
    return _gelu_kernel_built


@functools.cache
def _warn_gelu_fallback(why: str) -> None:
    warnings.warn(f"model: {why}; the MLP uses torch's tanh GELU (the same function, about 3x slower "
                  f"on a CPU)", RuntimeWarning, stacklevel=4)


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), through csrc/gelu.cpp."""
    return torch.ops.nanomerit.gelu_tanh(x)


BETA, KAPPA = math.sqrt(2 / math.pi), 0.044715


def _save_inputs(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _gelu_backward(ctx, grad: Tensor) -> Tensor:
    (x,) = ctx.saved_tensors
    return torch.ops.nanomerit.gelu_tanh_backward(grad.contiguous(), x)


def _gelu_backward_backward(ctx, grad_dx: Tensor) -> tuple[Tensor, Tensor]:
    """The backward's own derivatives, for a Hessian's double backward (study/hessian.py), in torch
    ops: d/dgrad = gelu'(x), d/dx = grad gelu''(x), with s = sigmoid(2u), s' = 2 s (1 - s) u',
    gelu' = s + x s', gelu'' = 2 s' + x s'', s'' = 2 ((1 - 2s) s' u' + s (1 - s) u'')."""
    grad, x = ctx.saved_tensors
    du = BETA * (1 + 3 * KAPPA * x * x)
    s = torch.sigmoid(2 * BETA * (x + KAPPA * x ** 3))
    ds = 2 * s * (1 - s) * du
    d2s = 2 * ((1 - 2 * s) * ds * du + s * (1 - s) * 6 * BETA * KAPPA * x)
    return grad_dx * (s + x * ds), grad_dx * grad * (2 * ds + x * d2s)


@functools.cache  # once per process, though a test may clear build's cache
def _register_gelu_autograd() -> None:
    """gelu_tanh's derivatives (twice differentiable) and the shapes torch.compile traces."""
    torch.library.register_autograd("nanomerit::gelu_tanh", _gelu_backward, setup_context=_save_inputs)
    torch.library.register_autograd("nanomerit::gelu_tanh_backward", _gelu_backward_backward,
                                    setup_context=_save_inputs)
    torch.library.register_fake("nanomerit::gelu_tanh")(torch.empty_like)
    torch.library.register_fake("nanomerit::gelu_tanh_backward")(lambda grad, x: torch.empty_like(x))
