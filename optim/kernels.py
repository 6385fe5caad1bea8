"""The optimizers' C++/OpenMP kernels for CPU tensors (``csrc/``), and when they apply.

One extension holds them all: the two passes of the trust-ratio optimizers
(``csrc/trust_ratio.cpp``, see optim/passes.py) and the one-sweep steps of Lion and Sophia-G
(``csrc/sign.cpp``). It is built on first use with ``torch.utils.cpp_extension.load`` into
torch's extensions directory (``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``)
and reused from there; torch's build lock there makes concurrent ranks wait for one build.

Each optimizer keeps a torch implementation of the same step, which is the reference the kernels
are tested against and what runs for anything the kernels do not take: other dtypes or devices
(CUDA tensors: optim/triton_ops.py), non-contiguous tensors, a failed build (one warning), or
``NANOMERIT_OPTIM_EXTENSION=0``.
"""
import functools
import os
import shutil
import warnings
from pathlib import Path

import torch
from torch import Tensor

# Tests flip this to compare the kernels against the torch implementations.
USE = os.environ.get("NANOMERIT_OPTIM_EXTENSION", "1") != "0"
DTYPES = (torch.float32, torch.bfloat16, torch.float64)
_SOURCES = [Path(__file__).with_name("csrc") / name for name in ("trust_ratio.cpp", "sign.cpp")]


def usable(p: Tensor, *others: Tensor, matrix: bool = False) -> bool:
    """Whether the kernels take p and ``others`` (contiguous CPU tensors of one supported dtype,
    p a matrix if ``matrix``), building them on the first call."""
    return (USE and p.device.type == "cpu" and p.dtype in DTYPES
            and (p.dim() == 2 or not matrix) and p.is_contiguous()
            and all(t.dtype == p.dtype and t.device == p.device and t.is_contiguous() for t in others)
            and built())


@functools.cache
def built() -> bool:
    """Build (or reuse) and load the kernels once per process; False, with one warning, if that fails."""
    from torch.utils import cpp_extension
    # One build per instruction set, with the flags of the kernels torch itself picked for this CPU,
    # so a shared cache never hands a machine code it cannot run.
    isa = torch.backends.cpu.get_cpu_capability()
    flags = {"AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"],
             "AVX2": ["-mavx2", "-mfma"]}.get(isa, [])
    try:
        _put_pip_ninja_on_path()
        cpp_extension.load(f"nanomerit_kernels_{isa.lower()}", [str(s) for s in _SOURCES], is_python_module=False,
                           extra_cflags=["-O3", "-fopenmp", "-fno-math-errno", *flags],
                           extra_ldflags=["-fopenmp"])
    except Exception as error:  # no compiler, no ninja, a read-only cache, ...
        last_lines = " | ".join(str(error).strip().splitlines()[-3:])  # not the whole build log
        warnings.warn(f"optim: the C++ optimizer kernels could not be built ({type(error).__name__}: "
                      f"{last_lines}); the optimizers use their slower torch implementations",
                      RuntimeWarning, stacklevel=4)
        return False
    return True


def _put_pip_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the pip package installs it next to the interpreter."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
