"""The layers: imports between the project's own modules go one way. The graph is read from the
sources with ast, not by importing them, and counts every import, a lazy one inside a function
too: it runs whenever that function does, so it is a dependency as much as one at the top."""

import ast
import functools
import os
from pathlib import Path

from helpers import ROOT


def imported(tree: ast.Module, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``module`` (its syntax tree) imports anywhere. An import
    counts as the most specific module it names (``from optim import sharding``: optim.sharding;
    ``from optim.base import Optimizer``: optim.base), not the packages above it."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: one package up per dot after the first
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """{module: the project modules it imports} over every .py under the repository root but
    tests/ and hidden folders (.venv)."""
    files = {}  # module -> (path, whether it is a package's __init__)
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [s for s in subfolders
                         if not s.startswith(".") and os.path.join(folder, s) != str(ROOT / "tests")]
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                is_package = parts[-1] == "__init__"
                files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    modules = set(files)
    return {module: imported(ast.parse(Path(path).read_text(), path), module, is_package, modules)
            for module, (path, is_package) in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as [a, b, ..., a] (a imports b, ..., which imports a), or None."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        path.append(node)
        for successor in sorted(graph[node]):
            if cycle := visit(successor):
                return cycle
        path.pop()
        done.add(node)
        return None

    return next(filter(None, map(visit, sorted(graph))), None)


def importers(graph: dict[str, set[str]], layer: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """{module of package ``layer``: the modules of the packages ``forbidden`` that it imports}, where any."""
    def within(name, packages):
        return any(name == p or name.startswith(p + ".") for p in packages)

    return {module: sorted(t for t in targets if within(t, forbidden))
            for module, targets in sorted(graph.items())
            if within(module, (layer,)) and any(within(t, forbidden) for t in targets)}


def test_the_graph_counts_lazy_relative_and_submodule_imports_of_the_project_only():
    source = ("import os, torch.nn\n"
              "from . import sharding\n"
              "from ..backends import reference\n"
              "from optim.base import Optimizer\n"
              "def later():\n"
              "    import training.checkpoint\n")
    modules = {"optim", "optim.backends", "optim.backends.reference", "optim.backends.triton", "optim.base",
               "optim.backends.sharding", "training.checkpoint"}
    assert imported(ast.parse(source), "optim.backends.triton", False, modules) == {
        "optim.backends.sharding", "optim.backends.reference", "optim.base", "training.checkpoint"}
    graph = import_graph()
    assert {"train", "model", "training.checkpoint", "optim.backends.cpp", "eval.tasks"} <= graph.keys()
    assert "training.checkpoint.sharded" in graph["training.checkpoint.writers"]  # (imported inside a method)
    assert not any(module.split(".")[0] == "tests" for module in graph)


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_modules_import_each_other_without_a_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"an import cycle: {' -> '.join(cycle)}"


def test_training_does_not_import_the_evaluator():
    # The evaluator sits above the training library: train.py, the top level, imports both.
    assert importers(import_graph(), "training", ("eval",)) == {}


def test_optim_imports_neither_training_nor_the_evaluator():
    # The optimizers are a library of their own: the training loop uses them, never the reverse.
    assert importers(import_graph(), "optim", ("training", "eval")) == {}


def test_no_library_imports_the_top_layer():
    # train.py and scripts/ sit on top: a library that needs train.main (study/cbs.py trains branches in
    # its process) is handed it by the script that calls it.
    for layer in ("atomic", "configs", "model", "data", "optim", "training", "eval", "hf", "study"):
        assert importers(import_graph(), layer, ("train", "scripts")) == {}, layer


def test_no_script_imports_another_script():
    # A script is a command line: what two of them share is a library module's (the benchmarks' timers and
    # synthetic trainer in study/bench.py, the mini study's setting in study/mini_study.py), not one script's
    # that the others import. (One script may still run another as a process of its own.)
    assert importers(import_graph(), "scripts", ("scripts",)) == {}


def test_importers_names_the_top_layer_by_module_not_by_prefix():
    graph = {"study.cbs": {"train", "training.checkpoint"}, "study.plot": {"scripts.cbs"}, "training.loop": set()}
    assert importers(graph, "study", ("train", "scripts")) == {"study.cbs": ["train"], "study.plot": ["scripts.cbs"]}
    assert importers(graph, "training", ("train",)) == {}  # (training is not train)
