"""Metrics: the JSONL log is always written; wandb failures never stop training; their page reads cleanly."""

import json
import re
import sys
import types

import pytest

from helpers import ROOT
from training.metrics import MetricsLogger


class BrokenWandb(types.ModuleType):
    """Stands in for wandb: starts, then fails on every log call."""

    def __init__(self, fail_init: bool):
        super().__init__("wandb")
        self.fail_init = fail_init
        self.logged = []

    def init(self, **kwargs):
        if self.fail_init:
            raise RuntimeError("wandb.errors.CommError: network unreachable")
        wandb = self

        class Run:
            def define_metric(self, *args, **kwargs):
                pass

            def log(self, record):
                wandb.logged.append(record)
                raise RuntimeError("connection reset")

            def finish(self):
                pass

        return Run()


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("fail_init", [True, False])
def test_wandb_failure_leaves_the_jsonl_log(tmp_path, monkeypatch, fail_init):
    fake = BrokenWandb(fail_init)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with pytest.warns(UserWarning, match="wandb"):
        logger = MetricsLogger(tmp_path, {"run_name": "r"}, wandb_mode="online")
        logger.log({"step": 1, "train/loss": 2.5})
        logger.log({"step": 2, "train/loss": float("nan")})
    logger.close()
    assert read(tmp_path / "metrics.jsonl") == [{"step": 1, "train/loss": 2.5}, {"step": 2, "train/loss": None}]
    assert fake.logged == ([] if fail_init else [{"step": 1, "train/loss": 2.5}])  # disabled after one failure


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    logger = MetricsLogger(tmp_path, {"run_name": "r"})
    for step in range(1, 6):
        logger.log({"step": step, "train/loss": float(step)})
    logger.close()
    logger = MetricsLogger(tmp_path, {"run_name": "r"}, resume_step=3)  # the crash came after step 5
    logger.log({"step": 4, "train/loss": 40.0})
    logger.close()
    assert [r["train/loss"] for r in read(tmp_path / "metrics.jsonl")] == [1.0, 2.0, 3.0, 40.0]


def stray_lines(page: str) -> list[str]:
    """The lines of a markdown page, outside its code blocks, that say nothing: neither a word, a number,
    a code span nor a table's rule (e.g. a lone ":")."""
    prose = re.sub(r"^```.*?^```", "", page, flags=re.S | re.M)
    return [line for line in prose.splitlines()
            if line.strip() and not re.search(r"[\w`]", line) and not re.fullmatch(r"\|(-+\|)+", line.strip())]


def test_the_metrics_page_has_no_stray_line():
    assert stray_lines("| a | b |\n|---|---|\n:\n```\n:\n```\n*\n") == [":", "*"]  # (the rule and the code kept)
    assert stray_lines((ROOT / "docs" / "metrics.md").read_text()) == []
