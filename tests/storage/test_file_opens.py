"""Every file hpcckpt opens goes through hpcckpt.storage.opening, the one opener that never blocks on a FIFO,
refuses non-regular files and never creates through a planted link.

The scan below lists every call in the package that opens a file by name
(builtin ``open``, ``os.open``, ``io.open``, ``os.fdopen``, ``tempfile``'s
makers, ``shutil``'s copies, ``os.truncate``, numpy's ``fromfile``/``memmap``,
``pathlib``'s read/write helpers): a new one outside the opener fails this test
until it is routed through it or listed in ALLOWED with the reason it is safe.
Then the two opens that hung a whole job before are driven with real FIFOs.
"""

from __future__ import annotations

import ast
import os
import pathlib
import threading

import numpy as np

import hpcckpt
from hpcckpt import Block
from hpcckpt.mpi.collective import SerialComm

PACKAGE = pathlib.Path(hpcckpt.__file__).parent
OPENER = "storage/opening.py"
#: (module, call) pairs that open a file outside the opener, and why that is safe.
ALLOWED = {
    ("cli/__init__.py", "open"): "os.devnull as stdout for --quiet: a fixed device the user asked to write to",
}
_BY_NAME = {"open"}
_BY_ATTRIBUTE = {("os", "open"), ("io", "open"), ("os", "fdopen"), ("os", "truncate"), ("tempfile", "mkstemp"),
                 ("tempfile", "NamedTemporaryFile"), ("tempfile", "TemporaryFile"), ("shutil", "copyfile"),
                 ("shutil", "copy"), ("shutil", "copy2"), ("np", "fromfile"), ("np", "memmap"),
                 ("numpy", "fromfile"), ("numpy", "memmap")}
_PATH_METHODS = {"read_bytes", "read_text", "write_bytes", "write_text"}


def file_opens(source: str) -> list[tuple[str, int]]:
    """``(call, line)`` of every call in ``source`` that opens a file by name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in _BY_NAME:
            found.append((f.id, node.lineno))
        elif isinstance(f, ast.Attribute):
            if isinstance(f.value, ast.Name) and (f.value.id, f.attr) in _BY_ATTRIBUTE:
                found.append((f"{f.value.id}.{f.attr}", node.lineno))
            elif f.attr in _PATH_METHODS:
                found.append((f.attr, node.lineno))
    return found


def test_the_scan_finds_each_kind_of_open():
    src = ("open('a')\nos.open('a', 0)\nio.open('a')\nos.fdopen(3)\ntempfile.mkstemp()\nshutil.copyfile('a','b')\n"
           "np.fromfile('a')\np.read_bytes()\nos.truncate('a', 0)\nf.open('not a module')\n")
    assert [c for c, _ in file_opens(src)] == ["open", "os.open", "io.open", "os.fdopen", "tempfile.mkstemp",
                                               "shutil.copyfile", "np.fromfile", "read_bytes", "os.truncate"]


def test_every_file_open_of_the_package_goes_through_the_opener():
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == OPENER:
            continue
        for call, line in file_opens(path.read_text(encoding="utf-8")):
            if (module, call) not in ALLOWED:
                stray.append(f"hpcckpt/{module}:{line}: {call}(...)")
    assert stray == [], "open these through hpcckpt.storage.opening (or add them to ALLOWED with why):\n" + \
        "\n".join(stray)


def test_the_opener_itself_opens_with_the_safe_flags():
    source = (PACKAGE / OPENER).read_text(encoding="utf-8")
    assert "O_NONBLOCK" in source and "O_NOFOLLOW" in source and "O_EXCL" in source


# --------------------------------------------------------------------------- FIFOs that must not hang

def finishes(fn, seconds=20.0):
    """Run ``fn`` in a thread; its result, or a failure if it is still blocked after ``seconds``."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} blocked (a FIFO opened without O_NONBLOCK?)"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_halt_file_that_is_a_fifo_is_a_request_and_does_not_block(tmp_path):
    root = str(tmp_path / "ck")
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), handle_signals=False)
    os.mkfifo(os.path.join(root, ".hpcckpt-halt"))
    reason = finishes(lambda: ck.maybe_save({"u": Block(np.zeros(3))}, 1))
    assert reason is not None and ck.should_exit()
    ck.close()


def test_a_pmem_image_that_is_a_fifo_holds_nothing_and_does_not_block(tmp_path):
    from hpcckpt.levels.pmem import PmemImage

    path = str(tmp_path / "image")
    os.mkfifo(path)
    image = PmemImage(path, rank=0, nranks=1)
    assert finishes(image.headers) == [None, None]
    assert finishes(lambda: image.holding("step-000000000001")) is None
    finishes(lambda: image.update(np.arange(10, dtype=np.uint8), "step-000000000001", fsync=False))
    assert image.holding("step-000000000001") is not None  # the FIFO was replaced by a real image
