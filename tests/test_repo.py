"""The README's promises (two commands first, CI runs the second one) and the layout's rules:
nothing edits sys.path, optim/ reads no environment variable at import, scripts and tests
import packages, not each other."""

import ast
import re

import pytest

from helpers import ROOT

SOURCES = [p for p in ROOT.rglob("*.py") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert text.index("```bash") < text.index("\n## "), "the commands must come before any section"
    return block.strip().splitlines()


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second():
    run_default, run_tests = readme_commands()
    assert "train.py configs/default.py" in run_default and "-m data.prepare shakespeare" in run_default
    assert "pytest" in run_tests
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert run_tests in ci_lines


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def test_nothing_edits_sys_path():
    assert len(SOURCES) > 50
    offenders = [str(p.relative_to(ROOT)) for p in SOURCES
                 if any(isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                        and node.value.id == "sys" for node in ast.walk(ast.parse(p.read_text())))]
    assert offenders == []


def test_optim_reads_no_environment_variable_at_import():
    for path in (ROOT / "optim").rglob("*.py"):
        tree = ast.parse(path.read_text())
        # Module-level code: everything outside function bodies (class bodies run at import too).
        pending, at_import = list(tree.body), []
        while pending:
            node = pending.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            at_import.append(node)
            pending.extend(ast.iter_child_nodes(node))
        reads = [node.lineno for node in at_import if isinstance(node, ast.Attribute)
                 and node.attr in ("environ", "getenv") and isinstance(node.value, ast.Name) and node.value.id == "os"]
        assert reads == [], f"{path.relative_to(ROOT)} reads the environment at import (lines {reads})"


def test_scripts_and_tests_import_packages_not_each_other():
    for path in (ROOT / "scripts").glob("*.py"):
        imported = _imports(ast.parse(path.read_text()))
        assert not {name for name in imported if name.split(".")[0] in ("tests", "conftest", "helpers")}, path
    for path in (ROOT / "tests").glob("*.py"):
        imported = _imports(ast.parse(path.read_text()))
        assert not {name for name in imported if name.split(".")[0] == "scripts"}, path


@pytest.mark.docs
def test_the_readme_is_a_first_page_that_reaches_every_doc():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 15_000
    linked = set(re.findall(r"\]\(((?:docs|tests)/[\w/.-]+\.md)", text))
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")} | {"tests/README.md"}
    assert linked == pages  # every page is linked by name, and every link has its page
    for page in pages:  # and their relative links resolve
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", (ROOT / page).read_text()):
            assert ((ROOT / page).parent / target).exists(), (page, target)


def test_the_architecture_page_names_every_module():
    """docs/architecture.md's "Who does what" says what each module of the packages and scripts is for:
    a module added without its line there is caught here (the optimizers' row once listed 6 of 11)."""
    table = (ROOT / "docs" / "architecture.md").read_text().split("## Who does what", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"([\w]+\.py)", table))
    modules = {p.name for folder in ("optim", "optim/backends", "training", "study", "data", "eval", "scripts")
               for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py" or folder == "optim"}
    assert sorted(modules - named) == []
