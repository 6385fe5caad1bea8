"""eval/tasks.py against lm-evaluation-harness 0.4.13 itself, on the sample task files of eval/samples.py.

For every task the harness's own YAML is included from a temporary task folder, with the data
pointed at the fixture file; then, document by document, the harness's requests
(fewshot_context + construct_requests: the exact arguments it passes to a model), its
process_results on fake log-likelihoods and its aggregations and stderrs are compared with ours.
No model is needed. The harness tests are skipped where lm_eval is not installed.
"""
import ast
import json
import random
import zlib
from collections import defaultdict
from pathlib import Path

import pytest

from eval import evaluate, format_table
from eval import tasks as task_module
from eval.tasks import GROUPS, TASKS, Task, tasks_named
from eval.samples import HARNESS_YAMLS, write_fixtures, write_harness_tasks

KINDS = {"multiple_choice": "multiple_choice", "loglikelihood": "loglikelihood", "loglikelihood_rolling": "rolling"}


@pytest.fixture(scope="module")
def datasets_cache(tmp_path_factory):
    """Keep the datasets library's Arrow cache of these small files out of the user's cache."""
    datasets = pytest.importorskip("datasets")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
        yield


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory, datasets_cache) -> Path:
    data_dir = tmp_path_factory.mktemp("eval_data")
    write_fixtures(data_dir)
    return data_dir


@pytest.fixture(scope="module")
def harness(tmp_path_factory, fixture_dir):
    """{our task name: (the harness's YAML config as written, the harness's Task on the fixture file)}."""
    harness_tasks = pytest.importorskip("lm_eval.tasks")
    include_dir = tmp_path_factory.mktemp("harness_tasks")
    written = write_harness_tasks(include_dir, fixture_dir)
    manager = harness_tasks.TaskManager(include_path=str(include_dir), include_defaults=False)
    loaded = manager.load([fixture_name for _, fixture_name in written.values()])["tasks"]
    return {name: (config, loaded[fixture_name]) for name, (config, fixture_name) in written.items()}


DRAWS = 12  # fake model outputs per document


def fake_results(task: Task, requests: list, seed: str) -> list:
    """Deterministic pseudo-random model outputs: (log-likelihood, is_greedy) per request, or a
    float per rolling document. Every other draw makes the log-likelihoods nearly proportional to
    the continuations' lengths, so that acc and acc_norm often disagree and any slip in the length
    normalisation shows."""
    rng = random.Random(zlib.crc32(seed.encode()))
    if task.kind == "rolling":
        return [-rng.uniform(100.0, 3000.0) for _ in requests]
    if rng.random() < 0.5:
        return [(-rng.uniform(0.2, 40.0), rng.random() < 0.5) for _ in requests]
    return [(-0.3 * len(continuation) * rng.uniform(0.85, 1.15), rng.random() < 0.5) for _, continuation in requests]


def harness_arguments(htask, doc) -> list[tuple]:
    """The (context, continuation) or (document,) argument tuples the harness sends to a model."""
    instances = htask.construct_requests(doc=doc, ctx=htask.fewshot_context(doc, 0))
    return [instance.arguments for instance in (instances if isinstance(instances, list) else [instances])]


def as_arguments(task: Task, requests: list) -> list[tuple]:
    return [(request,) for request in requests] if task.kind == "rolling" else [tuple(r) for r in requests]


def test_every_task_is_tested_and_the_groups_are_the_papers():
    assert set(HARNESS_YAMLS) == set(TASKS)
    assert set(GROUPS["paper"]) == set(TASKS) and len(GROUPS["paper"]) == len(TASKS)
    assert GROUPS["superglue"] == ("boolq", "cb", "copa", "rte", "wic", "wsc")


@pytest.mark.parametrize("name", list(HARNESS_YAMLS))
def test_metadata_matches_the_harness_yaml(harness, name):
    config, htask = harness[name]
    task = TASKS[name]
    assert task.name == name and task.harness_task == config["task"]
    assert (task.dataset_path, task.dataset_name) == (config["dataset_path"], config.get("dataset_name"))
    assert task.split == (config.get("test_split") or config.get("validation_split"))
    assert task.kind == KINDS[config["output_type"]]
    assert task.version == str(config["metadata"]["version"]) == str(htask.VERSION)
    assert task.metrics == tuple(metric["metric"] for metric in config["metric_list"])
    assert config.get("target_delimiter", " ") == task_module.TARGET_DELIMITER
    assert config.get("num_fewshot", 0) == 0 and not config.get("description")
    assert not config.get("dataset_kwargs")  # load_docs passes none to datasets.load_dataset


@pytest.mark.parametrize("name", list(HARNESS_YAMLS))
def test_requests_metrics_and_aggregations_match_the_harness(harness, fixture_dir, monkeypatch, name):
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")  # the harness's single-process bootstrap: same resamples
    from lm_eval.api.metrics import stderr_for_metric

    _, htask = harness[name]
    task = TASKS[name]
    hdocs = list(htask.eval_docs)
    docs = task.load_docs(fixture_dir)
    assert len(docs) == len(hdocs) >= 5
    assert docs == [dict(doc) for doc in hdocs]  # same rows, same order, same process_docs output

    ours = []
    for i, doc in enumerate(docs):
        requests = task.requests(doc)
        assert as_arguments(task, requests) == harness_arguments(htask, hdocs[i]), f"{name} doc {i}"
        for draw in range(DRAWS):
            results = fake_results(task, requests, f"{name}/{i}/{draw}")
            ours.append(task.process(doc, results))
            assert ours[-1] == htask.process_results(hdocs[i], results), f"{name} doc {i} draw {draw}"
            json.dumps(ours[-1])  # plain Python values: they go into results files
    aggregations = htask.aggregation()
    for metric in task.metrics:
        values = [p[metric] for p in ours]
        assert task.aggregate(metric, values) == pytest.approx(aggregations[metric](values), rel=1e-13, abs=1e-15)
        stderr_fn = stderr_for_metric(aggregations[metric], bootstrap_iters=2000)
        expected = stderr_fn(values) if stderr_fn else None
        got = task.stderr(metric, values, bootstrap_iters=2000)
        assert (got is None) == (expected is None), metric
        if expected is not None:
            assert got == pytest.approx(expected, rel=1e-13), metric


def test_perplexity_bootstrap_reproduces_the_harness_resamples(monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")
    from lm_eval.api.metrics import bootstrap_stderr, perplexity

    rng = random.Random(7)
    values = [-rng.expovariate(0.3) for _ in range(257)]
    for iters in (999, 2000):  # one partial chunk; two chunks of several row blocks
        ours = task_module.bootstrap_stderr(task_module.resampled_perplexity, values, iters=iters)
        assert ours == pytest.approx(bootstrap_stderr(perplexity, values, iters=iters), rel=1e-13)
    assert TASKS["lambada_openai"].stderr("perplexity", values[:1]) is None  # the harness: "N/A"


class FakeScorer:
    """A model's place in ``evaluate``: the fake_results of each request, seeded by the request
    (``evaluate`` names each call by its task, ``desc``)."""

    def loglikelihood(self, requests, desc):
        return [fake_results(TASKS[desc], [request], repr(request))[0] for request in requests]

    def loglikelihood_rolling(self, texts, desc):
        return [fake_results(TASKS[desc], [text], text)[0] for text in texts]


def table_cells(lines, split) -> dict[tuple[str, str], tuple[str, str]]:
    """{(task, metric): (value, stderr)} of a printed table whose rows ``split`` turns into
    (task or "" under the row above, metric, value, stderr), or None for a row that is not one."""
    cells, task = {}, None
    for line in lines:
        row = split(line)
        if row:
            task = row[0] or task
            cells[task, row[1]] = row[2:]
    return cells


def ours_row(line: str):  # task  version  n  metric  value  stderr; the first three blank after a task's first row
    words = line.split()
    return None if words[0] == "task" else ((words[0] if len(words) == 6 else ""), *words[-3:])


def harness_row(line: str):  # |task|version|filter|n-shot|metric|↑|value|±|stderr|
    cells = [cell.strip() for cell in line.split("|")]
    return None if len(cells) < 10 or cells[1] == "Tasks" or cells[1].startswith("-") else (
        cells[1], cells[5], cells[7], cells[9])


def test_the_table_and_json_report_what_the_harness_reports(harness, fixture_dir, monkeypatch):
    """evaluate()'s results (the JSON) and format_table's printed values and stderrs are those of
    the harness's own aggregation (default 100,000 bootstrap resamples) and its make_table, on the
    same per-example results. LAMBADA's six fake log-likelihoods (down to -40) give a perplexity of
    about 1e4 and a bootstrap stderr of about 6e10, printed in full by both: exp(-mean) of the
    resamples that repeat the worst example is huge, as on a barely trained model."""
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")  # the harness's single-process bootstrap: same resamples
    from lm_eval.evaluator_utils import _compute_task_aggregations
    from lm_eval.utils import make_table

    output = evaluate(FakeScorer(), tasks_named("paper"), data_dir=fixture_dir, log_samples=True)
    theirs = {}
    for name, records in output["samples"].items():
        _, htask = harness[name]
        hdocs = list(htask.eval_docs)
        raw = defaultdict(list)
        for record in records:
            for metric, value in htask.process_results(hdocs[record["doc_id"]], record["results"]).items():
                raw[metric, "none"].append(value)
        theirs[name] = _compute_task_aggregations(htask, raw, bootstrap_iters=100_000)[0]
    for name, summary in output["results"].items():
        for metric in TASKS[name].metrics:
            assert summary[metric] == pytest.approx(theirs[name][f"{metric},none"], rel=1e-13), (name, metric)
            stderr, expected = summary[f"{metric}_stderr"], theirs[name][f"{metric}_stderr,none"]
            assert stderr is None if expected == "N/A" else stderr == pytest.approx(expected, rel=1e-13), (name, metric)
    lambada = output["results"]["lambada_openai"]
    assert lambada["perplexity_stderr"] > 1e6 * lambada["perplexity"] > 1e9

    versions = {name: harness[name][1].VERSION for name in theirs}
    printed = table_cells(make_table({"results": theirs, "versions": versions}).splitlines(), harness_row)
    ours = table_cells(format_table(output["results"]).splitlines(), ours_row)
    assert ours.keys() == printed.keys() == {(name, m) for name in theirs for m in TASKS[name].metrics}
    for key, cells in ours.items():
        for mine, their in zip(cells, printed[key]):  # make_table's writer drops a huge number's ".0000"
            assert mine == their == "N/A" or float(mine) == pytest.approx(float(their), rel=1e-13, abs=1e-4), key


@pytest.mark.filterwarnings("ignore:F-score is ill-defined")  # sklearn, for a class never seen: 0, as ours
def test_cb_f1_is_the_harness_aggregation():
    pytest.importorskip("sklearn")
    cb_aggregate = pytest.importorskip("lm_eval.tasks.super_glue.cb.aggregate")
    rng = random.Random(3)
    for trial in range(30):
        n = rng.randint(2, 40)
        labels = rng.sample([0, 1, 2], rng.randint(1, 3))  # some classes never gold or never predicted
        pairs = [(rng.choice(labels), rng.choice([0, 1, 2])) for _ in range(n)]
        expected = cb_aggregate.cb_multi_fi(pairs)
        assert TASKS["cb"].aggregate("f1", pairs) == pytest.approx(expected, rel=1e-13, abs=1e-15)


def test_fixtures_cover_the_special_cases(fixture_dir):
    arc = TASKS["arc_easy"].load_docs(fixture_dir) + TASKS["arc_challenge"].load_docs(fixture_dir)
    assert any(d["choices"]["label"] == ["1", "2", "3", "4", "5"] for d in arc)
    assert any(len(d["choices"]["text"]) == 3 for d in arc)
    hellaswag = TASKS["hellaswag"].load_docs(fixture_dir)
    assert any(" [title]" in d["ctx_a"] and "[header]" in d["ctx_a"] and "  " in d["ctx_a"] for d in hellaswag)
    # the tags go; a double space can survive (three spaces become two), in the harness too
    assert all(isinstance(d["label"], str) and "[" not in d["query"] for d in hellaswag)
    [lambada] = [d for d in TASKS["lambada_openai"].load_docs(fixture_dir) if d["text"].endswith("Nebuchadnezzar")]
    assert TASKS["lambada_openai"].requests(lambada)[0][1] == " Nebuchadnezzar"
    page = max(TASKS["wikitext"].load_docs(fixture_dir), key=lambda d: len(d["page"]))["page"]
    assert len(page.split()) > 300 and all(m in page for m in (" @-@ ", " = = ", " , ", " @,@ "))
    [text] = TASKS["wikitext"].requests({"page": page})
    assert " @-@ " not in text and "==" in text and " , " not in text
    race = [ast.literal_eval(d["problems"]) for d in TASKS["race"].load_docs(fixture_dir)]
    assert all(len(problems) >= 2 for problems in race)
    assert any(p["question"].endswith("  _  .") for problems in race for p in problems[:-1])
    assert TASKS["copa"].requests({"premise": "It rained.", "choice1": "We stayed in.", "choice2": "We swam.",
                                   "question": "effect", "label": 0})[0] == ("It rained therefore", "  we stayed in.")


def test_winogrande_has_one_context_per_option_and_one_continuation():
    doc = {"sentence": "Ann gave Beth a book because _ had finished it.", "option1": "Ann", "option2": "Beth",
           "answer": "1"}
    task = TASKS["winogrande"]
    assert task.requests(doc) == [("Ann gave Beth a book because Ann", " had finished it."),
                                  ("Ann gave Beth a book because Beth", " had finished it.")]
    assert task.process(doc, [(-1.0, False), (-2.0, True)]) == {"acc": 1.0}


def test_tasks_named_groups_order_and_errors():
    assert [t.name for t in tasks_named("lambada_openai,superglue")] == ["lambada_openai", *GROUPS["superglue"]]
    assert [t.name for t in tasks_named("paper")] == list(GROUPS["paper"])
    assert [t.name for t in tasks_named(["boolq", "superglue", " boolq "])] == list(GROUPS["superglue"])
    assert tasks_named("arc_easy")[0] is TASKS["arc_easy"]
    with pytest.raises(ValueError, match=r"did you mean 'hellaswag'.*arc_easy.*superglue"):
        tasks_named("lambada_openai,hellaswg")
    with pytest.raises(ValueError, match="no task"):
        tasks_named(" , ")
    with pytest.raises(ValueError, match="has no metric"):
        TASKS["piqa"].aggregate("f1", [(0, 1)])


def test_load_docs_reads_parquet_and_limits(fixture_dir, tmp_path):
    import datasets

    for name in ("arc_easy", "race", "hellaswag"):
        task = TASKS[name]
        rows = [json.loads(line) for line in (fixture_dir / f"{name}.jsonl").read_text().splitlines()]
        datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / f"{name}.parquet"))
        assert task.load_docs(tmp_path) == task.load_docs(fixture_dir)
        assert task.load_docs(tmp_path, limit=2) == task.load_docs(fixture_dir)[:2]
        assert task.load_docs(fixture_dir, limit=0) == []
        assert task.load_docs(fixture_dir, limit=1000) == task.load_docs(fixture_dir)
    with pytest.raises(ValueError, match="limit"):
        TASKS["piqa"].load_docs(fixture_dir, limit=-1)
    with pytest.raises(FileNotFoundError, match=r"piqa\.jsonl or .*piqa\.parquet"):
        TASKS["piqa"].load_docs(tmp_path)


def test_load_docs_from_the_hub_asks_for_the_harness_dataset(monkeypatch, fixture_dir):
    """Online where the hub answers; offline (datasets' cache) where it does not, for that call
    only; without asking it when offline mode is already set."""
    import datasets
    from huggingface_hub import constants

    calls, asked = [], []
    rows = [json.loads(line) for line in (fixture_dir / "hellaswag.jsonl").read_text().splitlines()]

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split, datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    for flag in task_module.DATASETS_OFFLINE_FLAGS:  # online, whatever this shell sets
        monkeypatch.setattr(datasets.config, flag, False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for answer in (None, "ConnectError: [Errno -2] Name or service not known"):
        monkeypatch.setattr(task_module, "hub_unreachable", lambda endpoint: asked.append(endpoint) or answer)
        docs = TASKS["hellaswag"].load_docs(limit=3)
        assert [d["gold"] for d in docs] == [int(r["label"]) for r in rows[:3]]
    assert calls == [("Rowan/hellaswag", None, "validation", False, False),
                     ("Rowan/hellaswag", None, "validation", True, True)]
    assert (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE) == (False, False)
    assert asked == [datasets.config.HF_ENDPOINT] * 2
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # HF_HUB_OFFLINE=1: nothing to ask
    TASKS["hellaswag"].load_docs(limit=3)
    assert len(asked) == 2


def test_the_cli_refuses_an_unknown_task_in_one_line(capsys):
    import eval.__main__ as cli
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--ckpt", "nowhere/ckpt.pt", "--tasks", "nonexistent"])
    assert exit_info.value.code == 2  # argparse's usage error, no traceback
    assert "--tasks nonexistent: unknown task or group 'nonexistent'" in capsys.readouterr().err
