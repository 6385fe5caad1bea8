"""Zero-shot evaluation speed: our evaluator against lm-evaluation-harness's `hf` backend, on the
same exported model and the same local task files, in one run.

    python -m scripts.bench_eval [--model mini] [--copies 20] [--batch-size 16] [--tasks paper]

Builds a GPT of the --model preset (random weights: speed does not depend on them), saves it as a
checkpoint and exports it with hf.export; writes task files in the hub's schemas: the sample
tasks (eval/samples.py), each example repeated --copies times with a marker that
makes every copy a different text (identical requests would be scored once by our evaluator).
Then times `python -m eval`'s evaluate() and lm_eval.simple_evaluate(model="hf") at the same
batch size, checks that every metric agrees, and prints examples/s of both and the ratio.
"""
import argparse
import tempfile
import time
from pathlib import Path

import torch

# Where each task's copies get their marker, so that prompts stay well formed: a field and whether
# the marker goes before or after its text (span indices count from the start; LAMBADA's last
# word and a WikiText page's first heading stay where they are).
MARKED_FIELDS = {
    "lambada_openai": ("text", "before"), "wikitext": ("page", "after"), "arc_easy": ("question", "after"),
    "arc_challenge": ("question", "after"), "hellaswag": ("ctx_a", "before"), "piqa": ("goal", "after"),
    "winogrande": ("sentence", "after"), "race": ("article", "after"), "boolq": ("passage", "after"),
    "cb": ("premise", "before"), "copa": ("premise", "before"), "rte": ("premise", "before"),
    "wic": ("sentence2", "after"), "wsc": ("text", "after"),
}


def write_task_files(data_dir: Path, copies: int) -> int:
    """The fixtures, each example `copies` times with a distinct marker; the number of examples."""
    import json
    from eval.samples import write_fixtures
    rows = write_fixtures(data_dir)
    total = 0
    for task, task_rows in rows.items():
        field, where = MARKED_FIELDS[task]
        with open(data_dir / f"{task}.jsonl", "w", encoding="utf-8") as f:
            for copy in range(copies):
                for row in task_rows:
                    marker = f"Item {copy}."
                    text = row[field]
                    row = {**row, field: f"{marker} {text}" if where == "before" else f"{text} {marker}"}
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    total += 1
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mini", help="a model.py preset (mini: 6 layers, 384 wide)")
    parser.add_argument("--copies", type=int, default=20, help="copies of each fixture example")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--tasks", default="paper")
    args = parser.parse_args()

    import lm_eval
    from lm_eval.tasks import TaskManager

    from data.tokenizer import get_tokenizer
    from eval import evaluate
    from eval.scorer import Scorer
    from eval.tasks import tasks_named
    from eval.samples import write_harness_tasks
    from hf import export
    from model import GPT, GPTConfig
    from training.checkpoint import Checkpoint

    torch.manual_seed(0)
    config = GPTConfig.preset(args.model, block_size=1024)
    model = GPT(config).eval()
    tasks = tasks_named(args.tasks)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        Checkpoint.of_model(model, "gpt2").save(scratch / "ckpt.pt")
        export(scratch / "ckpt.pt", scratch / "hf")
        n_examples = write_task_files(scratch / "tasks", args.copies)
        written = write_harness_tasks(scratch / "harness_tasks", scratch / "tasks")
        n_examples = sum(len(task.load_docs(scratch / "tasks")) for task in tasks)
        print(f"model {args.model} ({model.num_params() / 1e6:.1f}M non-embedding parameters), {len(tasks)} tasks, "
              f"{n_examples} examples, batch size {args.batch_size}, {torch.get_num_threads()} threads")

        start = time.perf_counter()
        scorer = Scorer(model, get_tokenizer("gpt2"), batch_size=args.batch_size)
        ours = evaluate(scorer, tasks, data_dir=scratch / "tasks")["results"]
        our_seconds = time.perf_counter() - start

        manager = TaskManager(include_path=str(scratch / "harness_tasks"), include_defaults=False)
        names = {task.name: written[task.name][1] for task in tasks}
        start = time.perf_counter()
        theirs = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={scratch / 'hf'},dtype=float32",
                                         tasks=list(names.values()), task_manager=manager, batch_size=args.batch_size,
                                         device="cpu", bootstrap_iters=0)["results"]
        their_seconds = time.perf_counter() - start

    mismatches = [f"{task.name}/{metric}: ours {ours[task.name][metric]:.6g}, harness "
                  f"{theirs[names[task.name]][f'{metric},none']:.6g}"
                  for task in tasks for metric in task.metrics
                  if abs(ours[task.name][metric] - theirs[names[task.name]][f"{metric},none"])
                  > 1e-6 * max(1.0, abs(ours[task.name][metric]))]
    print(f"{'evaluator':<34}{'s':>8}{'examples/s':>12}")
    print(f"{'python -m eval (eval/scorer.py)':<34}{our_seconds:>8.1f}{n_examples / our_seconds:>12.1f}")
    print(f"{'lm-eval 0.4.13 hf backend':<34}{their_seconds:>8.1f}{n_examples / their_seconds:>12.1f}")
    print(f"ours / harness: {their_seconds / our_seconds:.2f}x examples/s; metrics "
          + ("identical (to 1e-6)" if not mismatches else "DIFFER: " + "; ".join(mismatches)))


if __name__ == "__main__":
    main()
