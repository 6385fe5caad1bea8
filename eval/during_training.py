"""Zero-shot evaluation as a part of a training run (training/parts.py): the configured
``zero_shot_tasks`` on the evaluated weights (``run.evaluated_model()``) every ``zero_shot_interval``
steps and at the end, each rank scoring its share of the examples, logged as
``zero_shot/<task>/<metric>``. The tasks and their data are checked (and fetched) when the run is
built, before anything trains. A task the model cannot score (a continuation longer than its
window) is skipped with a warning: the run and the other tasks' results go on. A stop (SIGTERM,
Ctrl-C) is heeded between tasks: the run saves with the evaluation pending and runs it first when
it resumes. It lives in eval/ because it is the evaluator's: nothing in training/ imports eval/,
and train.py adds it to the run's parts."""
from __future__ import annotations

import warnings

from eval import evaluate
from eval.scorer import Scorer
from eval.tasks import check_zero_shot, tasks_named
from training import distributed
from training.parts import EvaluationInterrupted, Part, Step


class ZeroShot(Part):
    metric_keys = ("zero_shot/",)

    def __init__(self, run):
        self.run = run

    @classmethod
    def build(cls, run) -> ZeroShot | None:
        config = run.config
        if not config.zero_shot_tasks:
            return None
        check_zero_shot(config.zero_shot_tasks, config.zero_shot_data_dir, config.zero_shot_limit, fetch=True)
        return cls(run)

    def evaluate(self, step: Step) -> dict[str, float]:
        run, config = self.run, self.run.config
        interval = config.zero_shot_interval
        if not (step.final or step.number and interval and step.number % interval == 0):
            return {}
        scorer = Scorer(run.layout.plain_model(run.evaluated_model(), on_every_rank=True), run.tokenizer,
                        batch_size=config.micro_batch_size, device=run.device, show_progress=False)
        record = {}
        for task in tasks_named(config.zero_shot_tasks):
            if run.signals.agreed(run.ctx):  # (every rank, between tasks: a collective)
                run.model.train()
                raise EvaluationInterrupted(f"zero-shot evaluation at step {step.number}, before {task.name}")
            try:
                output = evaluate(scorer, [task], data_dir=config.zero_shot_data_dir, limit=config.zero_shot_limit,
                                  rank=run.ctx.rank, world_size=run.ctx.world_size,
                                  gather=lambda obj: distributed.all_gather_objects(obj, run.ctx))
            except ValueError as error:  # (every rank together: evaluate agrees on a refusal)
                if run.ctx.is_main:
                    warnings.warn(f"zero-shot evaluation at step {step.number} skips {error}")
                continue
            record.update({f"zero_shot/{task.name}/{metric}": value
                           for metric, value in output["results"][task.name].items()
                           if metric not in ("version", "n", "seconds") and value is not None})
        run.model.train()  # the scorer puts the model in eval mode
        return record
