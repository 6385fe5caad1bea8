"""The numbers of the docs that a tool produced are that tool's: each block of a page (README.md,
docs/*.md) marked ``<!-- report: ARCHIVE [SELECT_ON REPORT_ON], SECTION -->`` equals the first
table under SECTION of ``scripts/report.py``'s report of the run archive ARCHIVE (docs/), each
archive's committed report.md beside it is that report whole, and the count of paper configs is
the count of files."""
import re

import pytest

from helpers import ROOT
from study.report import REPORT_BLOCK, fill_blocks, report
from study.runs import find_runs

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
pytestmark = pytest.mark.docs


def blocks() -> list[tuple]:
    return [block for page in PAGES for block in REPORT_BLOCK.findall(page.read_text())]


def first_table(text: str, heading: str) -> str:
    """The first markdown table after the line starting with ``heading``, found here by hand."""
    lines = text.splitlines()
    start = [i for i, line in enumerate(lines) if line.startswith(heading)][0]
    end = start + 1
    while end < len(lines) and not lines[end].startswith("|"):
        end += 1
    stop = end
    while stop < len(lines) and lines[stop].startswith("|"):
        stop += 1
    return "\n".join(lines[end:stop])


def test_the_docs_have_report_blocks():
    archives = {archive for archive, *_ in blocks()}
    assert {"docs/demo/runs.tar.xz", "docs/demo/diverge.tar.xz", "docs/mini_study/runs.tar.xz",
            "docs/cbs_study/runs.tar.xz"} <= archives


@pytest.mark.parametrize("archive, select_on, report_on, section, body", blocks(),
                         ids=lambda value: value if isinstance(value, str) and len(value) < 40 else None)
def test_a_readme_table_is_the_report_s(archive, select_on, report_on, section, body):
    text = report(find_runs([ROOT / archive]), None, select_on or "val/loss", report_on or None)
    assert (ROOT / archive).with_name((ROOT / archive).name.removesuffix(".tar.xz") + ".md").read_text() == text
    assert body.removesuffix("\n") == first_table(text, section), \
        f"the docs' {section} of {archive} is not the report's"


def test_the_paper_config_count_is_the_number_of_files():
    stated = re.search(r"one editable file per point \((\d+) files", (ROOT / "docs" / "configs.md").read_text())
    assert int(stated.group(1)) == len(list((ROOT / "configs" / "paper").glob("*.py")))


def test_filling_blocks_keeps_the_text_around_them_an_empty_block_included():
    """scripts.report --update fills each block of its archive with its section's table, an empty new
    block too, and leaves everything else as it was (an empty block once swallowed what followed it)."""
    document = ("intro\n<!-- report: A.tar.xz, ## S -->\n<!-- end -->\nprose\n<!-- report: B.tar.xz, ## S -->\n"
                "| b |\n<!-- end -->\n<!-- report: A.tar.xz, ## T -->\n| old |\n| old |\n<!-- end -->\nend\n")
    filled = fill_blocks(document, "A.tar.xz", "## S\n\n| s |\n|---|\n\n## T\ntext\n| t |\n")
    assert filled == ("intro\n<!-- report: A.tar.xz, ## S -->\n| s |\n|---|\n<!-- end -->\nprose\n"
                      "<!-- report: B.tar.xz, ## S -->\n| b |\n<!-- end -->\n"
                      "<!-- report: A.tar.xz, ## T -->\n| t |\n<!-- end -->\nend\n")
