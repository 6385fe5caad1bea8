"""Replica groups past one cluster, on torchft (docs/scaling_out.md).

A run may be one of ``replica_groups`` groups, each its own torchrun job (DDP or FSDP2 inside it,
or one process), coordinated by a torchft lighthouse (``torchft_lighthouse --min_replicas 1 ...``) and
one ``torchft.Manager`` per group (``ReplicaMembership``). The groups split every global batch: rank r
of group g reads the rows of data rank g x W + r (``Layout.data_rank``), so G groups of W ranks
read what one job of G x W ranks would. Then either:

- ``local_steps=0``: every gradient is averaged across the groups at every step
  (training/parallel.py's ``AcrossReplicaGroups``: DDP's mean over the group's ranks, then the
  manager's over the groups in the step's quorum; ``FullyShardedAcrossReplicaGroups``: FSDP2's
  reduce-scattered shard, then the manager's mean of it). A group that fails (killed, its machine lost)
  interrupts one step, which the others drop (``should_commit`` is False: ``Step.committed``), and
  leaves the quorum; the others train on without it, each step then averaging fewer groups'
  gradients: a smaller effective batch, which the record says (below). The failed group, started
  again with the same command, joins at the next quorum and takes the step, weights, optimizer
  state, loader position and parts' state from a live peer (torchft's checkpoint transport:
  ``RunState.peer_state_dict``), from where it trains on in step with the others, bitwise.
- ``local_steps=H``: each group takes H steps of its own optimizer on its own share of the batch,
  then the groups meet (torchft's ``local_sgd``): ``localsgd`` averages the weights; ``diloco``
  averages the pseudo-gradients (the weights at the last meeting minus the group's own) and steps
  an outer SGD with Nesterov momentum from the last meeting's weights (outer_lr 0.7,
  outer_momentum 0.9: Douillard et al. 2023). A meeting a group fails in is dropped (DiLoCo: the
  round's steps undone, the weights back at the last meeting's); a group that starts again trains
  until the next meeting, where it takes a live peer's state (its steps since are lost).

That they train one model is checked, not assumed (torchft moves state only to a group behind the
quorum's highest step): at every quorum whose membership changed, before any state moves, the groups
exchange their job's identity and a group that trains something else is refused
(training/replica_checks.py, in torchft's process group: training/torchft_adapter.py); every
``replica_check_interval`` steps, after a membership change and after every meeting they compare
their weights' fingerprint and stop on a difference; a group resumed from its checkpoint trains only
beside another (``rejoin_timeout``); a lost lighthouse is waited for until ``replica_timeout``, then
every group stops with its resume command.

The quorum of a step is formed after the previous step (``ReplicaGroups.after_step``, the last
part by construction: train.py's ``LAST_PARTS``), so a joining group's new state is in place
before the next step is numbered; the first quorum when the loop starts. The step is committed or
dropped at the parts' ``commit``, before anything records it.

What a group records (metrics ``replicas/``, at each log step): the groups that took part in the
last step or meeting (``participants``) and the sequences whose gradients it averaged
(``effective_batch``); over the run, the tokens of the global batches whose gradients reached this
group's weights (``tokens_trained``) and those that did not (``tokens_lost``: the groups missing
from a step, a dropped step's whole batch), which add up to the run's ``tokens``; the steps or
meetings dropped (``dropped``) and the bytes this rank sent to the cross-group all-reduces
(``bytes_allreduced``); the last record, the digest of the weights (``weights_sha256``). A meeting
at which a group took a peer's state counts one share less: that group met with the peer's weights.
Its checkpoint holds the manager's state (its step and the batches
committed) and the local method's (the outer optimizer's momentum and the weights of the last
meeting), so a whole-job restart resumes bitwise, also in the middle of a round.

Where an inner optimizer or part needs care: Sophia-G's extra pass averages its gradient across
the groups like a step's (``local_steps=0``) or stays within the group (local steps); QK-Clip clips
each group's weights after its own steps with local steps (local, like the update), and is refused
averaging every step (each group's own batch would clip its weights apart from the others');
Schedule-Free AdamW's evaluated weights x are the optimizer's state, not the model's, and would not
meet: refused with local steps, as are float16 with local steps (the GradScaler's skipped steps
would shift the meetings), batch schedules and ZeRO-1 (configs/__init__.py).
"""
from __future__ import annotations

import hashlib
import os
import time
from datetime import timedelta
from urllib.parse import urlsplit

import torch
import torch.distributed as dist
from tqdm import tqdm

from optim.sharding import local
from training import distributed
from training.communication import nbytes
from training.distributed import Distributed
from training.parts import Part, Step
from training.replica_checks import JoinRefused, ReplicasStopped, job_identity, weight_split, weights_fingerprint

# The install line a run without torchft is told (requirements-ft.txt pins it).
INSTALL = "pip install -r requirements-ft.txt"
# How long a group starting up waits for its lighthouse to listen before it says it cannot reach it
# (a lighthouse started a moment before the groups, as the docs' commands do, is listening by then).
LIGHTHOUSE_WAIT_S = 10.0


class ReplicaMembership:
    """This job's membership of the replica groups: torchft's ``Manager`` (the quorum each step,
    the cross-group all-reduce, the commit, healing a joining group) and its process group across
    the groups (``pg``: the identity check at each new quorum, training/torchft_adapter.py); this
    job is group ``replica_id`` of ``group_count``."""

    def __init__(self, manager, pg, replica_id: int, group_count: int, store: dist.TCPStore | None):
        self.manager, self.pg, self.replica_id, self.group_count = manager, pg, replica_id, group_count
        self.store = store  # (a group of one process: the store torchft's manager meets in, held open)

    @classmethod
    def join(cls, config, ctx: Distributed) -> ReplicaMembership:
        """Connect to config.lighthouse as group config.replica_id (every rank of the job calls it)."""
        # torchft's Rust core logs every quorum and commit at "info": its warnings only, unless asked.
        os.environ.setdefault("RUST_LOG", "warn")
        try:
            import torchft  # noqa: F401 (the adapter's; imported first, so that its absence is what is said)
            from training import torchft_adapter as ft
        except ImportError as error:
            raise ValueError(f"replica_groups={config.replica_groups} needs torchft ({error}): {INSTALL}") from error
        lighthouse = lighthouse_address(config)
        if not ft.reachable(lighthouse, LIGHTHOUSE_WAIT_S):
            raise ValueError(f"lighthouse={lighthouse!r}: nothing listens there (tried for {LIGHTHOUSE_WAIT_S:g} s): "
                             f"start the lighthouse first (torchft_lighthouse --min_replicas 1 --bind "
                             f"[::]:{urlsplit(lighthouse).port}) or pass the address it listens on")
        timeout = timedelta(seconds=config.replica_timeout)
        pg = (ft.CheckedNCCL if ctx.device.type == "cuda" else ft.CheckedGloo)(timeout=timeout)
        store = None
        if ctx.enabled:  # torchrun's store (MASTER_ADDR, MASTER_PORT)
            address = {}
        else:  # one process: a store of its own
            store = dist.TCPStore("localhost", 0, 1, is_master=True, wait_for_workers=False)
            address = {"store_addr": "localhost", "store_port": store.port}
        manager = ft.Manager(
            pg=pg, load_state_dict=None, state_dict=None, min_replica_size=config.min_replicas,
            # (a synchronous quorum: a joining group's state is in place when start_quorum returns)
            use_async_quorum=False, timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
            # A lost lighthouse: its quorum asked again about every second until the timeout, so that one
            # restarted on its address within it finds the groups waiting (torchft retries none by default).
            quorum_retries=max(1, round(config.replica_timeout)),
            rank=ctx.rank, world_size=ctx.world_size, lighthouse_addr=lighthouse,
            # (the weights start equal on every group, by the seed: nothing to send at step 0)
            replica_id=f"nanomerit_replica_{config.replica_id}", init_sync=False, **address)
        return cls(manager, pg, config.replica_id, config.replica_groups, store)

    def allreduce(self, tensor: torch.Tensor) -> torch.futures.Future:
        """``tensor`` averaged over the groups in the quorum, in place, and a completed future of it.
        A failed all-reduce (a peer lost) leaves ``tensor`` undefined and is the manager's to
        report: the step is then not committed. (The future is a fresh one: torchft's own, of a
        failed collective, has no result to hand DDP's reducer, which then crashes.)"""
        self.manager.allreduce(tensor).wait()
        done = torch.futures.Future()
        done.set_result(tensor)
        return done

    @property
    def participants(self) -> int:
        return self.manager.num_participants()

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)


def lighthouse_address(config) -> str:
    """The lighthouse's address (config.lighthouse, else $TORCHFT_LIGHTHOUSE), checked to be http://HOST:PORT."""
    lighthouse = config.lighthouse or os.environ.get("TORCHFT_LIGHTHOUSE", "")
    if not lighthouse:
        raise ValueError(f"replica_groups={config.replica_groups} needs the lighthouse's address: pass "
                         f"--lighthouse=http://HOST:PORT (of torchft_lighthouse) or set TORCHFT_LIGHTHOUSE")
    try:
        parts = urlsplit(lighthouse)
        valid = parts.scheme in ("http", "https") and parts.hostname and parts.port is not None
    except ValueError:  # (a port that is no number, a bracket left open)
        valid = False
    if not valid:
        raise ValueError(f"lighthouse={lighthouse!r} is not an address of the form http://HOST:PORT: pass the "
                         f"address torchft_lighthouse listens on (its --bind port, 29510 by default)")
    return lighthouse


class ReplicaGroups(Part):
    """The replica groups' part in a run: the quorum between steps, the commit before an update,
    the local method's rounds (torchft's ``DiLoCo`` or ``LocalSGD`` around the optimizer), the
    checks that the groups train one model (training/replica_checks.py), the record (the module's
    docstring), and their state in checkpoints and for a joining group."""

    name = "replica_groups"
    metric_keys = ("replicas/",)

    def __init__(self, run):
        self.run, self.membership = run, run.layout.membership
        self.config = config = run.config
        self.local_steps = config.local_steps
        self.local = None  # torchft's DiLoCo or LocalSGD (torchft_adapter.LocalRounds), entered at start
        self.local_state: dict | None = None  # a checkpoint's, for the local method once it exists
        self.meetings = 0  # the manager's committed steps (with local steps: meetings) when last counted
        self.participants = self.effective_batch = 0
        self.tokens_trained = self.tokens_lost = self.dropped = 0
        self.healed = False  # this group took a peer's state at the last quorum
        self.resumed_at: int | None = None  # the step this process resumed its checkpoint at (start)

    @classmethod
    def build(cls, run) -> ReplicaGroups | None:
        config = run.config
        if not config.replica_groups:
            return None
        if config.local_steps:
            if run.schedule.total_steps % config.local_steps:
                raise ValueError(f"local_steps={config.local_steps} does not divide the run's "
                                 f"{run.schedule.total_steps} steps: its last steps would never meet; choose "
                                 f"max_steps (or max_tokens) a multiple of local_steps")
        return cls(run)

    # --- the run ---
    def start(self) -> None:
        manager, state = self.membership.manager, self.run.state
        self.resumed_at = state.step if self.run.resuming else None
        self.membership.pg.check_identity(self.config.replica_id, job_identity(self.config.to_dict()), self.run.device)
        manager.register_state_dict_fn("run", self._load_peer_state, state.peer_state_dict)
        self.meetings = manager.current_step()
        if self.local_steps:
            from training.torchft_adapter import LocalRounds
            run, config = self.run, self.config
            self.local = LocalRounds(config.local_method, manager, run.model, run.optimizer, self.local_steps,
                                     config.outer_lr, config.outer_momentum)
            # (the groups meet at the run's steps divisible by H)
            self.local.enter(steps_since_meeting=state.step % self.local_steps, state=self.local_state)
        else:
            self._quorum()  # (a joining group takes a peer's state here)
            self._wait_for_a_peer()
            self._check_weights_if_due()

    def _load_peer_state(self, state: dict) -> None:
        self.run.state.load_peer_state_dict(state)
        self.healed = True

    def _quorum(self) -> None:
        """The next step's quorum (a joining group takes a peer's state in it), then what the
        groups' identity check found (training/torchft_adapter.py)."""
        self.healed = False
        self.membership.manager.start_quorum()
        self._after_quorum()

    def _after_quorum(self) -> None:
        """A refusal of this group stops it; one of another group is said (its step is dropped)."""
        refusal, self.membership.pg.refusal = self.membership.pg.refusal, None
        if isinstance(refusal, JoinRefused):
            raise refusal
        if refusal is not None and self.run.ctx.is_main:
            tqdm.write(str(refusal))

    def _must_meet_a_peer(self) -> bool:
        """Whether this group may not train alone yet: resumed from its own checkpoint, it would train on
        from a state the other groups may have passed (they may have finished since it stopped), into a
        second model under the job's name (``rejoin_timeout`` 0: it may)."""
        return self.resumed_at is not None and bool(self.config.rejoin_timeout) and self.membership.group_count > 1

    def _alone(self, where: str) -> ReplicasStopped:
        return ReplicasStopped(
            f"replica group {self.membership.replica_id} resumed at step {self.resumed_at} and met no other group "
            f"{where}: training on alone could make a second model from a state the others have passed. If they "
            f"finished, the job is done (their checkpoints hold its model); if they are starting, start this group "
            f"again; to train this group on alone, start it with --rejoin_timeout=0")

    def _wait_for_a_peer(self) -> None:
        """A resumed group (``_must_meet_a_peer``) trains beside another group, or not at all within
        rejoin_timeout."""
        if not self._must_meet_a_peer() or self.membership.participants > 1:
            return
        timeout = self.config.rejoin_timeout
        if self.run.ctx.is_main:
            tqdm.write(f"replica group {self.membership.replica_id} resumed at step {self.resumed_at} and no other group "
                       f"is training: waiting up to rejoin_timeout={timeout:g} s for one")
        deadline = time.monotonic() + timeout
        while self.membership.participants < 2:
            if time.monotonic() > deadline:
                raise self._alone(f"within rejoin_timeout={timeout:g} s (a longer one waits longer)")
            time.sleep(1.0)
            self._quorum()

    def commit(self, step: Step) -> None:
        if self.local_steps:
            return
        step.committed = self.membership.manager.should_commit()
        self.membership.pg.member |= step.committed
        self._count(step.number, step.committed, own_share=False)

    def after_update(self, step: Step) -> None:
        if not (self.local_steps and step.number % self.local_steps == 0):
            return
        # The optimizer's step met the others (torchft's local_sgd: every parameter, DiLoCo its pseudo-gradient,
        # all-reduced once a meeting).
        self.run.layout.traffic.count(nbytes(self.run.model.parameters()), across_groups=True)
        committed = self.membership.manager.current_step() > self.meetings
        self.meetings = self.membership.manager.current_step()
        self._after_quorum()
        first_meeting = not self.membership.pg.member
        self.membership.pg.member |= committed
        if first_meeting and self._must_meet_a_peer() and self.membership.participants < 2:
            raise self._alone("at its first meeting")  # (torchft's meeting has no wait: its checkpoint as it was)
        # A group that took a peer's state at this meeting met with the peer's own weights: one share, not two.
        copies = self._check_weights() if committed else 0
        self.healed = False  # (torchft's next meeting asks for the next quorum itself)
        self._count(step.number, committed, own_share=self.config.local_method == "localsgd",
                    steps=self.local_steps, copies=copies)

    def after_step(self, step: Step) -> None:
        if self.local_steps or step.final:
            return
        self._quorum()  # the next step's (a joining group takes a peer's state here)
        self._check_weights_if_due()

    def _check_weights_if_due(self) -> None:
        """After a quorum: the weights' check where the groups' membership changed or the step is due
        (the same verdict on every group of the quorum: its members agree on both)."""
        if self.membership.pg.reconfigured or self.run.state.step % self.config.replica_check_interval == 0:
            self._check_weights()

    def _check_weights(self) -> int:
        """Compare this group's weights with those of the quorum's other groups at the same committed
        step (training/replica_checks.py): equal, or the run stops naming who differs. Returns the
        groups that took a peer's state at the last quorum. Every group of the quorum calls it at the
        same moments (after a new quorum, every replica_check_interval steps, after a meeting)."""
        membership, manager = self.membership, self.membership.manager
        membership.pg.reconfigured = False
        if manager.errored() or membership.participants < 2:
            return 0
        model, device = self.run.model, self.run.device
        head = torch.tensor([membership.replica_id, manager.current_step(), self.healed], dtype=torch.float64,
                            device=device)
        mine = torch.cat([head, weights_fingerprint([local(p) for p in model.parameters()])])
        try:
            rows = membership.pg.allgather_tensor(mine)
        except Exception as error:  # (a peer lost: the manager drops the next step, as its own collectives would)
            manager.report_error(error)
            return 0
        split = weight_split({int(row[0]): row[3:] for row in rows if row[1] == mine[1]},
                             [name for name, _ in model.named_parameters()])
        if distributed.any_rank(split is not None, self.run.ctx):  # (FSDP2: a shard a rank; the job stops together)
            split = split or "another rank's shard differs"
        if split:
            raise ReplicasStopped(f"replica groups hold different weights at step {self.run.state.step}: {split}. They "
                                  f"no longer train one model, and this run stops; their checkpoints since the last "
                                  f"check (every replica_check_interval={self.config.replica_check_interval} steps) "
                                  f"may differ too")
        return int(sum(row[2] for row in rows))

    def _count(self, number: int, committed: bool, own_share: bool, steps: int = 1, copies: int = 0) -> None:
        """The tokens of the ``steps`` global batches up to step ``number`` that reached this group's
        weights, and those lost: ``committed``, the participants' shares but ``copies`` (groups that
        met with a peer's weights); dropped, none (or the group's own, where a dropped meeting keeps
        the local weights: ``own_share``)."""
        groups, schedule = self.membership.group_count, self.run.schedule.batch_schedule
        tokens = sum(schedule.tokens_per_step(n - 1) for n in range(number - steps + 1, number + 1))
        self.participants = self.membership.participants
        shares = self.participants - copies if committed else int(own_share)
        self.effective_batch = shares * schedule.phase(number - 1).batch // groups
        self.tokens_trained += tokens * shares // groups
        self.tokens_lost += tokens - tokens * shares // groups
        self.dropped += not committed

    def measure(self, step: Step) -> dict:
        record = {"replicas/participants": self.participants, "replicas/effective_batch": self.effective_batch,
                  "replicas/tokens_trained": self.tokens_trained, "replicas/tokens_lost": self.tokens_lost,
                  "replicas/dropped": self.dropped, "replicas/bytes_allreduced": self.run.layout.traffic.across}
        if step.final:  # (what scripts.report compares across the groups: did they end with one model)
            record["replicas/weights_sha256"] = weights_digest(self.run.model, self.run.ctx)
        return record

    def close(self) -> None:
        if self.local is not None:
            self.local.exit()
        self.membership.shutdown()

    # --- state (checkpoints, and a joining group's) ---
    def state_dict(self) -> dict:
        state = {"manager": self.membership.manager.state_dict(), "tokens_trained": self.tokens_trained,
                 "tokens_lost": self.tokens_lost, "dropped": self.dropped,
                 "bytes_allreduced": self.run.layout.traffic.across}
        if self.local is not None and (local := self.local.state_dict()) is not None:
            state["local"] = local
        return state

    def load_state_dict(self, state: dict) -> None:
        self.membership.manager.load_state_dict(state["manager"])
        self.tokens_trained, self.tokens_lost, self.dropped = (state["tokens_trained"], state["tokens_lost"],
                                                               state["dropped"])
        self.run.layout.traffic.across = state["bytes_allreduced"]
        self.local_state = state.get("local")


def weights_digest(model, ctx: Distributed) -> str:
    """The sha256 of the model's weights as stored (every rank's shard under FSDP2, in rank order): equal
    digests are bitwise-equal weights."""
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(local(parameter).detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return hashlib.sha256("".join(distributed.all_gather_objects(digest.hexdigest(), ctx)).encode()).hexdigest()
