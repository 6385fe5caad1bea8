"""Validation as a part of a run (training/parts.py): ``val/loss`` on the first ``val_tokens`` of
the validation split every ``eval_interval`` steps, at the start and at the end, and
``heldout/loss`` on the ``heldout_tokens`` after them where there are any (a study picks each
point's lr on val/loss and reports heldout/loss, which the choice never saw)."""
from __future__ import annotations

import torch

from data.loader import TokenLoader
from training import distributed
from training.parts import Part, Step


class Validation(Part):
    metric_keys = ("val/", "heldout/")

    def __init__(self, run, loader: TokenLoader, val_steps: int, heldout_steps: int):
        self.run, self.loader, self.val_steps, self.heldout_steps = run, loader, val_steps, heldout_steps

    @classmethod
    def build(cls, run) -> Validation:
        config = run.config
        # (every rank its share of each global micro-batch, cut as the training loader cuts)
        loader = TokenLoader(config.data_dir, "val", config.micro_batch_size, run.model_config.block_size,
                             rank=run.ctx.rank, world_size=run.ctx.world_size, **run.loader_options)
        tokens_per_step = loader.global_tokens  # one micro-batch on every rank
        val_steps = max(1, config.val_tokens // tokens_per_step)
        heldout_steps = config.heldout_tokens // tokens_per_step
        needed = (val_steps + heldout_steps) * tokens_per_step + 1
        if loader.split_tokens < needed:  # (else the loader would wrap: some tokens counted twice)
            asked = (f"heldout_tokens={config.heldout_tokens:,} after val_tokens={config.val_tokens:,}"
                     if heldout_steps else f"val_tokens={config.val_tokens:,}")
            raise ValueError(f"{asked} needs {needed:,} validation tokens, but the 'val' split of {config.data_dir} "
                             f"has {loader.split_tokens:,}: lower {'heldout_tokens or ' if heldout_steps else ''}"
                             f"val_tokens")
        return cls(run, loader, val_steps, heldout_steps)

    def evaluate(self, step: Step) -> dict[str, float]:
        if not (step.final or step.number % self.run.config.eval_interval == 0):
            return {}
        self.loader.reset()
        losses = {"val/loss": self.mean_loss(self.val_steps)}
        if self.heldout_steps:
            losses["heldout/loss"] = self.mean_loss(self.heldout_steps)  # (the loader goes on where val ended)
        return losses

    @torch.no_grad()
    def mean_loss(self, steps: int) -> float:
        """The mean loss of the model over the val loader's next ``steps`` global micro-batches."""
        run = self.run
        model = run.evaluated_model()  # (Schedule-Free AdamW: at its average x)
        model.eval()
        total = torch.zeros((), device=run.device)
        for _ in range(steps):
            x, y = (t.to(run.device) for t in self.loader.next_batch())
            with run.autocast:
                total += model(x, y)[1].float()
        model.train()
        return distributed.all_reduce_mean(total / steps, run.ctx).item()

    def close(self) -> None:
        self.loader.close()
