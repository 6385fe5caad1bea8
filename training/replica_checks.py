"""What replica groups compare so that they train one model (training/replicas.py, docs/scaling_out.md).

torchft moves state to a group only when it is behind the quorum's highest step, so groups at the
same step are taken to hold the same model. Two checks make that true or say it is not, each over
the groups of a quorum:

* **The job's identity**, whenever a quorum's membership changes (a group joins or leaves), before
  any state moves between the groups: the keys a resume compares (training/checkpoint/format.py's
  ``RECORDED``: the model, the optimizer and its settings, the schedule, the batch, the seeds),
  with the data as its shards' ``data.shards.fingerprint`` in place of the folder's path (another
  cluster's copy lies elsewhere). The job's groups are those that committed a step (or a meeting)
  in their process; a group that differs from them is refused, its message naming each key that differs and both
  values. Where no group has trained yet (the job's start), a group that differs from the others'
  majority is refused, and every group where there is none.
* **The weights' fingerprint**, every ``replica_check_interval`` steps, after a membership change
  and after every meeting (local steps): per tensor, its sum and its sum of squares in float64.
  Groups at the same committed step hold bitwise the same weights (each update is the same
  averaged gradient through the same arithmetic), so any difference is two models: the run stops,
  naming the groups, the step and the largest difference.
"""
from __future__ import annotations

from collections import Counter

import torch

from data.shards import fingerprint as data_fingerprint
from training.checkpoint import RECORDED

class ReplicasStopped(Exception):
    """The replica groups cannot train on as one model: the run stops with this message (train.py
    adds this group's resume command where ``resumable``)."""

    resumable = False


class JoinRefused(ReplicasStopped):
    """This group trains something else than the job's groups (``refusals``)."""

    def __init__(self, group: int, why: str):
        super().__init__(f"replica group {group} is refused by the job's replica groups before any state moved "
                         f"between them: {why}")


class PeerRefused(Exception):
    """This group refused others of its quorum: the step (or meeting) is dropped, and training goes on."""

    def __init__(self, group: int, refused: dict[int, str]):
        super().__init__(f"replica group {group} refused group{'s' * (len(refused) > 1)} "
                         f"{', '.join(map(str, sorted(refused)))}, which train{'s' * (len(refused) == 1)} something "
                         f"else ({'; '.join(why.split('. ')[0] for why in refused.values())}): dropped the step")


class LighthouseLost(ReplicasStopped):
    """No quorum came from the lighthouse within the timeout: every group stops, resumable."""

    resumable = True


def job_identity(config: dict) -> dict:
    """What a group trains (``config``: a resolved config's dict), as the groups compare it."""
    identity = {key: config[key] for key in sorted(RECORDED) if key in config and key != "data_dir"}
    identity["data"] = data_fingerprint(config["data_dir"])
    return identity


def refusals(entries: list[dict]) -> dict[int, str]:
    """{group: why it is refused} for the groups of a quorum, each entry ``{"group": id, "member":
    whether it committed a step (or a meeting) in its process, "identity": its job_identity}`` (the module's rules):
    the keys that differ, both values, and how to make a change that every group is to make."""
    members = [e for e in entries if e["member"]]
    if members:
        reference = min(members, key=lambda e: e["group"])
    else:  # the job's start: the identity most groups share, if most do
        counts = Counter(_key(e["identity"]) for e in entries)
        shared, count = counts.most_common(1)[0]
        reference = next(e for e in entries if _key(e["identity"]) == shared) if 2 * count > len(entries) else None
    refused = {}
    for entry in entries:
        if reference is None:
            others = [e for e in entries if e is not entry]
            refused[entry["group"]] = "; ".join(f"with group {o['group']}: {differences(entry, o)}" for o in others)
        elif entry["identity"] != reference["identity"]:
            refused[entry["group"]] = differences(entry, reference)
    keys = sorted({key for e in entries for key in e["identity"]
                   if len({repr(o["identity"].get(key)) for o in entries}) > 1} - {"data"})
    return {group: f"{why}. Start it with the job's settings; a change for every group is a whole-job restart: "
                   f"stop every group, then start each with --resume=auto --allow_changes={','.join(keys)}"
            for group, why in refused.items()}


def differences(entry: dict, other: dict) -> str:
    """Each key on which two entries' identities differ, with both values."""
    mine, theirs = entry["identity"], other["identity"]
    keys = sorted(key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key))
    return "; ".join(f"{key}: {mine.get(key)!r} in group {entry['group']}, {theirs.get(key)!r} in group "
                     f"{other['group']}" for key in keys)


def _key(identity: dict) -> str:
    return repr(sorted(identity.items()))


def weights_fingerprint(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Each tensor's sum and sum of squares in float64, as one float64 vector (on the tensors' device)."""
    sums = []
    for t in tensors:
        t = t.detach()
        sums += [t.sum(dtype=torch.float64), torch.linalg.vector_norm(t, dtype=torch.float64).square()]
    return torch.stack(sums)


def weight_split(rows: dict[int, torch.Tensor], names: list[str]) -> str | None:
    """None if every group's fingerprint (``rows``: {group: weights_fingerprint}) is the same, else
    which groups hold which weights and the largest difference, relative to the tensor's scale."""
    clusters: dict[bytes, list[int]] = {}
    for group, row in sorted(rows.items()):
        clusters.setdefault(row.cpu().numpy().tobytes(), []).append(group)
    if len(clusters) == 1:
        return None
    stacked = torch.stack([row.cpu() for row in rows.values()])
    spread = stacked.max(0).values - stacked.min(0).values
    # (a sum against its tensor's norm; a sum of squares against itself)
    scale = stacked[:, 1::2].sqrt().amax(0).repeat_interleave(2).clamp_min(1e-30)
    scale[1::2] = scale[1::2].square()
    relative = spread / scale
    worst = int(relative.argmax())
    kind = "sum of squares" if worst % 2 else "sum"
    held = " | ".join("groups " + ", ".join(map(str, groups)) if len(groups) > 1 else f"group {groups[0]}"
                      for groups in clusters.values())
    return (f"the weights differ between {held}: {names[worst // 2]}'s {kind} by {relative[worst]:.3g} of its "
            f"scale")
