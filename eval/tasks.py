"""The zero-shot tasks, transcribed from lm-evaluation-harness 0.4.13 (lm_eval/tasks/*).

Every prompt, choice list, gold label, per-example metric and aggregation below is the harness's:
the YAML templates (doc_to_text, doc_to_choice, doc_to_target), the utils they name
(hellaswag/utils.py, winogrande/preprocess_winogrande.py, race/preprocess_race.py,
wikitext/preprocess_wikitext.py, super_glue/{copa/utils.py, wsc/preprocess_wsc.py,
cb/aggregate.py}) and lm_eval/api/task.py's ConfigurableTask.process_results and
lm_eval/api/metrics.py. tests/test_eval_tasks.py checks them against the harness itself. The
harness is not needed here.

A Task turns a document into requests, the scorer (eval/scorer.py) computes their
log-likelihoods, and the Task turns those into per-example metric values and aggregates them:

    multiple_choice   requests [(context, " " + choice), ...]  results [(ll, is_greedy), ...]
    loglikelihood     requests [(context, continuation)]       results [(ll, is_greedy)]
    rolling           requests [document]                       results [ll]

Contexts are exactly the harness's zero-shot contexts (the prompt text, trailing spaces kept: the
scorer moves them as the harness's backends do), continuations include the target delimiter.
"""
from __future__ import annotations

import ast
import contextlib
import difflib
import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

TARGET_DELIMITER = " "  # the harness's default target_delimiter; none of these tasks changes it
LOCAL_SUFFIXES = (".jsonl", ".parquet")

Doc = dict


# ----------------------------------------------------------------------------------- aggregations
# lm_eval/api/metrics.py, line for line (Python's sum() included: its order of additions matters).

def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def perplexity(values: Sequence[float]) -> float:
    return math.exp(-mean(values))


def weighted_mean(pairs: Sequence[tuple[float, int]]) -> float:
    a, b = zip(*pairs)
    return sum(a) / sum(b)


def weighted_perplexity(pairs: Sequence[tuple[float, int]]) -> float:
    return math.exp(-weighted_mean(pairs))


def bits_per_byte(pairs: Sequence[tuple[float, int]]) -> float:
    return -weighted_mean(pairs) / math.log(2)


def cb_macro_f1(pairs: Sequence[tuple[int, int]]) -> float:
    """super_glue/cb/aggregate.py's cb_multi_fi: the mean over the three classes of sklearn's
    binary f1_score (0 where a class is neither predicted nor gold). The harness unpacks the
    (gold, pred) pairs as (preds, golds); F1 is symmetric in the two, so that changes nothing."""
    preds, golds = zip(*pairs)
    scores = []
    for label in range(3):
        true_positives = sum(p == label and g == label for p, g in zip(preds, golds))
        denominator = sum(g == label for g in golds) + sum(p == label for p in preds)
        scores.append(2.0 * true_positives / denominator if denominator else 0.0)
    return sum(scores) / len(scores)


def sample_stddev(values: Sequence[float]) -> float:
    mu = mean(values)
    return math.sqrt(sum([(x - mu) ** 2 for x in values]) / (len(values) - 1))


def mean_stderr(values: Sequence[float]) -> float:
    return sample_stddev(values) / math.sqrt(len(values))


def bootstrap_stderr(statistic: Callable[[np.ndarray], list[float]], values: Sequence[float],
                     iters: int = 100_000, rows: int = 200) -> float:
    """The harness's bootstrap_stderr, vectorised: resample `values` with replacement `iters`
    times in chunks of min(1000, iters), chunk i drawing from random.Random(i) exactly as
    random.choices does (floor(random() * n)); the sample stddev of the statistics. numpy's
    RandomState seeded with [i] is the same Mersenne Twister stream as random.Random(i);
    `statistic` maps a (rows, n) array of resamples to their statistics. The resamples are the
    harness's (its multiprocessing and single-process paths draw the same ones); with Python
    3.11's sum() (the harness's mean) and cumsum-based statistics the result is its number bit for
    bit, from Python 3.12 sum() is compensated and the two agree to about 1e-15 relative."""
    xs = np.asarray(values, dtype=np.float64)
    n, chunk = len(xs), min(1000, iters)
    stats: list[float] = []
    for i in range(iters // chunk):
        stream = np.random.RandomState([i])
        for start in range(0, chunk, rows):
            draws = stream.random_sample((min(rows, chunk - start), n))
            stats.extend(statistic(xs[np.floor(draws * float(n)).astype(np.int64)]))
    return sample_stddev(stats)


def resampled_perplexity(samples: np.ndarray) -> list[float]:
    """perplexity() of each row; cumsum adds left to right, as Python 3.11's sum() does."""
    return [math.exp(-m) for m in (np.cumsum(samples, axis=1)[:, -1] / samples.shape[1]).tolist()]


AGGREGATIONS: dict[str, Callable] = {
    "acc": mean, "acc_norm": mean, "perplexity": perplexity,
    "word_perplexity": weighted_perplexity, "byte_perplexity": weighted_perplexity,
    "bits_per_byte": bits_per_byte,
    "f1": cb_macro_f1,  # only cb reports f1 here, with its own aggregation
}


# ----------------------------------------------------------------------------------- the hub
# datasets reads HF_HUB_OFFLINE (from 2.20) or HF_DATASETS_OFFLINE (2.19), set from the environment
# at import; huggingface_hub reads its own HF_HUB_OFFLINE.
DATASETS_OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def datasets_offline() -> bool:
    """Whether datasets is in offline mode (HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1)."""
    import datasets

    return any(getattr(datasets.config, flag, False) for flag in DATASETS_OFFLINE_FLAGS)


@functools.cache
def hub_unreachable(endpoint: str) -> str | None:
    """Why the hub at ``endpoint`` cannot be reached (the network error of one HEAD request, through
    huggingface_hub's own HTTP client: its proxies, certificates and timeout for metadata
    requests), or None if it answered. Asked once per process and endpoint."""
    from huggingface_hub import constants, get_session

    errors: tuple[type[Exception], ...] = (OSError,)  # requests' errors (huggingface_hub < 1.0) are OSErrors
    with contextlib.suppress(ImportError):
        import httpx  # huggingface_hub >= 1.0

        errors += (httpx.TransportError,)
    try:
        get_session().head(endpoint, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except errors as error:
        return f"{type(error).__name__}: {error}"
    return None


@contextlib.contextmanager
def hub_offline():
    """datasets and huggingface_hub in offline mode (as HF_HUB_OFFLINE=1 sets it at import), for
    the calls inside only. Where the hub cannot be reached this makes datasets read its cache, or
    fail, at once: online, the hub client retries every request for about 25 seconds first."""
    import datasets
    from huggingface_hub import constants

    flags = [(datasets.config, flag) for flag in DATASETS_OFFLINE_FLAGS if hasattr(datasets.config, flag)]
    flags.append((constants, "HF_HUB_OFFLINE"))
    saved = [getattr(module, flag) for module, flag in flags]
    try:
        for module, flag in flags:
            setattr(module, flag, True)
        yield
    finally:
        for (module, flag), value in zip(flags, saved):
            setattr(module, flag, value)


# ----------------------------------------------------------------------------------- tasks

@dataclass(frozen=True)
class Task:
    """One harness task: where its documents are and how they are scored (see the module doc)."""
    name: str                  # "arc_easy"
    version: str               # the harness's metadata version, as a string
    dataset_path: str          # "allenai/ai2_arc"
    dataset_name: str | None   # "ARC-Easy"
    split: str                 # the split the harness evaluates: its test_split, else validation_split
    kind: str                  # "multiple_choice" | "loglikelihood" | "rolling"
    metrics: tuple[str, ...]   # ("acc", "acc_norm")
    harness_task: str = field(default="", kw_only=True)  # the harness's task name: `name` unless set (rte)
    preprocess: Callable[[Doc], Doc] | None = field(default=None, kw_only=True, repr=False)

    def __post_init__(self):
        if not self.harness_task:
            object.__setattr__(self, "harness_task", self.name)

    # -- documents
    def local_file(self, data_dir: str | Path) -> Path:
        """<data_dir>/<name>.jsonl, else <data_dir>/<name>.parquet; an error naming both if neither exists."""
        candidates = [Path(data_dir) / f"{self.name}{suffix}" for suffix in LOCAL_SUFFIXES]
        for path in candidates:
            if path.is_file():
                return path
        raise FileNotFoundError(
            f"task {self.name}: no local data file; expected {' or '.join(str(p) for p in candidates)} "
            f"(the {self.split} split of {self.dataset_path}"
            f"{'/' + self.dataset_name if self.dataset_name else ''} in the hub's schema)")

    def load_docs(self, data_dir: str | Path | None = None, limit: int | None = None) -> list[Doc]:
        """The evaluated documents in the harness's order, after the harness's process_docs (HellaSwag's).
        data_dir None: the hub through datasets.load_dataset, or datasets' cache offline where the hub
        does not answer (hub_unreachable); else the local file (see local_file).
        limit: the first `limit` documents."""
        import datasets  # slow to import: only when data is needed

        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if data_dir is None:
            unreachable = None if datasets_offline() else hub_unreachable(datasets.config.HF_ENDPOINT)
            try:
                with hub_offline() if unreachable else contextlib.nullcontext():
                    dataset = datasets.load_dataset(self.dataset_path, self.dataset_name, split=self.split)
            except ConnectionError as error:  # offline, or the hub unreachable, and no copy in datasets' cache
                why = (f"the hub ({datasets.config.HF_ENDPOINT}) cannot be reached ({unreachable}) and datasets' "
                       f"cache has no copy of {self.dataset_path}" if unreachable else str(error))
                raise ConnectionError(f"task {self.name}: {why}. Without the hub, give local files: --data-dir DIR "
                                      f"(zero_shot_data_dir in a training config) holding {self.name}.jsonl or "
                                      f".parquet in the hub's schema; `python -m eval.samples DIR` writes small "
                                      f"sample ones") from error
        else:
            path = self.local_file(data_dir)
            builder = "json" if path.suffix == ".jsonl" else "parquet"
            dataset = datasets.load_dataset(builder, data_files={self.split: str(path)}, split=self.split)
        if limit is not None:
            dataset = dataset.select(range(min(limit, len(dataset))))
        docs = [dict(doc) for doc in dataset]
        return [{**doc, **self.preprocess(doc)} for doc in docs] if self.preprocess else docs

    # -- scoring: implemented by the kinds below
    def requests(self, doc: Doc) -> list[tuple[str, str]] | list[str]:
        raise NotImplementedError

    def process(self, doc: Doc, results: list) -> dict[str, object]:
        raise NotImplementedError

    def aggregate(self, metric: str, values: list) -> float:
        """The harness's aggregation of the per-example values of `metric`."""
        self._check_metric(metric, values)
        return AGGREGATIONS[metric](values)

    def stderr(self, metric: str, values: list, bootstrap_iters: int = 100_000) -> float | None:
        """The harness's standard error: for mean metrics the sample stddev over sqrt(n); for
        perplexity (LAMBADA) the harness's bootstrap with its default 100,000 resamples, reproduced
        exactly (bootstrap_stderr above; about 10 s on 2 CPU cores for LAMBADA's 5,153 examples);
        None where the harness reports "N/A": weighted perplexities, bits_per_byte, cb's f1 (its
        custom aggregation has no stderr), a single example, or bootstrap_iters <= 0."""
        self._check_metric(metric, values)
        if len(values) <= 1 or bootstrap_iters <= 0:
            return None
        if AGGREGATIONS[metric] is mean:
            return mean_stderr(values)
        if AGGREGATIONS[metric] is perplexity:
            return bootstrap_stderr(resampled_perplexity, values, iters=bootstrap_iters)
        return None

    def _check_metric(self, metric: str, values: list) -> None:
        if metric not in self.metrics:
            raise ValueError(f"task {self.name} has no metric {metric!r}; its metrics: {', '.join(self.metrics)}")
        if not values:
            raise ValueError(f"task {self.name}: no values to aggregate for {metric}")


def _gold_index(gold: int | str, choices: list[str]) -> int:
    """ConfigurableTask.process_results: an index past the choices, or a string that is none of
    them, becomes -100 (never right)."""
    if isinstance(gold, str):
        return choices.index(gold) if gold in choices else -100
    return gold if gold < len(choices) else -100


@dataclass(frozen=True)
class MultipleChoiceTask(Task):
    """output_type: multiple_choice. One request per choice: (prompt, " " + choice). Without a
    prompt but with `shared_target` (winogrande's multiple inputs) the choices are partial contexts
    and each request is (choice, " " + shared_target), as ConfigurableTask does."""
    prompt: Callable[[Doc], str] | None = field(kw_only=True, repr=False)
    choices: Callable[[Doc], list[str]] = field(kw_only=True, repr=False)
    gold: Callable[[Doc], int | str] = field(kw_only=True, repr=False)
    shared_target: Callable[[Doc], str] | None = field(default=None, kw_only=True, repr=False)
    kind: str = "multiple_choice"
    metrics: tuple[str, ...] = ("acc", "acc_norm")

    def requests(self, doc: Doc) -> list[tuple[str, str]]:
        if self.shared_target is not None:
            continuation = TARGET_DELIMITER + self.shared_target(doc)
            return [(context, continuation) for context in self.choices(doc)]
        context = self.prompt(doc)
        return [(context, TARGET_DELIMITER + choice) for choice in self.choices(doc)]

    def process(self, doc: Doc, results: list) -> dict[str, object]:
        """acc: argmax log-likelihood is the gold; acc_norm: argmax of log-likelihood over the number
        of characters of the choice as doc_to_choice gives it (no delimiter); f1: (gold, pred)."""
        choices = self.choices(doc)
        if len(results) != len(choices):
            raise ValueError(f"task {self.name}: {len(results)} results for {len(choices)} choices")
        lls = np.array([float(ll) for ll, _ in results])
        pred = int(np.argmax(lls))
        pred_norm = int(np.argmax(lls / np.array([float(len(c)) for c in choices])))
        gold = _gold_index(self.gold(doc), choices)
        values = {"acc": 1.0 if pred == gold else 0.0, "f1": (gold, pred),
                  "acc_norm": 1.0 if pred_norm == gold else 0.0}
        return {metric: values[metric] for metric in self.metrics}


@dataclass(frozen=True)
class LoglikelihoodTask(Task):
    """output_type: loglikelihood (LAMBADA): one (context, target) request; perplexity is the
    log-likelihood (aggregated as exp(-mean)), acc whether the target is the greedy continuation."""
    prompt: Callable[[Doc], str] = field(kw_only=True, repr=False)
    target: Callable[[Doc], str] = field(kw_only=True, repr=False)
    kind: str = "loglikelihood"
    metrics: tuple[str, ...] = ("perplexity", "acc")

    def requests(self, doc: Doc) -> list[tuple[str, str]]:
        return [(self.prompt(doc), self.target(doc))]

    def process(self, doc: Doc, results: list) -> dict[str, object]:
        (ll, is_greedy), = results
        return {"perplexity": ll, "acc": int(is_greedy)}


@dataclass(frozen=True)
class RollingTask(Task):
    """output_type: loglikelihood_rolling (WikiText): the detokenized document's total
    log-likelihood; words and bytes are counted on the original page, as preprocess_wikitext does."""
    document: Callable[[Doc], str] = field(kw_only=True, repr=False)
    kind: str = "rolling"
    metrics: tuple[str, ...] = ("word_perplexity", "byte_perplexity", "bits_per_byte")

    def requests(self, doc: Doc) -> list[str]:
        return [self.document(doc)]

    def process(self, doc: Doc, results: list) -> dict[str, object]:
        (ll,) = results
        original = doc["page"]
        words, n_bytes = len(re.split(r"\s+", original)), len(original.encode("utf-8"))
        return {"word_perplexity": (ll, words), "byte_perplexity": (ll, n_bytes), "bits_per_byte": (ll, n_bytes)}


# ----------------------------------------------------------------------------------- prompts
# Each function is the harness's template or util of the same task, transcribed.

def _rendered_target(value) -> int | str:
    """A doc_to_target template's output: Jinja renders a string, which becomes an int when it is
    all digits (ConfigurableTask.doc_to_target with doc_to_choice set)."""
    text = str(value)
    return ast.literal_eval(text) if text.isdigit() else text


def _lambada_context(doc: Doc) -> str:  # "{{text.split(' ')[:-1]|join(' ')}}"
    return " ".join(doc["text"].split(" ")[:-1])


def _lambada_target(doc: Doc) -> str:  # "{{' '+text.split(' ')[-1]}}"
    return " " + doc["text"].split(" ")[-1]


def wikitext_detokenizer(doc: Doc) -> str:
    """wikitext/preprocess_wikitext.py (its no-op /' [0-9]/ substitution included)."""
    string = doc["page"]
    string = string.replace("s '", "s'")
    string = re.sub(r"/' [0-9]/", r"/'[0-9]/", string)
    for old, new in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" : ", ": "), (" ; ", "; "),
                     (" . ", ". "), (" ! ", "! "), (" ? ", "? "), (" , ", ", ")):
        string = string.replace(old, new)
    string = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", string)
    string = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", string)
    string = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", string)
    string = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', string)
    string = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", string)
    for old, new in (("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" " + chr(176) + " ", chr(176)),
                     (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")):
        string = string.replace(old, new)
    return string


def _question_answer(doc: Doc, question_field: str) -> str:  # arc, piqa: "Question: {{...}}\nAnswer:"
    return f"Question: {doc[question_field]}\nAnswer:"


def _hellaswag_clean(text: str) -> str:  # hellaswag/utils.py: preprocess
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def _hellaswag_process_doc(doc: Doc) -> Doc:  # hellaswag/utils.py: process_docs
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return {"query": _hellaswag_clean(doc["activity_label"] + ": " + ctx),
            "choices": [_hellaswag_clean(ending) for ending in doc["endings"]],
            "gold": int(doc["label"])}


def _winogrande_gold(doc: Doc) -> int:  # preprocess_winogrande.doc_to_text
    return {"1": 0, "2": 1}[doc["answer"]]


def _winogrande_target(doc: Doc) -> str:  # preprocess_winogrande.doc_to_target
    idx = doc["sentence"].index("_") + 1
    return doc["sentence"][idx:].strip()


def _winogrande_choices(doc: Doc) -> list[str]:  # preprocess_winogrande.doc_to_choice
    idx = doc["sentence"].index("_")
    return [doc["sentence"][:idx] + opt for opt in (doc["option1"], doc["option2"])]


_RACE_LETTERS = {"A": 0, "B": 1, "C": 2, "D": 3}


def _race_problems(doc: Doc) -> list[dict]:
    return ast.literal_eval(doc["problems"])


def _race_prompt(doc: Doc) -> str:  # race/preprocess_race.py: doc_to_text
    problems = _race_problems(doc)
    text = "Article: " + doc["article"] + "\n\n"
    for problem in problems[:-1]:
        answer = problem["options"][_RACE_LETTERS[problem["answer"]]]
        if problem["question"][-6:] == "  _  .":
            text += problem["question"][:-5] + answer + "\n"
        else:
            text += "Question: " + problem["question"] + "\n" + "Answer: " + answer + "\n"
    return text + problems[-1]["question"]


def _race_choices(doc: Doc) -> list[str]:
    return [_race_problems(doc)[-1]["options"][i] for i in range(4)]


def _race_gold(doc: Doc) -> int:
    return _RACE_LETTERS[_race_problems(doc)[-1]["answer"]]


def _copa_choice(choice: str) -> str:  # super_glue/copa/utils.py: convert_choice
    return choice[0].lower() + choice[1:]


def _copa_prompt(doc: Doc) -> str:  # the premise without its period, then the connector
    connector = {"cause": "because", "effect": "therefore"}[doc["question"]]
    return doc["premise"].strip()[:-1] + f" {connector}"


def _copa_choices(doc: Doc) -> list[str]:  # with a leading space, to which the delimiter adds another
    return [" " + _copa_choice(doc["choice1"]), " " + _copa_choice(doc["choice2"])]


def _copa_gold(doc: Doc) -> str:  # a string, found among the choices by process_results
    return " " + _copa_choice(doc["choice1"] if doc["label"] == 0 else doc["choice2"])


def general_detokenize(string: str) -> str:  # lm_eval/utils.py
    string = string.replace(" n't", "n't").replace(" )", ")").replace("( ", "(")
    string = string.replace('" ', '"').replace(' "', '"')
    return re.sub(r" (['.,])", r"\1", string)


def _wsc_prompt(doc: Doc) -> str:  # super_glue/wsc/preprocess_wsc.py: span indices count words
    raw_passage = doc["text"]
    pre = " ".join(raw_passage.split()[: doc["span2_index"]])
    post = raw_passage[len(pre) + len(doc["span2_text"]) + 1:]
    passage = general_detokenize(pre + " *{}*".format(doc["span2_text"]) + post)
    noun, pronoun = doc["span1_text"], doc["span2_text"]
    return (f"Passage: {passage}\n"
            f'Question: In the passage above, does the pronoun "*{pronoun}*" refer to "*{noun}*"?\n'
            "Answer:")


def _fixed(choices: list[str]) -> Callable[[Doc], list[str]]:
    return lambda doc: list(choices)


def _field(name: str) -> Callable[[Doc], object]:
    return lambda doc: doc[name]


def _super_glue(name: str, version: str, prompt: Callable[[Doc], str], labels: list[str] | None = None, *,
                dataset_name: str | None = None, metrics: tuple[str, ...] = ("acc",), **kwargs) -> MultipleChoiceTask:
    """A SuperGLUE task as the harness's super-glue-lm-eval-v1 YAMLs define it (validation split); with
    `labels` the choices are those words and the gold is the label column."""
    if labels is not None:
        kwargs.update(choices=_fixed(labels), gold=_field("label"))
    return MultipleChoiceTask(name, version, "aps/super_glue", dataset_name or name, "validation",
                              metrics=metrics, prompt=prompt, **kwargs)


def _arc(name: str, dataset_name: str) -> MultipleChoiceTask:
    return MultipleChoiceTask(
        name, "1.0", "allenai/ai2_arc", dataset_name, "test",
        prompt=lambda doc: _question_answer(doc, "question"),
        choices=lambda doc: list(doc["choices"]["text"]),
        gold=lambda doc: doc["choices"]["label"].index(doc["answerKey"]))


_TASK_LIST: tuple[Task, ...] = (
    LoglikelihoodTask("lambada_openai", "1.0", "EleutherAI/lambada_openai", "default", "test",
                      prompt=_lambada_context, target=_lambada_target),
    RollingTask("wikitext", "2.0", "EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test",
                document=wikitext_detokenizer),
    _arc("arc_easy", "ARC-Easy"),
    _arc("arc_challenge", "ARC-Challenge"),
    MultipleChoiceTask("hellaswag", "1.0", "Rowan/hellaswag", None, "validation",
                       preprocess=_hellaswag_process_doc, prompt=_field("query"), choices=_field("choices"),
                       gold=lambda doc: _rendered_target(doc["label"])),
    MultipleChoiceTask("piqa", "1.0", "baber/piqa", None, "validation",
                       prompt=lambda doc: _question_answer(doc, "goal"),
                       choices=lambda doc: [doc["sol1"], doc["sol2"]], gold=_field("label")),
    MultipleChoiceTask("winogrande", "1.0", "allenai/winogrande", "winogrande_xl", "validation",
                       metrics=("acc",), prompt=None, choices=_winogrande_choices,
                       gold=_winogrande_gold, shared_target=_winogrande_target),
    MultipleChoiceTask("race", "3.0", "EleutherAI/race", "high", "test", metrics=("acc",),
                       prompt=_race_prompt, choices=_race_choices, gold=_race_gold),
    _super_glue("boolq", "2.0", lambda d: f"{d['passage']}\nQuestion: {d['question']}?\nAnswer:", ["no", "yes"]),
    _super_glue("cb", "1.0",
                lambda d: f"{d['premise']}\nQuestion: {d['hypothesis']}. True, False, or Neither?\nAnswer:",
                ["True", "False", "Neither"], metrics=("acc", "f1")),
    _super_glue("copa", "1.0", _copa_prompt, choices=_copa_choices, gold=_copa_gold),
    _super_glue("rte", "0.0", lambda d: f"{d['premise']}\nQuestion: {d['hypothesis']} True or False?\nAnswer:",
                ["True", "False"], harness_task="sglue_rte"),
    _super_glue("wic", "1.0", lambda d: (
        f"Sentence 1: {d['sentence1']}\nSentence 2: {d['sentence2']}\nQuestion: Is the word "
        f"'{d['sentence1'][d['start1']:d['end1']]}' used in the same way in the two sentences above?\nAnswer:"),
        ["no", "yes"]),
    _super_glue("wsc", "1.0", _wsc_prompt, ["no", "yes"], dataset_name="wsc.fixed"),
)

TASKS: dict[str, Task] = {task.name: task for task in _TASK_LIST}
GROUPS: dict[str, tuple[str, ...]] = {
    "superglue": ("boolq", "cb", "copa", "rte", "wic", "wsc"),
    "paper": ("lambada_openai", "wikitext", "arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande",
              "race", "boolq", "cb", "copa", "rte", "wic", "wsc"),
}


def tasks_named(names: str | list[str]) -> list[Task]:
    """Tasks from comma-separated (or listed) task and group names, groups expanded, in the order
    given, each task once. An unknown name is an error listing the valid ones."""
    if isinstance(names, str):
        names = names.split(",")
    tasks: dict[str, Task] = {}
    for name in (n.strip() for n in names):
        if not name:
            continue
        if name in GROUPS:
            tasks.update((member, TASKS[member]) for member in GROUPS[name] if member not in tasks)
        elif name in TASKS:
            tasks.setdefault(name, TASKS[name])
        else:
            valid = [*TASKS, *GROUPS]
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown task or group {name!r}{hint}; valid tasks: {', '.join(TASKS)}; "
                             f"groups: {', '.join(GROUPS)}")
    if not tasks:
        raise ValueError(f"no task given; valid tasks: {', '.join(TASKS)}; groups: {', '.join(GROUPS)}")
    return list(tasks.values())


def check_zero_shot(tasks: str, data_dir: str | None, limit: int | None = None, fetch: bool = False) -> None:
    """Check a training config's zero-shot tasks before anything trains (a ConfigError naming the
    key and the fix): their names, then their data: the local files in ``data_dir``, or with
    ``fetch`` the hub's, fetched and cached now, so that a task whose data cannot be reached is
    found before training, not after it."""
    from configs import ConfigError  # (configs imports torch, through model.py: only to check a config)
    try:
        named = tasks_named(tasks)
    except ValueError as error:
        raise ConfigError(f"zero_shot_tasks={tasks!r}: {error}") from error
    for task in named:
        if data_dir is not None:
            try:
                task.local_file(data_dir)
            except FileNotFoundError as error:
                raise ConfigError(f"zero_shot_data_dir={data_dir!r}: {error}") from error
        elif fetch:
            try:
                task.load_docs(None, limit)
            except ConnectionError as error:
                raise ConfigError(f"zero_shot_tasks={tasks!r}: {error}") from error
