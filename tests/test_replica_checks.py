"""What replica groups compare (training/replica_checks.py), without torchft: the job's identity and
who is refused on it, the data's fingerprint, and the weights' fingerprint and its verdict, each
against a hand-made case."""
import shutil

import numpy as np
import torch

from configs import TrainConfig
from data.shards import fingerprint, write_shard
from training.replica_checks import job_identity, refusals, weight_split, weights_fingerprint


def entry(group: int, member: bool, **identity) -> dict:
    return {"group": group, "member": member, "identity": {"lr": 0.01, "optimizer": "merit", "data": "d", **identity}}


def test_a_joiner_that_differs_from_the_job_s_groups_is_refused_naming_each_key_and_both_values():
    refused = refusals([entry(0, True), entry(1, False, lr=5e-4, optimizer="adamw"), entry(2, False)])
    assert list(refused) == [1]
    assert refused[1] == ("lr: 0.0005 in group 1, 0.01 in group 0; optimizer: 'adamw' in group 1, 'merit' in group 0. "
                          "Start it with the job's settings; a change for every group is a whole-job restart: stop "
                          "every group, then start each with --resume=auto --allow_changes=lr,optimizer")


def test_the_job_s_groups_are_the_reference_even_where_the_joiner_has_the_lower_id():
    """Group 0 restarted with another lr, group 1 trained on: group 0 is refused, not group 1."""
    assert list(refusals([entry(0, False, lr=5e-4), entry(1, True)])) == [0]


def test_at_the_job_s_start_the_odd_group_out_is_refused_and_without_a_majority_every_group():
    assert list(refusals([entry(0, False), entry(1, False), entry(2, False, lr=1.0)])) == [2]
    both = refusals([entry(0, False), entry(1, False, lr=1.0)])
    assert sorted(both) == [0, 1] and both[0].startswith("with group 1: lr: 0.01 in group 0, 1.0 in group 1.")
    assert refusals([entry(0, False), entry(1, False)]) == {}


def test_the_identity_is_what_a_resume_compares_with_the_data_by_its_shards_not_its_folder(tmp_path):
    data = tmp_path / "a"
    data.mkdir()
    write_shard(data / "train_000000.bin", np.arange(100, dtype=np.uint16))
    write_shard(data / "val_000000.bin", np.arange(10, dtype=np.uint16))
    copy = tmp_path / "elsewhere"
    shutil.copytree(data, copy)
    config = TrainConfig(data_dir=str(data), max_steps=10).to_dict()
    moved = TrainConfig(data_dir=str(copy), max_steps=10, replica_id=3, log_interval=7).to_dict()
    assert job_identity(config) == job_identity(moved)  # (bookkeeping and the folder's path aside)
    assert job_identity(config)["data"] == fingerprint(data) and "data_dir" not in job_identity(config)
    assert job_identity(TrainConfig(data_dir=str(data), max_steps=10, lr=1.0).to_dict())["lr"] == 1.0
    write_shard(copy / "val_000000.bin", np.arange(11, dtype=np.uint16))
    assert fingerprint(copy) != fingerprint(data)


def test_the_weights_fingerprint_is_each_tensor_s_sum_and_sum_of_squares_in_float64():
    tensors = [torch.randn(3, 4), torch.randn(5, dtype=torch.bfloat16)]
    expected = []
    for t in tensors:
        values = t.double()
        expected += [values.sum(), (values * values).sum()]
    assert torch.allclose(weights_fingerprint(tensors), torch.stack(expected), rtol=1e-14, atol=0)


def test_a_weight_split_names_who_holds_which_weights_and_the_largest_difference():
    """b[0] moved by 1e-3 in group 1: b's sum moves by 1e-3 against its norm, its sum of squares by
    2e-3 x b[0] + 1e-6 against its squared norm (the larger norm of the two groups)."""
    weights = [torch.randn(4, 4, dtype=torch.float64), torch.tensor([0.05, 0.1, -0.2, 0.3], dtype=torch.float64)]
    same = weights_fingerprint(weights)
    weights[1][0] += 1e-3
    other = weights_fingerprint(weights)
    assert weight_split({0: same, 1: same.clone(), 2: same.clone()}, ["w", "b"]) is None
    norm = max(0.05 ** 2, 0.051 ** 2) + 0.1 ** 2 + 0.2 ** 2 + 0.3 ** 2
    by_sum, by_squares = 1e-3 / norm ** 0.5, (2e-3 * 0.05 + 1e-6) / norm
    kind, relative = ("sum", by_sum) if by_sum > by_squares else ("sum of squares", by_squares)
    assert weight_split({0: same, 1: other, 2: same}, ["w", "b"]) == (
        f"the weights differ between groups 0, 2 | group 1: b's {kind} by {relative:.3g} of its scale")


def test_a_non_finite_fingerprint_still_compares_by_its_bits():
    """(A diverged group: NaN is not equal to itself, but two groups of the same NaN weights agree.)"""
    row = torch.tensor([1.0, float("nan")], dtype=torch.float64)
    assert weight_split({0: row, 1: row.clone()}, ["w"]) is None
