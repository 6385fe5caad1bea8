"""The numbers of the docs that a tool produced are that tool's: each block of a page (README.md,
docs/*.md, docs/results/*.md) marked ``<!-- report: ARCHIVE [SELECT_ON REPORT_ON], SECTION -->``
equals the first table under SECTION of ``scripts/report.py``'s report of the run archive ARCHIVE
(docs/), each archive's committed report.md beside it is that report whole, and the count of paper
configs is the count of files. Each study's page (docs/results/) opens with what it found, and
each number of its findings, and of the index's line for it (docs/results.md), is held here against
the cells of the same reports, with what a finding says of them (lowest, every interval including
0, ...)."""
import functools
import re

import pytest

from helpers import ROOT
from study.report import REPORT_BLOCK, fill_blocks, report
from study.runs import find_runs

RESULTS = ROOT / "docs" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(RESULTS.glob("*.md"))]
pytestmark = pytest.mark.docs

DEMO, DIVERGE, CBS = "docs/demo/runs.tar.xz", "docs/demo/diverge.tar.xz", "docs/cbs_study/runs.tar.xz"
MINI, BENCHMARK = "docs/mini_study/runs.tar.xz", "docs/mini_study/benchmark.tar.xz"
CURES, SMALL = "docs/mini_study/llama_cures.tar.xz", "docs/mini_study/small_batch.tar.xz"
HELDOUT = {MINI, BENCHMARK, CURES, CBS, SMALL}  # their lrs chosen on val/loss, their tables read on heldout/loss
# Each study's page and the archives its tables come from.
STUDY_PAGES = {"default_job.md": {DEMO, DIVERGE}, "batch_axis.md": {MINI, SMALL}, "benchmark.md": {BENCHMARK},
               "critical_batch.md": {CBS}, "cures.md": {CURES}, "local_steps.md": set()}
# The local-steps study's own report (scripts/replica_study.py), its tables a section an optimizer.
REPLICA_REPORT = ROOT / "docs" / "replica_study" / "report.md"
BATCHES = ("8", "32", "128", "512")


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


@functools.cache
def report_of(archive: str, select_on: str, report_on: str | None) -> str:
    return report(find_runs([ROOT / archive]), None, select_on, report_on)


def parse_table(table: str) -> list[dict[str, str]]:
    """A markdown table's rows, each a dict by column (a repeated header's second column: "NAME 2")."""
    lines = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.splitlines()]
    names = []
    for name in lines[0]:
        names.append(f"{name} 2" if name in names else name)
    return [dict(zip(names, cells)) for cells in lines[2:]]


def rows(archive: str, section: str) -> list[dict[str, str]]:
    """The rows of the first table under ``section`` of the archive's report, the one its blocks hold."""
    text = report_of(archive, "val/loss", "heldout/loss" if archive in HELDOUT else None)
    return parse_table(first_table(text, section))


def findings(page: str, section: str | None = None) -> list[str]:
    """The bullets a results page opens with (its first list), or its ``## section`` opens with,
    each on one line."""
    text = (RESULTS / page).read_text()
    if section:
        text = text.split(f"\n## {section}\n", 1)[1]
    bullets = []
    for line in text.splitlines():
        if line.startswith("- "):
            bullets.append(line[2:])
        elif bullets and line.startswith("  "):
            bullets[-1] += " " + line.strip()
        elif bullets:
            break
    return bullets


def flat(text: str) -> str:
    return " ".join(text.split())


def index_line(title: str) -> str:
    """The paragraph of the results index (docs/results.md) under ``## title``, on one line."""
    return flat((ROOT / "docs" / "results.md").read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0])


def says(text: str, *fragments: str) -> None:
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} is not in: {text}"


def interval(cell: str) -> tuple[float, float]:
    low, high = re.search(r"\[([-+][\d.]+), ([-+][\d.]+)\]", cell).groups()
    return float(low), float(high)


def excludes_zero(cell: str) -> bool:
    low, high = interval(cell)
    return low > 0 or high < 0


def mean(cell: str) -> str:
    return cell.split()[0]


def spread(cell: str, which: str) -> float:
    """A loss cell's std ("±") or 95% half-width ("[±")."""
    return float(re.search(re.escape(which) + r"([\d.]+)", cell).group(1))


def extremes(values: list[str]) -> tuple[str, str]:
    return min(values, key=float), max(values, key=float)


def selected_lr(cell: str) -> str:
    return re.search(r"\(lr ([\d.e+-]+),", cell).group(1)


def test_the_docs_have_report_blocks():
    archives = {archive for archive, *_ in blocks()}
    assert {"docs/demo/runs.tar.xz", "docs/demo/diverge.tar.xz", "docs/mini_study/runs.tar.xz",
            "docs/cbs_study/runs.tar.xz"} <= archives
    for page, sources in STUDY_PAGES.items():  # each study's tables on its own page
        assert {archive for archive, *_ in REPORT_BLOCK.findall((RESULTS / page).read_text())} == sources, page


@pytest.mark.parametrize("archive, select_on, report_on, section, body", blocks(),
                         ids=lambda value: value if isinstance(value, str) and len(value) < 40 else None)
def test_a_readme_table_is_the_report_s(archive, select_on, report_on, section, body):
    text = report_of(archive, select_on or "val/loss", report_on or None)
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


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_results_index_reaches_every_study_page_and_the_links_resolve():
    """docs/results.md links each study's page and no other; the study pages' relative links (their
    figures, each other) resolve (tests/test_repo.py checks docs/*.md's), and every link to a
    page's section (README.md's to the index's) names a heading of that page."""
    index = (ROOT / "docs" / "results.md").read_text()
    assert set(re.findall(r"\]\((results/[\w.-]+\.md)\)", index)) == {f"results/{page}" for page in STUDY_PAGES}
    assert {p.name for p in RESULTS.glob("*.md")} == set(STUDY_PAGES)
    for page in RESULTS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), (page.name, target)
    for page in [*PAGES, ROOT / "tests" / "README.md"]:
        for target, anchor in re.findall(r"\]\(([^)#:\s]+\.md)#([^)]+)\)", page.read_text()):
            headings = re.findall(r"^#+ (.+)$", (page.parent / target).read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, (page.name, target, anchor)


def test_each_study_page_opens_with_what_it_found_naming_its_tables():
    sections = {section.removeprefix("## ") for *_, section, _ in blocks()}
    sections |= set(re.findall(r"^## (.+)$", REPLICA_REPORT.read_text(), re.M))
    for page in STUDY_PAGES:
        lines = [line for line in (RESULTS / page).read_text().splitlines() if line]
        assert lines[0].startswith("# "), page
        first_heading = next(i for i, line in enumerate(lines[1:], 1) if line.startswith("#"))
        opening = next(i for i, line in enumerate(lines) if line.startswith("What it found"))
        assert opening <= first_heading + 2, f"{page} does not open with what it found"
        bullets = findings(page)
        assert 3 <= len(bullets) <= 6, page
        for bullet in bullets:
            named = re.findall(r"(?<![\w*])\*(?=\S)([^*]+?)(?<=\S)\*(?![\w*])", bullet)  # *Name*, not B* or **
            assert named, f"{page}: a finding names no table: {bullet}"
            for name in named:
                assert any(section.startswith(name) for section in sections), f"{page}: no table {name!r}"


def test_the_default_job_s_findings():
    page = (RESULTS / "default_job.md").read_text()
    grid = {(r["point"], r["lr"]): r for r in rows(DEMO, "## Every lr of the grid")}
    final = {r["point"]: r["batch 16"] for r in rows(DEMO, "## Final val/loss")}
    loss = {lr: r["final val/loss"] for (point, lr), r in grid.items() if point == "merit"}
    peak = {key: r["peak max logit (largest layer and seed)"] for key, r in grid.items()}
    job, best, ranking, runaway, clip = findings("default_job.md")
    # The measured job: its val loss and per-layer logits are the grid's run's at its lr.
    measured = dict(list(r.values()) for r in parse_table(first_table(page, "the README's first command on a fresh")))
    assert re.search(r"\*\*([\d.]+)\*\*", measured["val loss at step 0 / 400 / 800 / 1200"]).group(1) == loss["0.0067"]
    layers = rows(DEMO, "## Max attention logit per layer")
    merit = next(r for r in layers if r["point"] == "merit" and r["lr"] == "0.0067 (selected)")
    assert measured["final max attention logit, layers 0-3 (probe batch)"] == " / ".join(
        merit[f"layer_0{i}"].split(" / ")[1] for i in range(4))
    says(job, f"val loss {loss['0.0067']}", f"in {measured['whole command (venv, install, data, training, sample)']}")
    assert selected_lr(final["merit"]) == "0.0067" and min(loss.values(), key=float) == loss["0.0067"]
    assert set(loss) == {"0.0022", "0.0067", "0.02", "0.06"}
    says(best, f"{loss['0.0067']} against {loss['0.0022']} at 2.2e-3, {loss['0.02']} at 2e-2 and {loss['0.06']} at 6e-2")
    means = {point: mean(cell) for point, cell in final.items()}
    assert float(means["muon"]) < float(means["adamw"]) < float(means["merit"])
    says(ranking, f"Muon {means['muon']}, AdamW {means['adamw']}, MERIT {means['merit']}")
    assert selected_lr(final["adamw"]) == "0.003"
    says(runaway, f"{peak['merit', '0.0067']} at 6.7e-3, {peak['merit', '0.02']} at 2e-2 and {peak['merit', '0.06']} "
                  f"at 6e-2", f"AdamW's is {peak['adamw', '0.003']} at its best lr and {peak['adamw', '0.01']} at 0.01")
    diverge = {r["point"]: [r[f"layer_0{i}"].split(" / ")[1] for i in range(4)]
               for r in rows(DIVERGE, "## Max attention logit per layer")}
    with_clip, without = extremes(diverge["adamw + qk_clip 100"]), extremes(diverge["adamw"])
    diverged = {r["point"]: mean(r["batch 16"]) for r in rows(DIVERGE, "## Final val/loss")}
    says(clip, f"{with_clip[0]} to {with_clip[1]} with it and {without[0]} to {without[1]} without",
         f"val loss {diverged['adamw + qk_clip 100']} against {diverged['adamw']}")
    says(index_line("The default job"),
         f"MERIT ends at val loss {means['merit']}, AdamW at {means['adamw']} and Muon at {means['muon']}")


def test_the_batch_axis_findings():
    final = {r["point"]: r for r in rows(MINI, "## Final heldout/loss")}
    means = {(point, b): mean(r[f"batch {b}"]) for point, r in final.items() for b in BATCHES if r[f"batch {b}"] != "-"}
    delta = {(r["point"], r["batch"]): r["Δ vs adamw, same batch, paired by seed [95%]"]
             for r in rows(MINI, "## Against adamw")}
    grid = {(r["point"], r["batch"], r["lr"]): r for r in rows(MINI, "## Every lr of the grid")}
    peak = {key: r["peak max logit (largest layer and seed)"] for key, r in grid.items()}
    lowest, merit, lamb, growth, logits, clip = findings("batch_axis.md")

    muon = [means["muon", b] for b in BATCHES]
    for b in BATCHES:
        assert means["muon", b] == min((m for (_, batch), m in means.items() if batch == b), key=float)
        assert excludes_zero(delta["muon", b])
    says(lowest, f"{', '.join(muon[:3])} and {muon[3]} at batches 8, 32, 128 and 512",
         f"{delta['muon', '8']} at batch 8 to {delta['muon', '512']} at batch 512, every interval excluding 0")
    cells = [delta["merit", b] for b in BATCHES]
    assert not any(excludes_zero(cell) for cell in cells)
    says(merit, f"{', '.join(cells[:3])} and {cells[3]} at batches 8 to 512, every interval including 0")
    for b in BATCHES:
        m, l_ = final["merit"][f"batch {b}"], final["lamb"][f"batch {b}"]
        assert abs(float(mean(m)) - float(mean(l_))) <= spread(m, "[±") + spread(l_, "[±")  # the intervals overlap
        if b != "512":
            assert abs(float(mean(m)) - float(mean(l_))) < 0.03
    says(lamb, "within 0.03 of each other at batches 8 to 128",
         f"MERIT's {float(means['lamb', '512']) - float(means['merit', '512']):.3f} lower at 512 "
         f"({means['merit', '512']} against {means['lamb', '512']})")
    for point in final:
        values = [float(means[point, b]) for b in BATCHES if (point, b) in means]
        assert values == sorted(values) and len(set(values)) == len(values), point
    says(growth, f"AdamW's from {means['adamw', '8']} to {means['adamw', '512']}, "
                 f"MERIT's from {means['merit', '8']} to {means['merit', '512']}")
    selected = {(point, b): selected_lr(final[point][f"batch {b}"]) for point, b in means}
    at_best = sorted(((peak[point, b, lr], point, b) for (point, b), lr in selected.items()), key=lambda x: float(x[0]))
    assert at_best[-1][1:] == ("lamb", "512")
    says(logits, f"LAMB's {at_best[-1][0]} at batch 512, every other {at_best[-2][0]} or less")

    def at_three_times(points):
        values = []
        for (point, b), lr in selected.items():
            if point in points:
                [hit] = [p for (q, batch, other), p in peak.items()
                         if q == point and batch == b and abs(float(other) / float(lr) - 3) < 0.06]
                values.append(hit)
        return "{} to {}".format(*extremes(values))
    says(logits, f"LAMB and MERIT reach {at_three_times({'lamb', 'merit'})}", f"AdamW {at_three_times({'adamw'})}",
         f"Muon {at_three_times({'muon'})}")
    clipped = {point: means[point + " + qk_clip 10", "512"] for point in ("adamw", "muon")}
    assert clipped == {point: means[point, "512"] for point in ("adamw", "muon")}
    tau_peaks = [peak[point + " + qk_clip 10", "512", selected[point + " + qk_clip 10", "512"]] for point in ("adamw", "muon")]
    assert all(float(p) < 10 for p in tau_peaks)
    says(clip, f"({clipped['adamw']} and {clipped['muon']}", f"{tau_peaks[0]} and {tau_peaks[1]}, are below tau")
    triple = {point: [peak[q, "512", lr] for q, b, lr in grid if q == point and b == "512"
                      and float(lr) / float(selected["adamw" if "adamw" in point else "muon", "512"]) > 2.9]
              for point in ("adamw", "adamw + qk_clip 10", "muon", "muon + qk_clip 10")}
    says(flat((RESULTS / "batch_axis.md").read_text()),
         f"AdamW's peak {triple['adamw + qk_clip 10'][0]} with it against {triple['adamw'][0]} without, "
         f"Muon's {triple['muon + qk_clip 10'][0]} against {triple['muon'][0]}")
    assert not any(excludes_zero(cell) for cell in cells) and all(excludes_zero(delta["muon", b]) for b in BATCHES)
    says(index_line("The batch axis"), "No interval of MERIT's difference from AdamW excludes 0 at any of the four "
                                       "batches, while Muon's all do")


SMALL_END, SMALL_BATCHES = "The small-batch end (Marek et al. 2025)", ("1", "2", "4", "8", "32")


def test_the_small_batch_end_s_findings():
    """The batch-axis page's small-batch section (Marek et al. 2025's four claims): its findings, each
    naming its tables, held against the small_batch archive's report and bench_batch's table, and
    the index's line."""
    bullets = findings("batch_axis.md", SMALL_END)
    sections = {section.removeprefix("## ") for *_, section, _ in blocks()}
    for bullet in bullets:
        named = re.findall(r"(?<![\w*])\*(?=\S)([^*]+?)(?<=\S)\*(?![\w*])", bullet)
        assert named and all(any(s.startswith(name) for s in sections) for name in named), bullet
    half = "adamw (beta2 by half-life)"
    final = {r["point"]: r for r in rows(SMALL, "## Final heldout/loss")}
    largest = {(r["point"], r["batch"]): r for r in rows(SMALL, "## Small batches: each point against its optimizer's")}
    same = {(r["point"], r["batch"]): r for r in rows(SMALL, "## Small batches: against AdamW at the same batch")}
    good = {(r["point"], r["batch"]): r for r in rows(SMALL, "## Small batches: the range of good lrs")}
    wall = {(r["point"], r["batch"]): r for r in rows(SMALL, "## Small batches: wall time per token")}
    grid = rows(SMALL, "## Every lr of the grid")
    delta, vs_fixed, vs_half = "Δ, paired by seed [95%]", "Δ vs adamw, paired by seed [95%]", f"Δ vs {half}, paired by seed [95%]"
    stable, half_life, rivals, merit, robust, accumulation = bullets
    # 1. beta2 by half-life at every small batch, against AdamW with fixed betas at 512; nothing of the small end diverged.
    means = [mean(final[half][f"batch {b}"]) for b in SMALL_BATCHES]
    assert all(final[half][f"batch {b}"].endswith("n=3)") for b in SMALL_BATCHES)
    assert {largest[half, b]["against"] for b in SMALL_BATCHES} == {"adamw, batch 512"}
    cells = [largest[half, b][delta] for b in SMALL_BATCHES]
    assert all(excludes_zero(cell) and interval(cell)[1] < 0 for cell in cells)
    small_end = [r for r in grid if r["batch"] in SMALL_BATCHES and r["point"] not in ("adamw", "merit", "muon")]
    assert small_end and all(r["seeds finished"].split(" of ")[0] == r["seeds finished"].split(" of ")[1]
                             for r in small_end)
    says(stable, f"{', '.join(means[:4])} and {means[4]} at batches 1, 2, 4, 8 and 32",
         f"at batch 512 ({mean(final['adamw']['batch 512'])}) by {cells[0]} at batch 1 and {cells[4]} at 32",
         "every interval excluding 0")
    # 2. half-life against fixed betas where both ran.
    assert not any(excludes_zero(same[half, b][vs_fixed]) for b in ("8", "32"))
    says(half_life, f"{same[half, '8'][vs_fixed]} at batch 8 and {same[half, '32'][vs_fixed]} at 32")
    # 3. Adafactor and SGD against AdamW (beta2 by half-life) at the same batch.
    adafactor, sgd = ([same[point, b][vs_half] for b in SMALL_BATCHES] for point in ("adafactor", "sgd"))
    assert not any(map(excludes_zero, adafactor)) and all(interval(c)[0] > 0 for c in sgd)
    assert min(sgd, key=lambda c: float(mean(c))) == sgd[0]
    says(rivals, f"Adafactor {', '.join(adafactor[:4])} and {adafactor[4]} at batches 1 to 32, every interval including 0",
         f"SGD {', '.join(sgd[:4])} and {sgd[4]}, every interval excluding 0, its gap smallest at batch 1")
    # 4. MERIT and Muon (beta2 by half-life) at the small end.
    merit_cells = [same["merit (beta2 by half-life)", b][vs_half] for b in ("1", "4")]
    muon_cell = same["muon (beta2 by half-life)", "4"][vs_half]
    assert all(interval(c)[0] > 0 for c in merit_cells) and interval(muon_cell)[1] < 0
    says(merit, f"{merit_cells[0]} at batch 1 and {merit_cells[1]} at 4", f"{muon_cell} at 4")
    # 5. The range of good lrs: batch 1's width is no optimizer's widest.
    width = "width, interpolated in log lr"
    for point, name in ((half, "AdamW"), ("adafactor", "Adafactor"), ("sgd", "SGD")):
        widths = [good[point, b][width] for b in SMALL_BATCHES]
        assert any(float(w.removeprefix("≥ ")) > float(widths[0]) for w in widths[1:])
        says(robust, f"{name}, {widths[0]} at batch 1 against " if name == "AdamW" else f"{name} {widths[0]} against ",
             f"{widths[0]} {'at batch 1 ' if name == 'AdamW' else ''}against {', '.join(widths[1:4])} and {widths[4]}")
    # 6. Accumulation: the study's wall time and losses, and bench_batch's table (docs/performance.md).
    seconds = "seconds per million tokens (median)"
    ratio = float(wall[half, "1"][seconds]) / float(wall[half, "32"][seconds])
    table = parse_table(first_table((ROOT / "docs" / "performance.md").read_text(), "### Small batches"))
    assert list(table[0])[:4] == ["batch = micro-batch x accumulation", "AdamW us/token", "tokens/s", "vs 64"]
    adamw_vs_64 = {row["batch = micro-batch x accumulation"]: row["vs 64"] for row in table}
    says(accumulation, f"costs {ratio:.1f}x a batch-32 one", f"{wall[half, '1'][seconds]} s per million tokens at batch 1 "
                       f"against {wall[half, '32'][seconds]} at 32", f"ends at {means[4]} at batch 32 against {means[0]}",
         f"cost {adamw_vs_64['64 = 1 x 64']} a batch-64 token against {adamw_vs_64['1 = 1 x 1']} for 64 steps")
    says(index_line("The batch axis"), f"by {cells[0]} at batch 1")


def test_the_benchmark_findings():
    def against(reference):
        return {(r["point"], r["batch"]): r[f"Δ vs {reference}, same batch, paired by seed [95%]"]
                for r in rows(BENCHMARK, f"## Against {reference}")}
    vs_adamw, vs_merit, vs_muon = against("adamw"), against("merit"), against("muon")
    final = {r["point"]: r for r in rows(BENCHMARK, "## Final heldout/loss")}
    dmuon, soap, mars, schedulefree, ademamix = findings("benchmark.md")

    near = [mean(vs_muon["dmuon", b]) for b in BATCHES]
    assert [b for b in BATCHES if excludes_zero(vs_muon["dmuon", b])] == ["32"]
    says(dmuon, f"within {max(abs(float(d)) for d in near):.3f} of it", f"({', '.join(near[:3])} and\n{near[3]}"
         .replace("\n", " "), f"batch 32's {vs_muon['dmuon', '32']} the one interval excluding 0")
    ahead = [vs_merit[point, b] for point in ("dmuon", "muon") for b in BATCHES]
    assert all(excludes_zero(cell) and float(mean(cell)) < 0 for cell in ahead)
    says(dmuon, "ahead of MERIT by {} to {} at every batch, every interval excluding 0".format(
        *(f"{abs(float(d)):.3f}" for d in extremes([mean(cell) for cell in ahead])[::-1])))
    says(soap, f"{vs_muon['soap', '8']} and {vs_muon['soap', '32']} against it there",
         f"{vs_muon['soap', '128']} and {vs_muon['soap', '512']} at 128 and 512",
         f"against MERIT {vs_merit['soap', '8']} and {vs_merit['soap', '32']} at 8 and 32",
         f"{vs_merit['soap', '128']} at 128 and {vs_merit['soap', '512']} at 512")
    assert all(abs(float(mean(vs_muon["soap", b]))) < 0.03 for b in ("8", "32"))
    says(mars, f"{vs_adamw['mars', '8']} and {vs_adamw['mars', '512']}", f"ahead of MERIT at 8, {vs_merit['mars', '8']}",
         f"behind it at 128, {vs_merit['mars', '128']}")
    named = {("adamw", "8"), ("adamw", "512"), ("merit", "8"), ("merit", "128")}
    for reference, table in (("adamw", vs_adamw), ("merit", vs_merit)):
        for b in BATCHES:
            assert excludes_zero(table["mars", b]) == ((reference, b) in named), (reference, b)
            assert excludes_zero(table["adamw_schedulefree", b]) == (b == "8"), (reference, b)
    says(schedulefree, f"{vs_adamw['adamw_schedulefree', '8']} and {vs_merit['adamw_schedulefree', '8']}")
    highest = [mean(final["ademamix"][f"batch {b}"]) for b in BATCHES[1:]]
    for b, value in zip(BATCHES[1:], highest):
        assert value == max((mean(r[f"batch {b}"]) for r in final.values()), key=float), b
    assert all(excludes_zero(cell) for cell in (vs_merit["ademamix", "32"], vs_merit["ademamix", "128"],
                                                vs_adamw["ademamix", "32"]))
    says(ademamix, f"{highest[0]}, {highest[1]} and {highest[2]}",
         f"behind MERIT by {vs_merit['ademamix', '32']} and {vs_merit['ademamix', '128']} at 32 and 128",
         f"AdamW by {vs_adamw['ademamix', '32']} at 32")
    # The logits paragraph, from the report's per-layer table at the selected lrs.
    layers = {(r["point"], r["batch"]): r for r in rows(BENCHMARK, "## Max attention logit per layer")
              if r["lr"].endswith("(selected)")}
    peaks = {key: [r[f"layer_0{i}"].split(" / ")[0] for i in range(4)] for key, r in layers.items()}
    at_8 = max(((p, point, i) for (point, b), values in peaks.items() if b == "8" for i, p in enumerate(values)),
               key=lambda x: float(x[0]))
    assert at_8[1:] == ("ademamix", 3)
    last = {point: peaks[point, "8"][3] for point in ("ademamix", "adamw_schedulefree", "mars", "merit", "adamw")}
    assert all(float(p) < 6 for (point, b), values in peaks.items() if b == "512" and point != "soap" for p in values)
    says(flat((RESULTS / "benchmark.md").read_text()),
         f"AdEMAMix {last['ademamix']}, Schedule-Free {last['adamw_schedulefree']}, MARS {last['mars']}, "
         f"MERIT {last['merit']}, AdamW {last['adamw']}", f"SOAP's first layer peaks at {peaks['soap', '512'][0]}")
    within = {(point, b) for (point, b), cell in vs_muon.items() if abs(float(mean(cell))) <= 0.032}
    assert within == {("dmuon", b) for b in BATCHES} | {("soap", "8"), ("soap", "32")}
    says(index_line("The 2025 benchmark's optimizers"),
         "Only D-Muon at every batch and SOAP at batches 8 and 32 come within 0.032 of Muon")


def test_the_critical_batch_findings():
    optimizers = ("adamw", "lamb", "merit", "muon")
    cbs = {opt: {r["step"]: r for r in rows(CBS, f"## Critical batch size by branching: {opt}, batch 8, s0")}
           for opt in optimizers}
    steps = ["64", "256", "512", "1024", "1536"]
    cells = [cbs[opt][s] for opt in optimizers for s in steps]

    def by_k(row):
        return {k: (d, hw) for k, d, hw in re.findall(r"([\d.]+): ([-+][\d.]+) ±([\d.]+)", row["L_k - L_1 by k"])}
    paper, interval_rule, no_ramp, merit, simple = findings("critical_batch.md")
    # The paper's rule: B* 2 to 8 everywhere; the 2x batch behind the 1x on the mean, by more than epsilon but at one.
    assert {r["B*"] for r in cells} <= {"2", "4", "8"} and {r["k* (eps 0.01)"] for r in cells} <= {"0.25", "0.5", "1"}
    doubled = {(opt, s): by_k(cbs[opt][s])["2"] for opt in optimizers for s in steps}
    assert all(float(d) > 0 for d, _ in doubled.values())
    within = [(opt, s, d) for (opt, s), (d, _) in doubled.items() if float(d) <= 0.01]
    assert within == [("lamb", "64", "+0.0096")]
    says(paper, "B* is 2 to 8 sequences at every checkpoint, for all four optimizers", "(k* = 0.25 to 1)",
         "by {} to {}, more than epsilon = 0.01 everywhere but LAMB's step 64 (+0.0096)".format(
             *extremes([d for d, _ in doubled.values()])))
    # Over k >= 1: the parent's batch but at LAMB's step 64; the interval rule's span and the 2x half-widths.
    assert [(opt, s) for opt in optimizers for s in steps if cbs[opt][s]["B* over k >= 1"] != "8"] == [("lamb", "64")]
    assert cbs["lamb"]["64"]["B* over k >= 1"] == "16"
    says(interval_rule, "B* is the parent's batch, 8, at every checkpoint but LAMB's step 64 (16)",
         "the interval rule gives {} to {}".format(*extremes([r["B* (interval)"] for r in cells])),
         "half-widths are ±{} to ±{}".format(*extremes([hw for _, hw in doubled.values()])))
    # The ramp: the paper's B* never at twice the batch (16) for the ramped optimizers, so no ramp and no control.
    series = {opt: ", ".join(cbs[opt][s]["B*"] for s in steps) for opt in optimizers}
    assert all(int(cbs[opt][s]["B*"]) < 16 for opt in ("adamw", "merit") for s in steps)
    says(no_ramp, f"({series['adamw']} and {series['merit']})")
    report_sections = report_of(CBS, "val/loss", "heldout/loss")
    assert "## Batch ramps" not in report_sections and "ramp" not in {r["point"] for r in rows(CBS, "## Final heldout/loss")}
    # MERIT against AdamW, by both rules.
    for column, rule in (("B*", "at the five checkpoints by the paper's rule"), ("B* (interval)", "by the interval rule")):
        ours, adamw = ([cbs[opt][s][column] for s in steps] for opt in ("merit", "adamw"))
        says(merit, f"{', '.join(ours)} against {', '.join(adamw)} {rule}")
    above = [s for s in steps if int(cbs["merit"][s]["B*"]) > int(cbs["adamw"][s]["B*"])]
    assert above == ["64"] and "(above at step 64 only)" in merit
    # B_simple within the two rules' span.
    low, high = extremes([r["B*"] for r in cells] + [r["B* (interval)"] for r in cells])
    adam_like = [cbs[opt][s]["B_simple (sequences)"] for opt in optimizers[:3] for s in steps[1:]]
    muon = [cbs["muon"][s]["B_simple (sequences)"] for s in steps[1:]]
    assert all(float(low) <= float(v) <= float(high) for v in adam_like + muon)
    says(simple, "{} to {} sequences for AdamW, LAMB and MERIT".format(*extremes(adam_like)),
         "{} to {} for Muon".format(*extremes(muon)), f"the two rules' B*, {low} to {high}")
    mini = {r["point"]: mean(r["batch 8"]) for r in rows(MINI, "## Final heldout/loss")}
    parents = {r["point"]: mean(r["batch 8"]) for r in rows(CBS, "## Final heldout/loss")}
    assert [parents["adamw"], parents["merit"]] == [mini["adamw"], mini["merit"]]
    says(flat((RESULTS / "critical_batch.md").read_text()), f"{mini['adamw']} (AdamW) and {mini['merit']} (MERIT) in both")
    says(index_line("The critical batch"), "B* is {} to {} sequences at every checkpoint for all four".format(
        *extremes([r["B*"] for r in cells])), "the interval rule gives {} to {}".format(
        *extremes([r["B* (interval)"] for r in cells])))


def test_the_cures_findings():
    page = (RESULTS / "cures.md").read_text()
    grid = {(r["point"], r["lr"]): r["final val/loss"] for r in rows(CURES, "## Every lr of the grid")}
    logits = {(r["point"], r["lr"].removesuffix(" (selected)")): r
              for r in rows(CURES, "## Logits raw and soft-capped, and log Z")}
    selected = {r["point"]: selected_lr(r["batch 64"]) for r in rows(CURES, "## Final heldout/loss")}
    triple = {}
    for point, lr in selected.items():
        [triple[point]] = [other for p, other in grid if p == point and abs(float(other) / float(lr) - 3) < 0.06]
    llama, cures, keep, merit, ranking = findings("cures.md")

    small = parse_table(first_table(page, "`configs/llama_cpu.py`"))
    best = min(small, key=lambda r: float(r["final val/loss"]))
    gpt = next(r for r in rows(DEMO, "## Every lr of the grid") if r["point"] == "merit" and r["lr"] == best["lr"])
    gap = float(gpt["final val/loss"]) - float(best["final val/loss"])
    says(llama, f"{gap:.3f} below the GPT block", f"val loss {best['final val/loss']} against {gpt['final val/loss']}")
    assert best["lr"] == "0.0067"
    over = next(r for r in small if r["lr"] == "0.02")
    says(flat(page), f"runs to {over['peak max logit (largest layer and seed)']}",
         f"the loss {float(over['final val/loss']) - float(best['final val/loss']):.3f} worse")

    def cell(point, column, at_best=True, final=False):
        value = logits[point, selected[point] if at_best else triple[point]][column]
        return value.split(" / ")[1 if final else 0]
    attention = "max attention logit"

    def both(point, column=attention):
        return f"{cell(point, column)} / {cell(point, column, False)}"
    clip = "adamw + qk_clip 15"
    assert cell(clip, attention, final=True) == cell(clip, attention, False, final=True)
    says(cures, f"{both('adamw + qk_norm')} with QK-Norm",
         f"{both(clip)} with QK-Clip (ending at {cell(clip, attention, final=True)} at both)",
         f"{both('adamw + softcap 15/10', 'capped')} after the soft-cap over a raw {both('adamw + softcap 15/10')}",
         f"{both('adamw + z_loss 0.0001')} with z-loss and {both('adamw')} for AdamW",
         f"from {cell('adamw + softcap 15/10', 'largest output logit (absolute)')} to "
         f"{cell('adamw + softcap 15/10', 'capped 2')}",
         f"final log Z is {cell('adamw + z_loss 0.0001', 'final log Z')} against AdamW's {cell('adamw', 'final log Z')}")

    def lost(point):
        return f"{float(grid[point, triple[point]]) - float(grid[point, selected[point]]):.3f}"
    says(keep, f"{lost('adamw + qk_norm')} and {lost(clip)} above their best ({grid['adamw + qk_norm', triple['adamw + qk_norm']]}"
               f" against {grid['adamw + qk_norm', selected['adamw + qk_norm']]}, {grid[clip, triple[clip]]} against "
               f"{grid[clip, selected[clip]]})",
         f"AdamW loses {lost('adamw')}, z-loss {lost('adamw + z_loss 0.0001')}, the soft-cap "
         f"{lost('adamw + softcap 15/10')} and MERIT {lost('merit')}")
    others = [lost(p) for p in ("adamw", "adamw + z_loss 0.0001", "adamw + softcap 15/10", "merit")]
    assert max(float(lost("adamw + qk_norm")), float(lost(clip))) < float(min(others, key=float))
    peaks = {point: cell(point, attention) for point in selected}
    assert max(peaks.values(), key=float) == peaks["merit"]
    output = "largest output logit (absolute)"
    assert float(cell("merit", output)) >= float(cell("adamw", output)) and float(peaks["merit"]) >= float(peaks["adamw"])
    says(merit, f"peak at {peaks['merit']} and {cell('merit', output)} against AdamW's {peaks['adamw']} and "
                f"{cell('adamw', output)}, {peaks['merit']} the largest of any run at its best lr",
         f"its attention logit runs to {cell('merit', attention, False)}")
    against = {r["point"]: mean(r["Δ vs adamw, same batch, paired by seed [95%]"]) for r in rows(CURES, "## Against adamw")}
    std = spread(next(r for r in rows(MINI, "## Final heldout/loss") if r["point"] == "adamw")["batch 128"], "± ")
    assert max(abs(float(d)) for d in against.values()) <= std
    says(ranking, f"QK-Norm {against['adamw + qk_norm']}, QK-Clip {against[clip]}, the soft-cap "
                  f"{against['adamw + softcap 15/10']}, z-loss {against['adamw + z_loss 0.0001']}, MERIT {against['merit']}",
         f"none larger than {std:.3f}")
    says(index_line("The logit cures"), f"within {max(float(lost('adamw + qk_norm')), float(lost(clip))):.3f} of their "
                                        "best, the other four points' {} to {} above".format(*extremes(others)))


def test_the_local_steps_findings():
    """docs/results/local_steps.md's tables are scripts/replica_study.py's report's (its committed
    report.md, which tests/test_replicas.py regenerates from the archive), and its findings' numbers
    are their cells."""
    report_text, page = REPLICA_REPORT.read_text(), (RESULTS / "local_steps.md").read_text()
    tables = {}
    for optimizer in ("adamw", "merit"):
        table = first_table(report_text, f"## {optimizer}")
        assert table == first_table(page, f"## {optimizer}"), optimizer
        tables[optimizer] = {row["method"]: row for row in parse_table(table)}
    local, diloco, large, merit = findings("local_steps.md")

    def versus(optimizer, method, whole=True):
        cell = tables[optimizer][method]["vs dp_b32"]
        return cell if whole else cell.split()[0]

    def includes_zero(cell):
        center, half = re.fullmatch(r"([-+][\d.]+) \[±([\d.]+)\]", cell).groups()
        return abs(float(center)) <= float(half)

    says(local, *(versus(o, m) for m in ("localsgd_h10", "localsgd_h50") for o in ("adamw", "merit")))
    assert all(includes_zero(versus("adamw", m)) for m in ("localsgd_h10", "localsgd_h50"))
    assert not any(includes_zero(versus("merit", m)) for m in ("localsgd_h10", "localsgd_h50"))
    lowest = {o: min(tables[o], key=lambda m: float(tables[o][m]["heldout/loss"].split()[0])) for o in tables}
    assert lowest == {"adamw": "dp_b32", "merit": "dp_b32"}
    says(diloco, *(versus(o, m) for o in ("adamw", "merit") for m in ("diloco_h10", "diloco_h50")))
    # The local methods against the large batch at the same all-reduces: 50 (H = 10, 10 x B), 10 (H = 50, 50 x B).
    for h, batch in (("10", "320"), ("50", "1600")):
        for o in tables:
            assert tables[o][f"dp_b{batch}"]["all-reduces"] == tables[o][f"localsgd_h{h}"]["all-reduces"]
            says(large, versus(o, f"dp_b{batch}"), versus(o, f"localsgd_h{h}", whole=False))
            assert "(edge)" not in tables[o][f"dp_b{batch}"]["lr (grid)"]
    # MERIT against AdamW at each local point: the means' differences, the intervals overlapping.
    for method in ("localsgd_h10", "localsgd_h50", "diloco_h10", "diloco_h50"):
        cells = [re.fullmatch(r"([\d.]+) \[±([\d.]+)\]", tables[o][method]["heldout/loss"]).groups()
                 for o in ("adamw", "merit")]
        (a, a_half), (m, m_half) = [(float(c), float(h)) for c, h in cells]
        assert abs(m - a) <= a_half + m_half, method
        says(merit, f"{abs(m - a):.4f} {'below' if m < a else 'above'}")
    line = index_line("Local steps against the large batch")
    local_cells = [versus(o, m, False) for o in tables for m in ("localsgd_h10", "localsgd_h50")]
    diloco_cells = [versus(o, m, False) for o in tables for m in ("diloco_h10", "diloco_h50")]
    large_cells = [versus(o, m, False) for o in tables for m in ("dp_b320", "dp_b1600")]
    says(line, "LocalSGD ends {} to {}".format(*extremes(local_cells)), "DiLoCo {} to {}".format(
        *extremes(diloco_cells)), "the large batches with as many all-reduces {} to {}".format(*extremes(large_cells)))
