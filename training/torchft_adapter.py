"""torchft as replica groups use it (training/replicas.py): the one module that imports torchft,
imported only by runs that have replica groups.

* ``CheckedGloo`` / ``CheckedNCCL``: torchft's process group across the groups, which torchft
  reconfigures for each new quorum (its membership changed) and then, before anything else, moves
  state to the groups behind. Here the reconfigured group first exchanges the groups' identities
  (training/replica_checks.py) and raises where one is refused: torchft then moves no state and
  drops the step (or the meeting). Its ``allgather_bytes`` serves the weights' check too.
* ``Manager``: torchft's, whose quorum failing (the lighthouse gone, no quorum in time) is one
  ``LighthouseLost`` naming the lighthouse, instead of torchft's raw message.
* ``LocalRounds``: torchft's ``LocalSGD`` or ``DiLoCo`` around the inner optimizer (local steps),
  with what a checkpoint keeps of them.

torchft publishes no API for some of what this needs (the manager's client, the number of steps
since a meeting, DiLoCo's outer optimizer and last meeting's weights): those names are reached
here only, listed in ``UNPUBLISHED``, and ``missing_internals`` says which a torchft release lacks
(tests/test_torchft_adapter.py runs it), so the pin in requirements-ft.txt can move with confidence.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import re
import socket
import time
from datetime import timedelta
from urllib.parse import urlsplit

import torch
import torchft
from torch.distributed.distributed_c10d import AllgatherOptions
from torchft import local_sgd
from torchft.process_group import ProcessGroupDummy, ProcessGroupGloo, ProcessGroupNCCL

from training.replica_checks import JoinRefused, LighthouseLost, PeerRefused, refusals


class _IdentityCheck:
    """The identity exchange at each reconfiguration (see the module's docstring), mixed into a
    torchft process group. ``refusal``: the last reconfiguration's, for the loop to act on."""

    def check_identity(self, group: int, identity: dict, device: torch.device) -> None:
        self.group, self.identity, self.device = group, identity, device
        self.member = False  # whether this process committed a step (or a meeting): one of the job's groups
        self.reconfigured = False  # a new quorum since the loop last looked
        self.refusal: JoinRefused | PeerRefused | None = None

    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int, *args, **kwargs) -> None:
        super().configure(store_addr, replica_id, rank, world_size, *args, **kwargs)
        self.world_size, self.reconfigured = world_size, True
        mine = json.dumps({"group": self.group, "member": self.member, "identity": self.identity})
        entries = [json.loads(entry) for entry in self.allgather_bytes(mine.encode())]
        refused = refusals(entries)
        self.refusal = (JoinRefused(self.group, refused[self.group]) if self.group in refused
                        else PeerRefused(self.group, refused) if refused else None)
        if self.refusal is not None:
            raise self.refusal  # (torchft then drops the step without moving any state: the module's docstring)

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        """Every group's ``payload`` (in the quorum's order), of any lengths."""
        length = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        lengths = self.allgather_tensor(length)
        buffer = torch.zeros(int(max(lengths)), dtype=torch.uint8, device=self.device)
        buffer[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return [bytes(row[:int(n)].cpu().numpy()) for row, n in zip(self.allgather_tensor(buffer), lengths)]

    def allgather_tensor(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every group's ``tensor`` (of one shape), in the quorum's order."""
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self.allgather([gathered], [tensor], AllgatherOptions()).wait()
        return gathered


class CheckedGloo(_IdentityCheck, ProcessGroupGloo):
    pass


class CheckedNCCL(_IdentityCheck, ProcessGroupNCCL):
    pass


class _QuietRefusals(logging.Filter):
    """torchft logs an exception in its reconfiguration with its traceback: a refusal is said once,
    by the loop, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], (JoinRefused, PeerRefused)))


logging.getLogger("torchft.manager").addFilter(_QuietRefusals())


class Manager(torchft.Manager):
    """torchft's manager (the quorum, the cross-group all-reduce, the commit, healing), whose
    failed quorum is a ``LighthouseLost`` naming the lighthouse and what happened."""

    def __init__(self, *args, lighthouse_addr: str, **kwargs):
        self.lighthouse = lighthouse_addr
        super().__init__(*args, lighthouse_addr=lighthouse_addr, **kwargs)
        self._client = _QuorumIds(self._client)

    def start_quorum(self, allow_heal: bool = True, shrink_only: bool = False,
                     timeout: timedelta | None = None) -> None:
        try:
            super().start_quorum(allow_heal, shrink_only, timeout)
        except Exception as error:  # (torchft's Rust client: a RuntimeError or a TimeoutError)
            waited = (timeout or self._quorum_timeout).total_seconds()
            state = "does not answer" if not reachable(self.lighthouse) else "formed no quorum with this group"
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            port = urlsplit(self.lighthouse).port
            raise LighthouseLost(f"the lighthouse at {self.lighthouse} {state} within replica_timeout={waited:g} s "
                                 f"(torchft: {reason}): every group stops here. Start the lighthouse again on its "
                                 f"address (torchft_lighthouse --min_replicas N --bind [::]:{port}), then every group "
                                 f"with --resume") from error


class _QuorumIds:
    """torchft's client of the group's manager server, whose quorums are numbered by what they are.

    torchft reconfigures its process group only when the lighthouse's quorum id changes, and a
    lighthouse started again numbers its quorums from 1 again: a group whose first quorum from it
    has the id of its last from the old one kept a process group of other members, and its next
    collective waited for a group that was not in it (seen: one group timed out, the other trained
    on alone). Here a quorum's id is a number of the lighthouse's id and its members (the same for
    every group of the quorum): a new lighthouse's quorums reconfigure whenever their members differ."""

    def __init__(self, client):
        self.client = client

    def _quorum(self, *args, **kwargs):
        quorum = self.client._quorum(*args, **kwargs)
        members = f"{quorum.quorum_id}:{','.join(sorted(quorum.replica_ids))}"
        return _Renumbered(quorum, int(hashlib.sha256(members.encode()).hexdigest()[:15], 16))

    def __getattr__(self, name: str):
        return getattr(self.client, name)


class _Renumbered:
    """A torchft quorum result with another ``quorum_id``."""

    def __init__(self, quorum, quorum_id: int):
        self.quorum, self.quorum_id = quorum, quorum_id

    def __getattr__(self, name: str):
        return getattr(self.quorum, name)


def reachable(address: str, within: float = 0.0) -> bool:
    """Whether something listens at ``address`` (http://HOST:PORT), asked until it does or ``within`` seconds pass."""
    parts, deadline = urlsplit(address), time.monotonic() + within
    while True:
        try:
            with socket.create_connection((parts.hostname, parts.port), timeout=2.0):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)


def dummy_group() -> ProcessGroupDummy:
    """A process group of one that communicates nothing (DDP's, where a hook does the reduction)."""
    return ProcessGroupDummy(0, 1)


class LocalRounds:
    """torchft's ``LocalSGD`` (``method`` "localsgd": the weights averaged at each meeting) or
    ``DiLoCo`` (the pseudo-gradients averaged, an outer SGD with Nesterov momentum stepped) around
    ``optimizer``, the groups meeting every ``sync_every`` steps."""

    def __init__(self, method: str, manager, model: torch.nn.Module, optimizer, sync_every: int,
                 outer_lr: float, outer_momentum: float):
        if method == "localsgd":
            self.rounds = local_sgd.LocalSGD(manager, model, optimizer, sync_every=sync_every)
        else:
            outer = torch.optim.SGD(model.parameters(), lr=outer_lr, momentum=outer_momentum, nesterov=True)
            self.rounds = local_sgd.DiLoCo(manager, [model], optimizer, outer, sync_every=sync_every)

    def enter(self, steps_since_meeting: int, state: dict | None) -> None:
        """Start the rounds ``steps_since_meeting`` steps after a meeting (torchft counts from its
        start), from a checkpoint's ``state_dict`` (None: fresh)."""
        if state is not None and self._fragment is not None:
            self._fragment._outer_optimizer.load_state_dict(state["outer_optimizer"])
            for name, weights in state["met_weights"].items():
                self._fragment.original_parameters[name].copy_(weights)
        self.rounds._local_step = steps_since_meeting
        self.rounds.__enter__()

    def exit(self) -> None:
        self.rounds.__exit__(None, None, None)

    def state_dict(self) -> dict | None:
        """DiLoCo's outer momentum and the weights of the last meeting; None for LocalSGD (no state)."""
        if self._fragment is None:
            return None
        return {"outer_optimizer": self._fragment._outer_optimizer.state_dict(),
                "met_weights": {name: t.clone() for name, t in self._fragment.original_parameters.items()}}

    @property
    def _fragment(self):
        """DiLoCo's one fragment (the whole model), None for LocalSGD."""
        return self.rounds._fragments[0] if isinstance(self.rounds, local_sgd.DiLoCo) else None


# What this module reaches in torchft that torchft does not publish: (where, the name, what it serves here).
UNPUBLISHED = (
    ("Manager.__init__", "self._client", "the manager server's client (_QuorumIds renumbers its quorums)"),
    ("Manager.__init__", "self._quorum_timeout", "the quorum's timeout (LighthouseLost says how long it waited)"),
    ("ManagerClient", "_quorum", "the quorum call that _QuorumIds wraps"),
    ("LocalSGD", "self._local_step", "the steps since the last meeting (a resumed run's)"),
    ("DiLoCo", "self._local_step", "the steps since the last meeting (a resumed run's)"),
    ("DiLoCo", "self._fragments", "DiLoCo's fragments (one: the whole model)"),
    ("_StreamingDiLoCoFragment", "self._outer_optimizer", "the outer SGD with its momentum (checkpointed)"),
    ("_StreamingDiLoCoFragment", "self.original_parameters", "the weights of the last meeting (checkpointed)"),
)


def missing_internals() -> list[str]:
    """The entries of ``UNPUBLISHED`` the installed torchft lacks, each as "where.name (what it
    serves)". An attribute is looked for where its class's source assigns it (the constructors
    need a lighthouse to run); the client's method on its class."""
    from torchft._torchft import ManagerClient
    classes = {"Manager.__init__": torchft.Manager.__init__, "LocalSGD": local_sgd.LocalSGD, "DiLoCo": local_sgd.DiLoCo,
               "_StreamingDiLoCoFragment": getattr(local_sgd, "_StreamingDiLoCoFragment", None)}
    missing = []
    for where, name, serves in UNPUBLISHED:
        if where == "ManagerClient":
            found = hasattr(ManagerClient, name)
        else:
            found = classes.get(where) is not None and re.search(rf"{re.escape(name)}\s*(:[^=\n]*)?=",
                                                                  inspect.getsource(classes[where])) is not None
        if not found:
            missing.append(f"{where}: {name} ({serves})")
    return missing
