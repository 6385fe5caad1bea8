"""python -m eval: zero-shot tasks on a checkpoint of train.py (or a Hugging Face GPT-2 folder).

    python -m eval --ckpt runs/NAME/ckpt.pt --tasks lambada_openai,hellaswag,superglue
    python -m eval --hf path/to/gpt2 --tasks paper --data-dir tasks/ --out results.json
    python -m eval --ckpt runs/NAME/ckpt.pt --tasks paper --samples    # offline, a first try

Task data comes from the Hugging Face hub through `datasets` (its cache, offline, where the hub
does not answer), or with --data-dir from local files <DIR>/<task>.jsonl or .parquet in the
hub's schema, or with --samples from the small sample tasks of eval/samples.py (a check that
evaluation runs, not a benchmark; `python -m eval.samples DIR` writes them into DIR). Prints a
table and writes a JSON file with every metric, its stderr (lm-evaluation-harness's, "N/A" in
the table and null in the JSON where the harness reports none), n, the task versions, the
tokenizer, the checkpoint's step and the exact configuration; --log-samples adds every
example's requests and log-likelihoods. Without --out the file lies beside the model: one per
checkpoint, results_<step>.json in the checkpoint's folder (its step written as in
ckpt_<step>.pt), or results.json in the Hugging Face folder (results_samples... with --samples).

An existing results file of the same model (the same checkpoint at the same step, or the same HF
folder) is merged by task: a task evaluated again replaces its own result, the others stay, and
each task keeps the configuration it was evaluated with (``task_config``). A results file of
another model is never replaced unless --overwrite is given: the refusal names that model and an
--out of this one's own. A results file belongs to a model by its content (``model_sha256``, a
hash of its weights): the same checkpoint named two ways (``ckpt.pt`` or the numbered file it
points at) is one model. Results are never written into the run folder of another model (a folder
with a run's config.json beside its checkpoints or metrics.jsonl, at or above --out): they would
pass for that run's, and its train.py --overwrite deletes them. Evaluations writing one file at
once merge under a lock (on the results file's folder): nothing one of them wrote is lost.
"""
import argparse
import fcntl
import json
import os
import shlex
import sys
from pathlib import Path

import torch

from atomic import atomic_write
from data.tokenizer import get_tokenizer
from eval import evaluate, format_table
from eval.samples import samples_dir
from eval.scorer import Scorer
from eval.tasks import tasks_named
from hf import from_hf
from model import GPT
from training.checkpoint import load_model
from training.run_folder import model_sha256, run_folder_around


def load(args) -> tuple[GPT, str, dict]:
    """(model, tokenizer name, description of where it came from, with its weights' hash)."""
    if args.hf:
        model = from_hf(args.hf)
        source = {"hf": str(args.hf), "model_sha256": model_sha256(model)}
        return model, hf_folder_tokenizer(Path(args.hf), model), source
    model, checkpoint = load_model(Path(args.ckpt))
    return model, checkpoint.config["tokenizer"], {"ckpt": str(args.ckpt), "step": checkpoint.step,
                                                   "model_sha256": model_sha256(model),
                                                   "train_config": checkpoint.config}


def hf_folder_tokenizer(folder: Path, model: GPT) -> str:
    """The tokenizer of a Hugging Face model folder: the one an export of this project names in its
    nanomerit.json; else tiktoken's GPT-2 for a GPT-2 (OpenAI's folders), the folder's own files for
    any other model (a Llama's tokenizer, loaded by transformers)."""
    provenance = folder / "nanomerit.json"
    if provenance.is_file():
        return json.loads(provenance.read_text())["tokenizer"]
    return "gpt2" if model.config.arch == "gpt2" else str(folder)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ckpt", help="a checkpoint written by train.py (RUN/ckpt.pt)")
    source.add_argument("--hf", help="a Hugging Face GPT2LMHeadModel folder (e.g. OpenAI's GPT-2) or LlamaForCausalLM "
                                     "folder (its tokenizer: the one an export names, else the folder's own)")
    parser.add_argument("--tasks", required=True, help="comma-separated tasks and groups (superglue, paper)")
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--data-dir", help="local task files <DIR>/<task>.jsonl|.parquet instead of the hub")
    data.add_argument("--samples", action="store_true",
                      help="the sample tasks of eval/samples.py instead of the hub: offline, a handful of examples "
                           "per task (results apart from the real ones: results_samples... unless --out)")
    parser.add_argument("--limit", type=int, help="only the first N examples of each task")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="results JSON (default: beside the model, results_<step>.json "
                                                  "next to --ckpt, results.json in the --hf folder)")
    parser.add_argument("--log-samples", action="store_true", help="add per-example log-likelihoods to the JSON")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out even if it holds another model's results")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        parser.error("--batch-size and --limit must be positive")

    try:
        tasks = tasks_named(args.tasks)
    except ValueError as error:
        parser.error(f"--tasks {args.tasks}: {error}")
    try:
        model, tokenizer_name, source_info = load(args)
        out = args.out or default_out(args, source_info)
        check_run_folder(out, args)  # (another run's --overwrite would delete them)
        earlier_results(out, source_info, args.overwrite)  # checked before the (long) evaluation, and at the end
        check_writable(out)
        data_dir = samples_dir() if args.samples else args.data_dir
    except (OSError, ValueError) as error:  # a missing or foreign checkpoint / HF folder, a results file
        sys.exit(f"eval: {error}")
    scorer = Scorer(model.to(args.device), get_tokenizer(tokenizer_name), batch_size=args.batch_size,
                    device=args.device)
    quiet_datasets()
    try:
        output = evaluate(scorer, tasks, data_dir=data_dir, limit=args.limit, log_samples=args.log_samples)
    except ConnectionError as error:  # neither the hub nor datasets' cache has the task: say what works offline
        command = shlex.join(["python", "-m", "eval", *(sys.argv[1:] if argv is None else argv), "--samples"])
        sys.exit(f"eval: {error}. Or evaluate on the sample tasks, offline: {command}")
    except (FileNotFoundError, ValueError) as error:  # a task's local file missing; a task the model cannot score
        sys.exit(f"eval: {error}")
    print(format_table(output["results"]))
    eval_config = {key: (str(v) if isinstance(v, Path) else v) for key, v in vars(args).items()}
    record = {**output, "tokenizer": tokenizer_name, **source_info, "model_config": vars(model.config),
              "eval_config": eval_config, "command": sys.argv,
              "task_config": {task: {"eval_config": eval_config, "command": sys.argv} for task in output["results"]}}
    try:
        write_results(out, record, source_info, args.overwrite)
    except ValueError as error:  # another model's results written meanwhile
        sys.exit(f"eval: {error}")
    print(f"wrote {out}")


def default_out(args, source_info: dict) -> Path:
    """Where the results go without --out: beside the model. A checkpoint's in its folder, one file
    per checkpoint (results_<step>.json, its step as in ckpt_<step>.pt), so two checkpoints of a run
    keep both; a Hugging Face folder's in it. Sample results are kept apart from the real ones
    (results_samples...): the two would merge by task."""
    name = "results_samples" if args.samples else "results"
    if args.hf:
        return Path(args.hf) / f"{name}.json"
    return Path(args.ckpt).parent / f"{name}_{source_info['step']:08d}.json"


def check_run_folder(out: Path, args) -> None:
    """An error if ``out`` lies in the run folder of another model than the one evaluated: they
    would pass for that run's results, and its train.py --overwrite removes them with its files."""
    run = run_folder_around(out.resolve().parent)
    own = Path(args.hf) if args.hf else Path(args.ckpt).parent  # (the folder of its name: ckpt.pt is a link)
    if run is not None and run not in (own.resolve(), *own.resolve().parents):
        raise ValueError(f"--out {out} is in the run folder {run} of another model than {args.hf or args.ckpt} "
                         f"(that run's train.py --overwrite would delete them): write them into the model's own "
                         f"folder, --out {own / out.name}, or write them outside it")


def check_writable(out: Path) -> None:
    """An error naming --out if its folder cannot be written (found before the evaluation, not after it)."""
    existing = next(p for p in (out.parent, *out.parent.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write the results file {out}: {existing} is not a writable folder; choose "
                              f"another --out")


def write_results(out: Path, record: dict, source_info: dict, overwrite: bool) -> None:
    """Merge ``record`` into ``out`` by task, under an exclusive lock on its folder, reading the
    file again inside it: an evaluation that wrote meanwhile keeps its tasks."""
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(out.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)  # (released when the descriptor closes)
        earlier = earlier_results(out, source_info, overwrite)
        for key in ("results", "samples", "task_config"):  # the earlier tasks stay; a task run again is replaced
            if key in earlier or key in record:
                record[key] = {**earlier.get(key, {}), **record.get(key, {})}
        with atomic_write(out) as f:
            f.write(json.dumps(record, indent=2).encode())
    finally:
        os.close(folder)


def quiet_datasets() -> None:
    """No progress bars from datasets or huggingface_hub (loading each task's split draws several):
    the table and the scorer's progress stay readable."""
    import datasets
    import huggingface_hub

    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()


def earlier_results(out: Path, source_info: dict, overwrite: bool) -> dict:
    """The results already in ``out`` to merge with (nothing with ``overwrite`` or no file); an
    error if they are of another model, so that one evaluation never replaces another's."""
    if overwrite or not out.exists():
        return {}
    try:
        earlier = json.loads(out.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"--out {out} exists and is not a results file ({error}): choose another --out, or "
                         f"pass --overwrite to replace it") from error
    # Which model: the weights' hash (a file written before it was recorded: the checkpoint's name and step).
    identity = ("model_sha256",) if isinstance(earlier, dict) and "model_sha256" in earlier else ("ckpt", "step", "hf")
    if not isinstance(earlier, dict) or "results" not in earlier or any(
            earlier.get(key) != source_info.get(key) for key in identity):
        held = ", ".join(f"{key} {earlier.get(key)}" for key in ("ckpt", "hf", "step", "model_sha256")
                         if isinstance(earlier, dict) and key in earlier)
        own = out.with_name(f"{out.stem}_{source_info['model_sha256'][:12]}{out.suffix}")
        raise ValueError(f"--out {out} holds the results of another model ({held or 'not a results file'}): write "
                         f"this model's with --out {own}, or pass --overwrite to replace them")
    return earlier


if __name__ == "__main__":
    main()
