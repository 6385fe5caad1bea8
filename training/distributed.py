"""Process-group setup for torchrun (NCCL on CUDA, gloo on CPU), and the few collectives the loop needs."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: str = "auto") -> Distributed:
    """Read torchrun's environment (a plain `python train.py` is a world of one)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        torch_device = torch.device("cuda", local_rank)
    else:
        torch_device = torch.device(device)
    if world_size > 1:
        dist.init_process_group(backend="nccl" if device == "cuda" else "gloo", store=_restart_store(world_size),
                                rank=rank, world_size=world_size, device_id=torch_device if device == "cuda" else None)
    return Distributed(rank, local_rank, world_size, torch_device)


def launcher() -> list[str]:
    """The command that starts train.py as this process was started: ``python``, or torchrun with
    this launch's processes per node (and nodes: the rendezvous endpoint is the user's to fill)."""
    world_size, per_node = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if world_size == 1:
        return ["python"]
    if world_size == per_node:
        return ["torchrun", "--standalone", f"--nproc_per_node={per_node}"]
    return ["torchrun", f"--nnodes={world_size // per_node}", f"--nproc_per_node={per_node}", "--rdzv_backend=c10d",
            "--rdzv_endpoint=HOST:PORT"]


# How long a rank other than 0 waits before it fails (see fail): far longer than torchrun's
# monitor interval (0.1 s by default), which kills the other workers once one has failed.
FAIL_DELAY_S = 3.0


def fail(message: str) -> NoReturn:
    """Exit non-zero with ``message``, said once under torchrun.

    Every rank of a launch meets the same config, run-folder and data errors. The global rank 0
    prints its message and writes it to torchrun's error file (``TORCHELASTIC_ERROR_FILE``), so
    torchrun's closing failure summary shows it as the root cause, after every worker's output,
    in place of its advice on enabling tracebacks. Another rank waits first: when rank 0 fails
    too, torchrun stops this rank during the wait and the message is said once; when the error
    is this rank's own, the wait ends and its message reaches the summary."""
    rank = int(os.environ.get("RANK", 0))
    if rank != 0:
        time.sleep(FAIL_DELAY_S)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # (the format torchrun's own @record writes)
        with open(error_file, "w") as f:
            json.dump({"message": {"message": message, "extraInfo": {"py_callstack": message,
                                                                     "timestamp": str(int(time.time()))}}}, f)
    sys.exit(message if rank == 0 else 1)  # (SystemExit prints a message to stderr)


def _restart_store(world_size: int) -> dist.Store | None:
    """Under torchrun, a store whose keys are this restart attempt's own.

    Workers restarted by ``torchrun --max-restarts`` reach the agent's store again, where the
    keys of the failed attempt's process group are still set (torch 2.13 adds no per-attempt
    prefix there), and the gloo ranks of the new attempt then read a dead peer's address and
    fail to connect. None (torch's env:// default) outside torchrun."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and
                          int(os.environ["RANK"]) == 0)
    return dist.PrefixStore(f"/nanomerit/attempt_{attempt}", store)


def teardown(ctx: Distributed):
    """Leave the process group.

    A gloo worker thread frees each finished collective's tensors itself, holding its work-queue
    lock and taking the GIL; the process group's destructor (run when the DDP model releases it,
    with the GIL held) takes that lock: were a worker still freeing a work then, each would wait
    for the other forever (seen at exit after ZeRO-1's broadcasts). Sleeping first releases the
    GIL for the workers to finish freeing what the last collectives left."""
    if ctx.enabled:
        time.sleep(0.1)
        dist.destroy_process_group()


def all_reduce_mean(tensor: torch.Tensor, ctx: Distributed) -> torch.Tensor:
    if ctx.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG if tensor.is_cuda else dist.ReduceOp.SUM)
        if not tensor.is_cuda:  # gloo has no AVG
            tensor /= ctx.world_size
    return tensor


def all_reduce_max(tensor: torch.Tensor, ctx: Distributed) -> torch.Tensor:
    if ctx.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def any_rank(flag: bool, ctx: Distributed) -> bool:
    """True on every rank if `flag` is True on any rank (e.g. a SIGTERM seen by one rank)."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([int(flag)], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def all_gather_objects(obj, ctx: Distributed) -> list:
    if not ctx.enabled:
        return [obj]
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: Distributed):
    if ctx.enabled:
        dist.barrier()
