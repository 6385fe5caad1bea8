"""scripts/suite_timing.py: pytest's summary line parsed and written into the suite-timing block
(tests/README.md's, the one place the docs state the suite's counts and time), each tier's row
replaced and the rest of the page kept; a failed run writes nothing; the committed block is the
script's own output."""
import re
import subprocess
import sys

import pytest

from helpers import ROOT

START, END = "<!-- suite-timing -->", "<!-- /suite-timing -->"
HEADER = "| tier | command | result | time | measured |\n|---|---|---|---|---|\n"
CPU, DATE, TORCH = "Some CPU (AVX2, no AMX), 3 cores", "2031-02-03", "9.9.9"


def write(readme, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.suite_timing", "--readme", str(readme), "--cpu", CPU,
                           "--date", DATE, "--torch", TORCH, *args], cwd=ROOT, capture_output=True, text=True)


def block(text: str) -> str:
    return text.split(START + "\n", 1)[1].split(END, 1)[0]


def test_a_summary_line_is_written_into_its_tier_s_row_and_the_page_kept(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Tests\n\nbefore\n{START}\n{END}\nafter, 2 passed in 3 s by hand\n")
    result = write(readme, "--tier", "full", "--summary", "2138 passed, 13 skipped in 763.00s (0:12:43)")
    assert result.returncode == 0, result.stderr
    full = (f"| whole suite | `python -m pytest` | 2,138 passed, 13 skipped | 12 min 43 s | "
            f"{DATE}, {CPU}, torch {TORCH} |\n")
    assert readme.read_text() == f"# Tests\n\nbefore\n{START}\n{HEADER}{full}{END}\nafter, 2 passed in 3 s by hand\n"
    # The quick tier's line (with pytest's rule of '=' and its warnings): its row added after the whole suite's.
    result = write(readme, "--tier", "quick", "--summary", "==== 1905 passed, 246 deselected, 4 warnings in 78.41s "
                                                           "(0:01:18) ====", "--date", "2031-02-04")
    assert result.returncode == 0, result.stderr
    quick = ('| quick tier | `python -m pytest -m "not slow"` | 1,905 passed, 246 deselected | 78 s | '
             f"2031-02-04, {CPU}, torch {TORCH} |\n")
    assert block(readme.read_text()) == HEADER + full + quick
    # The whole suite again: its row replaced, the quick tier's kept, the order the tiers'.
    assert write(readme, "--tier", "full", "--summary", "7 passed in 59.5s").returncode == 0
    assert block(readme.read_text()) == HEADER + full.replace("2,138 passed, 13 skipped | 12 min 43 s",
                                                              "7 passed | 60 s") + quick


@pytest.mark.parametrize("summary", ["2130 passed, 1 failed, 13 skipped in 700.00s (0:11:40)",
                                     "5 passed, 2 errors in 3.10s", "no tests ran in 0.01s"])
def test_a_failed_run_or_a_line_that_is_not_a_summary_writes_nothing(tmp_path, summary):
    readme = tmp_path / "README.md"
    text = f"{START}\n{HEADER}| whole suite | old | old | old | old |\n{END}\n"
    readme.write_text(text)
    result = write(readme, "--tier", "full", "--summary", summary)
    assert result.returncode == 1 and readme.read_text() == text
    assert "nothing written" in result.stderr or "not a pytest summary line" in result.stderr


def test_a_page_without_one_block_is_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no block here\n")
    result = write(readme, "--tier", "quick", "--summary", "1 passed in 1.00s")
    assert result.returncode == 1 and "suite-timing" in result.stderr


@pytest.mark.slow  # (pytest run as a process, about 4 s)
def test_a_tier_run_by_the_script_reads_pytest_s_own_summary(tmp_path):
    """The script running pytest (here on one test, in one process) and reading its real summary line."""
    readme = tmp_path / "README.md"
    readme.write_text(f"{START}\n{END}\n")
    result = write(readme, "--tier", "quick", "--", "-n", "0", "tests/test_repo.py::test_nothing_edits_sys_path")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.fullmatch(r"\| quick tier \| `python -m pytest -m \"not slow\"` \| 1 passed \| \d+ s \| "
                        + re.escape(f"{DATE}, {CPU}, torch {TORCH}") + r" \|\n", block(readme.read_text()).split(
                            HEADER, 1)[1])


@pytest.mark.docs
def test_the_committed_block_is_the_script_s_output_and_the_only_statement_of_the_suite_s_time(tmp_path):
    """Each row of tests/README.md's block, its summary line and measurement given back to the script,
    writes the same block: the block is generated, not edited by hand. No other page states a tier's
    count of passed tests."""
    text = (ROOT / "tests" / "README.md").read_text()
    rows = block(text).split(HEADER, 1)[1].splitlines()
    assert [r.split(" | ")[0] for r in rows] == ["| whole suite", "| quick tier"]
    copy = tmp_path / "README.md"
    copy.write_text(f"{START}\n{END}\n")
    for tier, line in zip(("full", "quick"), rows):
        _, _, result, time, measured = [cell.strip() for cell in line.strip().strip("|").split("|")]
        minutes, seconds = re.fullmatch(r"(?:(\d+) min )?(\d+) s", time).groups()
        date, rest = measured.split(", ", 1)
        cpu, torch = rest.rsplit(", torch ", 1)
        counts = re.sub(r"(?<=\d),(?=\d{3})", "", result)
        summary = f"{counts} in {int(minutes or 0) * 60 + int(seconds)}.00s"
        ran = subprocess.run([sys.executable, "-m", "scripts.suite_timing", "--readme", str(copy), "--tier", tier,
                              "--summary", summary, "--cpu", cpu, "--date", date, "--torch", torch],
                             cwd=ROOT, capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
    assert block(copy.read_text()) == block(text)
    for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        assert not re.search(r"\d passed\b", page.read_text()), f"{page.name} states the suite's counts"
