"""The run state (training/state.py) and the layout that saves and loads it (training/parallel.py),
on one process: every piece and part comes back as it was saved, a part the checkpoint lacks keeps
its fresh state, and a part without state is not saved. (Across ranks and layouts: tests/test_train.py,
test_scale_out.py and test_sharded.py resume through train.py.)"""
import numpy as np
import torch

import optim
from configs import TrainConfig
from data.loader import TokenLoader
from data.shards import write_shard
from helpers import make_text
from model import GPT, GPTConfig
from training.batch_schedule import BatchSchedule, Phase
from training.checkpoint import Checkpoint, load_latest
from training.distributed import Distributed
from training.parallel import Layout
from training.parts import Part
from training.state import LossWindow, RankRNG, RunState

ONE_PROCESS = Distributed(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def test_the_loss_window_averages_the_kept_steps_and_starts_afresh():
    window = LossWindow(ONE_PROCESS)
    for loss, finite in ((2.0, True), (float("nan"), False), (4.0, True)):
        window.add(torch.tensor(loss), torch.tensor(finite))
    assert window.state_dict() == {"steps": 2, "loss_sums": [torch.tensor(6.0)]}
    assert window.pop_mean().item() == 3.0  # the dropped step is neither summed nor counted
    assert (window.loss_sum, window.steps) == (0.0, 0)


def test_the_loss_window_sums_as_the_device_adds_step_by_step():
    """Summed at a read, the window's sums are bitwise those of adding each kept loss on the device
    as it comes (float32, in step order), checkpoints read between log steps included."""
    window, gen = LossWindow(ONE_PROCESS), torch.Generator().manual_seed(0)
    loss_sum, steps = torch.zeros(()), torch.zeros((), dtype=torch.long)  # the per-step device sums
    for step in range(1000):
        loss = torch.rand((), generator=gen) * 10 + step / 1000
        finite = torch.tensor(step % 7 != 0)
        window.add(loss, finite)
        loss_sum += torch.where(finite, loss, 0.0)
        steps += finite
        if step % 137 == 0:  # a checkpoint
            assert window.state_dict() == {"steps": int(steps), "loss_sums": [loss_sum]}
            assert window.state_dict()["loss_sums"][0].dtype == torch.float32
    assert torch.equal(window.pop_mean(), loss_sum / steps)
    # A checkpoint of 2 ranks, resumed on 1: this rank starts from the ranks' mean sum.
    window.load_state_dict({"steps": 3, "loss_sums": [torch.tensor(3.0), torch.tensor(9.0)]})
    assert window.pop_mean().item() == 2.0


class Counter(Part):
    """A part with state, as a new component would be: it saves and loads itself."""

    name = "counter"

    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def write_text_shard(tmp_path):
    write_shard(tmp_path / "data" / "train_000000.bin", np.frombuffer(make_text(40, 0).encode(), np.uint8).astype(np.uint16))


def make_state(tmp_path, parts=()):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=128, n_layer=1, n_head=2, n_embd=16, dropout=0.1))
    optimizer = optim.build("merit", model, lr=1e-2, weight_decay=0.1)
    loader = TokenLoader(tmp_path / "data", "train", 2, 8, prefetch=False)
    return RunState(model, optimizer, config={"tokenizer": "byte", "optimizer": "merit", "batch_size": 2},
                    batch_schedule=BatchSchedule([Phase(0, 0, 2)], block_size=8, reference=2), parts=[*parts, Part()],
                    scaler=torch.amp.GradScaler("cpu", enabled=False),
                    train_loader=loader, train_window=LossWindow(ONE_PROCESS), rng=RankRNG(ONE_PROCESS))


def test_the_layout_saves_the_state_and_loads_it_back_bitwise(tmp_path):
    write_text_shard(tmp_path)
    state = make_state(tmp_path)
    assert state.parts == {}  # a part without state is not saved
    for _ in range(3):  # a few steps, so the moments, the data position and the RNG have moved
        x, y = state.pieces["train_loader"].next_batch()
        loss = state.model(x, y)[1]
        loss.backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.pieces["train_window"].add(loss.detach(), torch.tensor(True))
        state.step += 1
    writer = Layout.of(TrainConfig(max_steps=1), ONE_PROCESS).checkpoint_writer(ONE_PROCESS)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer.save(state, run_dir)
    expected_batch = state.pieces["train_loader"].next_batch()[0]
    expected_noise = torch.rand(4)  # the RNG continues from the save

    resumed = make_state(tmp_path)
    checkpoint, path = load_latest(run_dir, fall_back=False)
    assert checkpoint.step == 3 and checkpoint.tokens == 48 and checkpoint.parts == {}
    writer.load(resumed, checkpoint, path)
    assert resumed.step == 3
    for (name, p), q in zip(state.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    for p, q in zip(state.model.parameters(), resumed.model.parameters()):
        for key, value in state.optimizer.state[p].items():
            assert torch.equal(value, resumed.optimizer.state[q][key]), key
    assert resumed.pieces["train_window"].state_dict() == state.pieces["train_window"].state_dict()
    assert torch.equal(resumed.pieces["train_loader"].next_batch()[0], expected_batch)
    assert torch.equal(torch.rand(4), expected_noise)


def test_a_part_the_checkpoint_lacks_keeps_its_fresh_state(tmp_path):
    write_text_shard(tmp_path)
    counter = Counter()
    counter.count = 7
    state = make_state(tmp_path, [counter])
    fields = state.state_dict()
    assert fields["parts"] == {"counter": {"count": 7}} and fields["model_args"]["n_embd"] == 16
    checkpoint = Checkpoint(model=state.model.state_dict(), optimizer=state.optimizer.state_dict(), **fields)
    fresh = Counter()
    make_state(tmp_path, [fresh]).load_state_dict(checkpoint)
    assert fresh.count == 7
    older = Counter()  # a checkpoint of a run without the part: it keeps its fresh state
    make_state(tmp_path, [older]).load_state_dict(Checkpoint(**{**vars(checkpoint), "parts": {}}))
    assert older.count == 0
