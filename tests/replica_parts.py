"""Parts that tests/test_replicas.py adds to its replica groups' runs (``extra_parts``): its own
module, which imports nothing of the tests' (train.py imports it in the groups' processes)."""
import os
import time
from pathlib import Path

import torch

from training.parts import Part, Step


class Pace(Part):
    """A pause after every step (PACE_S, default 30 ms), so that a tiny run lasts long enough to
    kill and restart one of its groups while the other trains on; while the file HOLD_FILE exists,
    a longer one (HELD_S, default 0.3 s): a test holds a survivor back that way until a restarted
    group has joined it, however long that group's start takes on a busy machine (the survivor
    still asks for a quorum every step, so the restarted group can join it)."""

    def __init__(self, run):
        self.pause, self.held = float(os.environ.get("PACE_S", "0.03")), float(os.environ.get("HELD_S", "0.3"))
        self.hold = Path(os.environ["HOLD_FILE"]) if "HOLD_FILE" in os.environ else None

    def after_step(self, step: Step) -> None:
        time.sleep(self.held if self.hold is not None and self.hold.exists() else self.pause)


class RecordWeights(Part):
    """The model's weights in float64 (torch.save to RECORD_DIR/replica_<id>): ``initial.pt`` when
    the run is built; ``inner_<step>.pt`` after each inner optimizer step, before the local method's
    own hook meets the other groups (its hook is registered at start, after this one);
    ``after_<step>.pt`` when the step is done (after the meeting, at a round's last step)."""

    def __init__(self, run):
        self.run, self.folder = run, Path(os.environ["RECORD_DIR"]) / f"replica_{run.config.replica_id}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.save("initial")
        run.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: self.save(f"inner_{run.step + 1}"))

    def save(self, name: str) -> None:
        torch.save({key: value.double() for key, value in self.run.model.state_dict().items()},
                   self.folder / f"{name}.pt")

    def after_update(self, step: Step) -> None:
        self.save(f"after_{step.number}")
