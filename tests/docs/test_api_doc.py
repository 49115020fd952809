"""docs/api.md names every public name and every keyword: a keyword added to the code without
its line in the reference fails here."""

from __future__ import annotations

import dataclasses
import inspect
import os

import hpcckpt
from hpcckpt.levels import keyword_names
from hpcckpt.saving.asynchronous import ENGINE_OPTIONS
from hpcckpt.options import SaveOptions, SaveResult
from testpaths import REPO

DOC = os.path.join(REPO, "docs", "api.md")


def _documented() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def _keywords(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"]


def test_every_public_name_is_documented():
    doc = _documented()
    missing = [n for n in hpcckpt.__all__ if n != "__version__" and not any(
        form in doc for form in (f"`{n}", f"{n}(", f"`hpcckpt.{n}"))]
    assert not missing, f"docs/api.md lacks {missing}"


def test_every_keyword_of_save_load_open_and_checkpointer_is_documented():
    doc = _documented()
    names = set()
    for fn in (hpcckpt.save, hpcckpt.load, hpcckpt.open, hpcckpt.Checkpointer.__init__, hpcckpt.Block.__init__,
               hpcckpt.Ragged.__init__, hpcckpt.Checkpointer.save, hpcckpt.Checkpointer.restore):
        names.update(_keywords(fn))
    names.update(f.name for f in dataclasses.fields(SaveOptions))
    names.update(ENGINE_OPTIONS + keyword_names())
    missing = sorted(n for n in names if f"`{n}`" not in doc and f"{n}=" not in doc and f"`{n}(" not in doc)
    assert not missing, f"docs/api.md lacks the keywords {missing}"


def test_every_public_method_and_result_field_is_documented():
    doc = _documented()
    methods = [n for n, v in vars(hpcckpt.Checkpointer).items() if not n.startswith("_")]
    fields = [f.name for f in dataclasses.fields(SaveResult)]
    missing = sorted(n for n in methods + fields if f"`{n}" not in doc)
    assert not missing, f"docs/api.md lacks {missing}"


ARCHITECTURE = os.path.join(os.path.dirname(DOC), "architecture.md")


def _drawn_modules() -> set[str]:
    """The modules the package tree of docs/architecture.md draws, as paths under hpcckpt/."""
    with open(ARCHITECTURE, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = lines.index("hpcckpt/")
    drawn, wing = set(), None
    for line in lines[start + 1:]:
        if line.startswith("```"):
            break
        name = line.split()[0]
        indent = len(line) - len(line.lstrip())
        if indent == 2 and name.endswith("/"):
            wing = name
        elif indent == 2:
            drawn.add(name)
        elif indent == 4:
            drawn.add(wing + name)
    return drawn


def test_the_architecture_page_draws_every_module():
    package = os.path.dirname(os.path.abspath(hpcckpt.__file__))
    actual = {os.path.relpath(os.path.join(d, f), package).replace(os.sep, "/")
              for d, _, files in os.walk(package) for f in files if f.endswith(".py")}
    drawn = _drawn_modules()
    assert not actual - drawn, f"docs/architecture.md lacks {sorted(actual - drawn)}"
    assert not drawn - actual, f"docs/architecture.md draws modules that do not exist: {sorted(drawn - actual)}"
