"""Data pipeline speed and memory: preparation and loading.

    python -m scripts.bench_data [--tokens 50_000_000] [--workers 1 2]

1. Writes a synthetic corpus of about --tokens GPT-2 tokens as parquet files laid out like the
   hub's export, then prepares it with data/prepare.py once per --workers value and with a plain
   ``datasets`` baseline (``load_dataset`` + ``map(num_proc=max workers)`` + concatenate, the way
   nanoGPT's prepare.py does it, without its sharded memmap writer). Each run is a fresh process;
   prints tokens/s and the peak RSS of the run (the largest of its process and its workers).
2. Times ``TokenLoader.next_batch`` on the prepared shards (also document-aligned) and a training
   step of the default config's model at GPT-2's vocabulary (configs/default.py: forward, backward
   and MERIT step) in this process; prints the loader's share of a step.
"""
import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

VOCABULARY = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
              "have an they you were her she there been one all we their has would when if so no will more "
              "training batch optimizer attention logit trust ratio gradient model language").split()
TOKENS_PER_DOCUMENT = 700  # roughly OpenWebText's mean (9.0B tokens / 8.0M documents is ~1,100)


def write_corpus(folder: Path, tokens: int, files: int = 8) -> int:
    """Synthetic documents (random words: about one GPT-2 token per word) as <folder>/plain_text/
    train/NNNN.parquet; the number of documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = random.Random(0)
    n_documents = max(1, tokens // TOKENS_PER_DOCUMENT)
    out = folder / "plain_text" / "train"
    out.mkdir(parents=True)
    per_file = -(-n_documents // files)
    for index in range(files):
        count = min(per_file, n_documents - index * per_file)
        docs = [" ".join(rng.choices(VOCABULARY, k=rng.randint(TOKENS_PER_DOCUMENT // 2, 3 * TOKENS_PER_DOCUMENT // 2)))
                for _ in range(count)]
        pq.write_table(pa.table({"text": docs}), out / f"{index:04d}.parquet", row_group_size=1000)
    return n_documents


def run_ours(source: str, out_dir: str, workers: int) -> dict:
    from data.prepare import hub_corpus, prepare
    start = time.perf_counter()
    manifest = prepare(hub_corpus(source, kind="openwebtext"), out_dir=out_dir, workers=workers)
    seconds = time.perf_counter() - start
    return {"tokens": sum(s["tokens"] for s in manifest["splits"].values()), "seconds": seconds}


def run_baseline(source: str, out_dir: str, workers: int) -> dict:
    """nanoGPT's recipe: an Arrow copy of the corpus, map() in num_proc processes, then the
    concatenated ids written out."""
    import datasets
    import numpy as np
    from data.tokenizer import get_tokenizer
    start = time.perf_counter()
    dataset = datasets.load_dataset(source, split="train", cache_dir=str(Path(out_dir) / "hf_cache"))
    tokenizer = get_tokenizer("gpt2")

    def encode(batch):
        return {"ids": [[tokenizer.eot_token, *ids] for ids in tokenizer.encode_batch(batch["text"])]}
    tokenized = dataset.map(encode, batched=True, remove_columns=["text"], num_proc=workers)
    ids = np.concatenate([np.asarray(ids, dtype=np.uint16) for ids in tokenized["ids"]])
    ids.tofile(Path(out_dir) / "train.bin")
    return {"tokens": int(ids.size), "seconds": time.perf_counter() - start}


def child(kind: str, source: str, out_dir: str, workers: int) -> None:
    """One measured run, in its own process; prints its result as JSON on the last line."""
    result = (run_ours if kind == "ours" else run_baseline)(source, out_dir, workers)
    # ru_maxrss is in KiB on Linux; for children, the largest single child.
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({**result, "peak_rss_mib": peak / 1024}))


def measure(kind: str, source: Path, workers: int, scratch: Path) -> dict:
    out_dir = scratch / f"{kind}-{workers}"
    out_dir.mkdir()
    result = subprocess.run([sys.executable, "-m", "scripts.bench_data", "--child", kind, str(source), str(out_dir),
                             str(workers)], cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{kind} with {workers} workers failed:\n{result.stderr[-3000:]}")
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "out_dir": out_dir}


def time_loader_and_step(data_dir: Path, steps: int) -> None:
    import torch
    import optim
    from configs import load_config
    from data.loader import TokenLoader
    from model import GPT
    from study.bench import median_ms
    from training.run_config import resolve_config

    run = resolve_config(load_config(ROOT / "configs" / "default.py"))
    config = run.config
    model_config = config.model_config(50257)
    model = GPT(model_config)
    optimizer = optim.build(run.optimizer_settings, model)
    block, batch = model_config.block_size, config.micro_batch_size

    loader = TokenLoader(data_dir, "train", batch, block, vocab_size=50257)
    load_ms = median_ms(loader.next_batch, steps)
    x, y = loader.next_batch()

    def train_step():
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    step_ms = median_ms(train_step, steps)
    print(f"\nloader: {load_ms:.3f} ms per {batch}x{block} micro-batch; the default model's training step "
          f"{step_ms:.1f} ms: the loader is {100 * load_ms / step_ms:.2f}% of a step")
    for align in (False, True):
        big = TokenLoader(data_dir, "train", 8, 1024, vocab_size=50257, align_documents=align, eot_token=50256)
        print(f"loader: {median_ms(big.next_batch, steps):.3f} ms per 8x1024 micro-batch (GPT-2's context)"
              f"{', document-aligned' if align else ''}")
        big.close()


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        kind, source, out_dir, workers = sys.argv[2:]
        child(kind, source, out_dir, int(workers))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=50_000_000, help="approximate corpus size in GPT-2 tokens")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=20, help="timed loader / training steps")
    args = parser.parse_args()
    from tqdm import tqdm
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        source = scratch / "corpus"
        n_documents = write_corpus(source, args.tokens)
        print(f"synthetic corpus: {n_documents:,} documents, about {args.tokens / 1e6:.0f}M tokens, parquet")
        runs = [("ours", w) for w in args.workers] + [("baseline", max(args.workers))]
        results = {}
        for kind, workers in tqdm(runs, desc="preparations"):
            results[kind, workers] = measure(kind, source, workers, scratch)
        base = results["baseline", max(args.workers)]
        print(f"{'preparation':<34}{'tokens':>14}{'s':>8}{'Mtok/s':>8}{'vs baseline':>13}{'peak RSS MiB':>14}")
        for (kind, workers), r in results.items():
            name = f"{'data/prepare.py' if kind == 'ours' else 'datasets.map + concatenate'}, {workers} worker{'s' * (workers > 1)}"
            rate = r["tokens"] / r["seconds"]
            print(f"{name:<34}{r['tokens']:>14,}{r['seconds']:>8.1f}{rate / 1e6:>8.2f}"
                  f"{rate / (base['tokens'] / base['seconds']):>12.2f}x{r['peak_rss_mib']:>14.0f}")
        time_loader_and_step(results["ours", args.workers[0]]["out_dir"], args.steps)


if __name__ == "__main__":
    main()
