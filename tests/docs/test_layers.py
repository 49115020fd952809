"""The package's layering: the import-linter contract in .importlinter, no import cycles, no private names
imported from another module.

Layers, lowest first: pure core (errors, names, regions, encoding, ...), codecs, the metadata format,
collectives, storage, catalog, transports/reader/commit, options and the save stages, save/load, levels,
the asynchronous engine, checkpointer/api, cli.  A cycle or a reach into another module's private names
is what made the three save pipelines impossible to combine.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

import pytest
from testpaths import REPO

grimp = pytest.importorskip("grimp")
ROOT = REPO


def test_the_layers_contract_holds():
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e .[test])")
    proc = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (the import cycles), iteratively (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_strongly_connected_finds_cycles():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = grimp.build_graph("hpcckpt")
    modules = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert strongly_connected(modules) == []


def private_imports(path: str) -> list[str]:
    """``from <hpcckpt module> import _name`` lines of one file (relative imports count as hpcckpt's)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("hpcckpt")):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {alias.name}")
    return out


def test_no_private_name_is_imported_from_another_module():
    found = []
    for top in ("hpcckpt", "tests", "bench", "apps"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            found += [line for name in files if name.endswith(".py")
                      for line in private_imports(os.path.join(dirpath, name))]
    assert found == []


def test_the_top_level_holds_only_the_public_face():
    top = sorted(n for n in os.listdir(os.path.join(ROOT, "hpcckpt")) if n.endswith(".py"))
    assert top == ["__init__.py", "__main__.py", "api.py", "checkpointer.py", "errors.py", "options.py", "state.py",
                   "stateful.py"]


def test_the_flat_layouts_module_names_still_import_the_moved_modules():
    import importlib

    import hpcckpt

    for old, new in hpcckpt._MOVED.items():
        assert importlib.import_module(f"hpcckpt.{old}") is importlib.import_module(f"hpcckpt.{new}")


def test_python_m_hpcckpt_slurm_runs():
    proc = subprocess.run([sys.executable, "-m", "hpcckpt.slurm", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0 and '"job_id"' in proc.stdout, proc.stderr
