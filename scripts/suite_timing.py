"""The test suite's counts and time, written into tests/README.md's generated block (the one place
the docs state them).

    python -m scripts.suite_timing                 # run the whole suite and the quick tier, write both rows
    python -m scripts.suite_timing --tier quick    # only the quick tier (pytest -m "not slow"), ~1.5 min
    python -m scripts.suite_timing --tier full --summary "2138 passed, 13 skipped in 763.00s (0:12:43)"
                                                   # write a row from a summary line measured elsewhere

A tier runs as ``python -m pytest -q`` (the whole suite, pytest.ini's workers) or with ``-m "not slow"``
(the quick tier) from the repository root, its output passed through; the last line of pytest's
summary ("2138 passed, 13 skipped in 763.00s (0:12:43)") gives the counts and the time. The block,
between ``<!-- suite-timing -->`` and ``<!-- /suite-timing -->``, is a table with a row per tier:
the command, the counts, the time, the date, the CPU (``/proc/cpuinfo``'s model name, whether it has
AMX and AVX512-BF16, the cores this process may use) and torch's version. A tier not run keeps its
row. A run with a failure or an error writes nothing and exits 1. ``--summary`` writes the row from a
given line instead of running pytest (``--cpu``, ``--date`` and ``--torch`` name what measured it,
each by default this machine, today and the installed torch).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "tests" / "README.md"
START, END = "<!-- suite-timing -->", "<!-- /suite-timing -->"
# Each tier: its name in the block, its pytest arguments (besides -q), the command a reader types.
TIERS = {"full": ("whole suite", [], "python -m pytest"),
         "quick": ("quick tier", ["-m", "not slow"], 'python -m pytest -m "not slow"')}
HEADER = ["tier", "command", "result", "time", "measured"]
SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ \w+(?:, \d+ \w+)*) in (?P<seconds>[\d.]+)s(?: \([\d:]+\))?\s*=*$")


def parse_summary(line: str) -> tuple[dict[str, int], float]:
    """pytest's final line ("2138 passed, 13 skipped in 763.00s (0:12:43)", with or without the
    rule of '=' around it): the counts by outcome (warnings left out) and the seconds."""
    match = SUMMARY.match(line.strip())
    if not match:
        raise ValueError(f"not a pytest summary line: {line!r}")
    counts = {}
    for number, outcome in re.findall(r"(\d+) (\w+)", match["counts"]):
        outcome = {"error": "errors", "warning": "warnings"}.get(outcome, outcome)
        if outcome != "warnings":
            counts[outcome] = int(number)
    return counts, float(match["seconds"])


def last_summary(output: str) -> str:
    """The last line of a pytest run's output that is its summary."""
    lines = [line for line in output.splitlines() if SUMMARY.match(line.strip())]
    if not lines:
        raise ValueError("pytest printed no summary line")
    return lines[-1]


def duration(seconds: float) -> str:
    """78 -> "78 s", 763 -> "12 min 43 s"."""
    whole = round(seconds)
    return f"{whole} s" if whole < 120 else f"{whole // 60} min {whole % 60} s"


def cpu_description() -> str:
    """The CPU as the docs name it: "AMD EPYC (AVX512-BF16, no AMX), 2 cores"."""
    try:  # every core lists the same model name and flags
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in lines)}
    model, flags = " ".join(fields.get("model name", "unknown CPU").split()), set(fields.get("flags", "").split())
    features = []
    if flags:
        features.append("AVX512-BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags else
                        "AVX2" if "avx2" in flags else "no AVX2")
        features.append("AMX" if "amx_tile" in flags else "no AMX")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    listed = " (" + ", ".join(features) + ")" if features else ""
    return f"{model}{listed}, {cores} cores"


def row(tier: str, summary: str, date: str, cpu: str, torch: str) -> str:
    """The block's row for ``tier`` from pytest's summary line; a failure or an error refuses."""
    counts, seconds = parse_summary(summary)
    bad = {k: v for k, v in counts.items() if k in ("failed", "errors") and v}
    if bad:
        raise ValueError(f"the {tier} tier did not pass ({summary.strip()}): nothing written")
    name, _, command = TIERS[tier]
    result = ", ".join(f"{number:,} {outcome}" for outcome, number in counts.items())
    cells = [name, f"`{command}`", result, duration(seconds), f"{date}, {cpu}, torch {torch}"]
    return "| " + " | ".join(cells) + " |"


def write_block(document: str, rows: dict[str, str]) -> str:
    """``document`` with its suite-timing block's rows of the given tiers replaced (the others kept,
    the tiers in TIERS' order)."""
    if document.count(START) != 1 or document.count(END) != 1 or document.index(START) > document.index(END):
        raise ValueError(f"the document has no single {START} ... {END} block")
    head, rest = document.split(START, 1)
    body, tail = rest.split(END, 1)
    names = {name: tier for tier, (name, _, _) in TIERS.items()}
    kept = {}
    for line in body.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] in names:
            kept[names[cells[0]]] = line
    kept.update(rows)
    table = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    table += [kept[tier] for tier in TIERS if tier in kept]
    return head + START + "\n" + "\n".join(table) + "\n" + END + tail


def run_tier(tier: str, extra: list[str]) -> str:
    """Run the tier's pytest from the repository root, its output passed through; its summary line."""
    _, args, _ = TIERS[tier]
    process = subprocess.Popen([sys.executable, "-m", "pytest", "-q", *args, *extra], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    for line in process.stdout:
        sys.stdout.write(line)
        output.append(line)
    process.wait()
    return last_summary("".join(output))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", choices=["both", *TIERS], default="both", help="which tiers to run (default both)")
    parser.add_argument("--summary", help="write the row from this pytest summary line instead of running pytest "
                                          "(one tier: --tier full or quick)")
    parser.add_argument("--cpu", default=None, help="the CPU that measured it (default this machine's, /proc/cpuinfo)")
    parser.add_argument("--date", default=None, help="the day it was measured (default today, YYYY-MM-DD)")
    parser.add_argument("--torch", default=None, help="torch's version it ran with (default the installed one)")
    parser.add_argument("--readme", type=Path, default=README, help="the page holding the block (tests/README.md)")
    parser.add_argument("pytest_args", nargs="*", help="more arguments for pytest (after --)")
    args = parser.parse_args(argv)
    if args.summary and args.tier == "both":
        parser.error("--summary is one tier's line: give --tier full or --tier quick")
    date = args.date or datetime.date.today().isoformat()
    cpu = args.cpu or cpu_description()
    torch = args.torch or importlib.metadata.version("torch")
    tiers = ["quick", "full"] if args.tier == "both" else [args.tier]  # the quick tier first: it fails sooner
    rows = {}
    try:
        for tier in tiers:
            summary = args.summary or run_tier(tier, args.pytest_args)
            rows[tier] = row(tier, summary, date, cpu, torch)
        args.readme.write_text(write_block(args.readme.read_text(), rows))
    except ValueError as error:
        sys.exit(str(error))
    for tier in tiers:
        print(f"{args.readme}: {rows[tier]}")


if __name__ == "__main__":
    main()
