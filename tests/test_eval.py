"""Zero-shot evaluation end to end, on a small GPT trained here by train.py: the training-time hook,
`python -m eval`, batch-size invariance, agreement with lm-evaluation-harness's `hf` backend on
the exported model, and the harness running our checkpoint through eval/harness.py."""
import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import ROOT, read_metrics, run_train, train_here
from data.shards import write_shard
from data.tokenizer import get_tokenizer
from eval import evaluate, format_table
from eval.scorer import Scorer
from eval.tasks import AGGREGATIONS, TASKS, mean, tasks_named
from eval.samples import write_fixtures, write_harness_tasks
from model import GPT, GPTConfig
from training.checkpoint import CHECKPOINT_NAME, Checkpoint, load_model

STEPS = 20  # the agreement tests need a trained model, not a good one: keep the suite fast


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run dir, task fixture dir): a 4-layer GPT trained on the fixtures' own texts (GPT-2 BPE,
    block 128, so the WikiText page spans several windows), with every task evaluated at the end."""
    root = tmp_path_factory.mktemp("eval_run")
    rows = write_fixtures(root / "tasks")
    encoding = get_tokenizer("gpt2")
    texts = [value for task_rows in rows.values() for row in task_rows for value in row.values()
             if isinstance(value, str) and len(value) > 20]
    tokens = [t for text in texts for t in (encoding.eot_token, *encoding.encode(text))]
    write_shard(root / "data" / "train_000000.bin", np.array(tokens * 3))
    write_shard(root / "data" / "val_000000.bin", np.array(tokens[: len(tokens) // 4]))
    train_here(*train_args(root, "run", STEPS))  # here (a new process: the DDP run below)
    return root / "run", root / "tasks"


def train_args(root, run_name: str, steps: int) -> list[str]:
    return ["--model=nano", "--block_size=128", "--tokenizer=gpt2", "--batch_size=8", "--micro_batch_size=4",
            f"--max_steps={steps}", "--optimizer=adamw", "--lr=3e-3", "--min_lr=3e-4", f"--warmup_steps={min(5, steps)}",
            "--log_interval=20", "--eval_interval=1000", "--val_tokens=1024", "--probe_batch_size=2",
            f"--data_dir={root / 'data'}", f"--out_dir={root}", f"--run_name={run_name}", "--zero_shot_tasks=paper",
            f"--zero_shot_data_dir={root / 'tasks'}"]


@pytest.fixture(scope="module")
def ours(trained):
    """Our evaluator's output (with samples) on every task, batch size 16."""
    run_dir, tasks_dir = trained
    model, _ = load_model(run_dir / CHECKPOINT_NAME)
    scorer = Scorer(model, get_tokenizer("gpt2"), batch_size=16, show_progress=False)
    return evaluate(scorer, tasks_named("paper"), data_dir=tasks_dir, log_samples=True)


def metric_values(results: dict) -> dict:
    return {(task, k): v for task, summary in results.items() for k, v in summary.items()
            if k not in ("version", "n", "seconds")}


# Two evaluations that run other kernels or batches (float32 sums in other orders) agree on an
# example's log-likelihoods to about LL_TOLERANCE, and so on its decisions (which choice has the
# largest log-likelihood, raw or per character) unless the reference's log-likelihoods lie that
# close to a tie: the model trained here differs with the CPU, so any example may.
LL_TOLERANCE = 1e-4


def near_a_tie(task, doc, results: list) -> bool:
    """Whether log-likelihoods within LL_TOLERANCE of this multiple-choice example's could change its
    metrics: each choice in turn raised by the tolerance and the others lowered (the largest swing
    toward it). (Greedy flags are the scorer's own argmax per token and are compared as they are.)"""
    if task.kind != "multiple_choice":
        return False
    metrics = task.process(doc, results)
    return any(task.process(doc, [(ll + (LL_TOLERANCE if i == k else -LL_TOLERANCE), greedy)
                                  for i, (ll, greedy) in enumerate(results)]) != metrics
               for k in range(len(results)))


def decision_slack(reference: dict, tasks_dir) -> dict[tuple[str, str], float | None]:
    """{(task, metric): how far another evaluation may move it}: the share of the reference's
    examples near a tie for a mean over examples, 0 with none near a tie, None (not comparable) for
    an aggregate of the decisions that is not a mean (cb's F1) with some near a tie."""
    slack = {}
    for name, records in reference["samples"].items():
        task = TASKS[name]
        docs = task.load_docs(tasks_dir)
        near = sum(near_a_tie(task, docs[r["doc_id"]], r["results"]) for r in records)
        for metric in task.metrics:
            slack[(name, metric)] = (near / len(records) if AGGREGATIONS[metric] is mean else
                                     None if near else 0.0)
    return slack


def assert_same_metrics(expected: dict, actual: dict, slack: dict, rel: float, abs_: float) -> None:
    """``actual`` equals ``expected`` ({(task, metric): value}) within rel and abs_; a mean decided on
    examples near a tie within its slack; an unbounded one (cb's F1, a stderr) is left out then."""
    assert actual.keys() == expected.keys()
    for (task, metric), value in expected.items():
        bound = slack.get((task, metric.removesuffix("_stderr")), 0.0)
        if value is None:
            assert actual[(task, metric)] is None, (task, metric)
        elif bound == 0.0:
            assert actual[(task, metric)] == pytest.approx(value, rel=rel, abs=abs_), (task, metric)
        elif bound is not None and not metric.endswith("_stderr"):
            assert actual[(task, metric)] == pytest.approx(value, abs=bound), (task, metric, "near a tie")


def logged_metrics(run_dir) -> dict:
    """The zero-shot metrics a training run logged (the last value of each), as {(task, metric): value}."""
    return {tuple(key.split("/")[1:]): value for record in read_metrics(run_dir) for key, value in record.items()
            if key.startswith("zero_shot/")}


def test_an_example_near_a_tie_is_found_and_bounds_its_metric(tmp_path):
    copa = TASKS["copa"]
    write_fixtures(tmp_path)
    doc = copa.load_docs(tmp_path)[0]
    far, near = [(-3.0, False), (-5.0, False)], [(-3.0, False), (-3.0 - LL_TOLERANCE, False)]
    assert not near_a_tie(copa, doc, far) and near_a_tie(copa, doc, near)
    records = [{"doc_id": 0, "results": near}, *({"doc_id": 0, "results": far} for _ in range(3))]
    assert decision_slack({"samples": {"copa": records}}, tmp_path) == {("copa", "acc"): 0.25}


@pytest.mark.slow  # the trained fixture, `python -m eval.samples` and `python -m eval` as processes
def test_offline_the_samples_command_s_command_writes_the_results_the_training_hook_logged(trained, ours, tmp_path):
    """`python -m eval.samples DIR`, then the command it prints (our checkpoint for its placeholder,
    another batch size) on an air-gapped node: the table without datasets' progress bars, a results
    file with the run's provenance, the numbers the training hook logged and evaluate()'s."""
    run_dir, tasks_dir = trained  # (the samples it writes are these fixtures)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf_cache")}  # a cache of its own: datasets writes there first
    written = subprocess.run([sys.executable, "-m", "eval.samples", str(tmp_path / "samples")], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr[-3000:]
    [command] = [line.strip() for line in written.stdout.splitlines() if line.strip().startswith("python -m eval ")]
    args = shlex.split(command)[3:]
    assert args[args.index("--ckpt") + 1] == "runs/NAME/ckpt.pt"
    args[args.index("--ckpt") + 1] = str(run_dir / CHECKPOINT_NAME)
    out = tmp_path / "results.json"
    result = subprocess.run([sys.executable, "-m", "eval", *args, "--out", str(out), "--log-samples",
                             "--batch-size", "7"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Generating" not in result.stdout + result.stderr and "examples/s" not in result.stderr
    record = json.loads(out.read_text())
    assert format_table(record["results"]) in result.stdout
    assert (record["tokenizer"], record["step"]) == ("gpt2", STEPS)
    assert record["train_config"]["zero_shot_tasks"] == "paper" and record["model_config"]["n_layer"] == 4
    assert record["eval_config"]["batch_size"] == 7 and set(record["samples"]) == set(TASKS)
    for name, summary in record["results"].items():
        task = TASKS[name]
        examples = len((tasks_dir / f"{name}.jsonl").read_text().splitlines())  # (a fixture file: a row a line)
        assert summary["version"] == task.version and summary["n"] == examples
        assert all(metric in summary and f"{metric}_stderr" in summary for metric in task.metrics)
    # Batch 4 in training, 16 in ``ours``, 7 here: float32 sums in other orders.
    slack = decision_slack(ours, tasks_dir)
    cli = {key: value for key, value in metric_values(record["results"]).items() if value is not None}
    assert_same_metrics(cli, logged_metrics(run_dir), slack, rel=1e-5, abs_=1e-6)
    assert_same_metrics(metric_values(ours["results"]), metric_values(record["results"]), slack, rel=1e-6, abs_=1e-9)


@pytest.mark.slow  # torchrun, 2 gloo ranks
def test_two_ranks_share_the_zero_shot_examples_and_log_every_metric(trained):
    """Each rank of a DDP run scores every other example; the gathered metrics are those of one
    process evaluating the same checkpoint alone."""
    run_dir, tasks_dir = trained
    root = run_dir.parent
    run_train(*train_args(root, "ddp", 2), nproc=2, timeout=600)
    model, _ = load_model(root / "ddp" / CHECKPOINT_NAME)
    alone = evaluate(Scorer(model, get_tokenizer("gpt2"), batch_size=4, show_progress=False), tasks_named("paper"),
                     data_dir=tasks_dir, log_samples=True)
    expected = {key: value for key, value in metric_values(alone["results"]).items() if value is not None}
    assert_same_metrics(expected, logged_metrics(root / "ddp"), decision_slack(alone, tasks_dir), rel=1e-5, abs_=1e-6)


@pytest.mark.slow  # the trained fixture
def test_metrics_do_not_depend_on_batch_size(trained, ours):
    run_dir, tasks_dir = trained
    model, _ = load_model(run_dir / CHECKPOINT_NAME)
    one = evaluate(Scorer(model, get_tokenizer("gpt2"), batch_size=1, show_progress=False), tasks_named("paper"),
                   data_dir=tasks_dir, log_samples=True)
    assert_same_metrics(metric_values(ours["results"]), metric_values(one["results"]), decision_slack(ours, tasks_dir),
                        rel=1e-6, abs_=1e-9)
    for task, samples in ours["samples"].items():
        for a, b in zip(samples, one["samples"][task]):
            assert a["metrics"].keys() == b["metrics"].keys()
            assert np.allclose(flat_lls(a["results"]), flat_lls(b["results"]), rtol=1e-6, atol=1e-5)  # float32 sums


def flat_lls(results: list) -> list[float]:
    return [r[0] if isinstance(r, (tuple, list)) else r for r in results]


def harness_run(model, tmp_path, tasks_dir, **kwargs) -> dict:
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager
    written = write_harness_tasks(tmp_path / "harness_tasks", tasks_dir)
    manager = TaskManager(include_path=str(tmp_path / "harness_tasks"), include_defaults=False)
    output = lm_eval.simple_evaluate(model=model, tasks=[name for _, name in written.values()], task_manager=manager,
                                     log_samples=True, bootstrap_iters=0, **kwargs)
    return {ours: (output["results"][fixture], output["samples"][fixture]) for ours, (_, fixture) in written.items()}


def assert_same_as_harness(ours: dict, harness: dict, slack: dict, atol: float, rtol: float = 0.0) -> None:
    """Per-example log-likelihoods within atol + rtol * |ll|, greedy flags and every metric the same
    (those decided on examples near a tie within their ``slack``)."""
    for name, (results, samples) in harness.items():
        our_samples = ours["samples"][name]
        assert len(samples) == len(our_samples), name
        for theirs, mine in zip(sorted(samples, key=lambda s: s["doc_id"]), our_samples):
            their_results = [resp[0] for resp in theirs["resps"]]
            assert np.allclose(flat_lls(mine["results"]), flat_lls(their_results), rtol=rtol, atol=atol), name
            if TASKS[name].kind != "rolling":
                assert [bool(r[1]) for r in mine["results"]] == [bool(r[1]) for r in their_results], name
        metrics = TASKS[name].metrics
        assert_same_metrics({(name, metric): ours["results"][name][metric] for metric in metrics},
                            {(name, metric): results[f"{metric},none"] for metric in metrics}, slack, rel=1e-6, abs_=0)


@pytest.mark.slow  # the trained fixture, the export as a process, the harness
def test_agreement_with_the_harness_hf_backend_on_the_exported_model(trained, ours, tmp_path):
    pytest.importorskip("transformers")
    run_dir, tasks_dir = trained
    export = subprocess.run([sys.executable, "-m", "scripts.export_hf", str(run_dir / CHECKPOINT_NAME),
                             str(tmp_path / "hf")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr[-3000:]
    harness = harness_run("hf", tmp_path, tasks_dir, model_args=f"pretrained={tmp_path / 'hf'},dtype=float32",
                          batch_size=4, device="cpu")
    # The hf backend returns float32 sums: a WikiText page's log-likelihood of -4047 is only known
    # to its float32 spacing there (4.9e-4), so large values are compared to 2 float32 epsilons.
    assert_same_as_harness(ours, harness, decision_slack(ours, tasks_dir), atol=1e-4,
                           rtol=2 * float(np.finfo(np.float32).eps))


@pytest.mark.slow  # the trained fixture, the harness
def test_the_harness_runs_our_checkpoint_through_the_adapter(trained, ours, tmp_path):
    from eval.harness import NanoMeritLM
    run_dir, tasks_dir = trained
    harness = harness_run(NanoMeritLM.from_checkpoint(run_dir / CHECKPOINT_NAME, batch_size=16), tmp_path, tasks_dir)
    # The same scorer, other batches: float32 rounding only (as between batch sizes).
    assert_same_as_harness(ours, harness, decision_slack(ours, tasks_dir), atol=1e-5, rtol=1e-6)


@pytest.mark.slow  # `python -m eval` twice, processes of their own
def test_the_cli_without_the_hub_or_a_checkpoint_says_what_to_pass(tmp_path):
    torch.manual_seed(0)
    Checkpoint.of_model(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=320)),
                        "byte").save(tmp_path / "ckpt.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # as on an air-gapped node

    def run(*args):
        return subprocess.run([sys.executable, "-m", "eval", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
    offline = run("--ckpt", str(tmp_path / "ckpt.pt"), "--tasks", "piqa")
    assert offline.returncode != 0 and "Traceback" not in offline.stderr, offline.stderr[-2000:]
    assert "eval: task piqa: Couldn't reach" in offline.stderr and "--data-dir DIR" in offline.stderr
    assert offline.stderr.rstrip().endswith(f"offline: python -m eval --ckpt {tmp_path / 'ckpt.pt'} --tasks piqa "
                                            "--samples")
    missing = run("--ckpt", str(tmp_path / "nope.pt"), "--tasks", "piqa")
    assert missing.returncode != 0 and "eval: no checkpoint at" in missing.stderr and "Traceback" not in missing.stderr
