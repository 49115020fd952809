"""The Python snippets of the README and the docs run as they are written.

* README.md's "Using it" snippet and docs/async.md's copy of its loop: run
  under ``mpiexec -n 2`` with a prelude that gives them the arrays they name
  (a 1-D decomposition, a ping-pong swap in the step), twice: a first run,
  then a restart that continues; they must save the steps they reach after
  the work of that step (never step 0 before any work) and restore the live
  buffers.
* docs/porting.md: every ```python block directly under a
  ``<!-- test: serial -->`` or ``<!-- test: mpi -->`` line runs as its own
  script (in a fresh directory; ``mpi``: under ``mpiexec -n 2``); its own
  asserts are the checks.  Every python block of porting.md must carry a
  marker.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from mpitools import run_mpi

from testpaths import REPO  # noqa: E402

ROOT = REPO
MARKED = re.compile(r"^<!-- test: (serial|mpi) -->\n```python\n(.*?)^```", re.S | re.M)


def read(relpath: str) -> str:
    with open(os.path.join(ROOT, relpath), encoding="utf-8") as f:
        return f.read()


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in re.finditer(r"^```python\n(.*?)^```", text,
                                                                                   re.S | re.M)]


def run_script(tmp_path, code: str, mode: str, *args) -> str:
    """Run ``code`` as a script in the directory ``tmp_path`` (``mpi``: under mpiexec -n 2); its stdout."""
    script = tmp_path / "snippet.py"
    script.write_text("import os, sys\nos.chdir(sys.argv[1])\nsys.argv[1:2] = []\n" + code, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    if mode == "mpi":
        return run_mpi(2, str(script), work, *args, timeout=180).stdout
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script), str(work), *map(str, args)], capture_output=True,
                          text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


# --------------------------------------------------------------------------- the README's loop

#: What the README snippet leaves to the application: a row decomposition of an 8 x 6 field, tracer rows,
#: and a step that writes the new level into the other buffer and swaps (the ping-pong of the README).
PRELUDE = '''
import numpy as np
from mpi4py import MPI

NY, NX = 8, 6
nsteps = int(sys.argv[1])
_rank = MPI.COMM_WORLD.Get_rank()
r0, c0 = 4 * _rank, 0
u = np.zeros((4, NX))
un = np.empty_like(u)
parts = np.array([(_rank, 10 * _rank + k) for k in range(3)], dtype=[("owner", "<i8"), ("id", "<i8")])


def advance():
    global u, un, t
    un[...] = u + 1.0       # the new time level, in the other buffer
    u, un = un, u           # the swap: a plain Block would still hold the old buffer
    t += 0.5
'''

CHECK = '''
import hpcckpt as _h

_ck = _h.Checkpointer("run/ckpt", comm=MPI.COMM_WORLD)
_line = f"STEPS {_ck.steps()} STEP {step} U {float(u.min())} {float(u.max())} T {t}"
_ck.close()
_lines = MPI.COMM_WORLD.gather(_line)
if _rank == 0:
    print(_lines[0] if len(set(_lines)) == 1 else f"STEPS differ between ranks: {_lines}", flush=True)
    with _h.open("run/ckpt") as _v:
        assert np.all(_v.read("u") == _v.values["step"]), "the checkpoint holds a stale buffer"
        assert _v.values["time"] == 0.5 * _v.values["step"]
        assert sorted(_v.read("particles")["id"].tolist()) == [0, 1, 2, 10, 11, 12]
'''


def loop_of(code: str) -> str:
    """The snippet with its ``...`` placeholder line doing one step of the prelude's application."""
    lines = [re.sub(r"^(\s*)\.\.\.(\s+#.*)?$", r"\1advance()", line) for line in code.splitlines()]
    assert sum("advance()" in line for line in lines) == 1, code
    return "\n".join(lines) + "\n"


def readme_snippet() -> str:
    text = read("README.md")
    section = text[text.index("## Using it"):]
    return python_blocks(section)[0][1]


def steps_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("STEPS"))


def test_the_readme_snippet_saves_after_the_work_and_restarts(tmp_path):
    script = PRELUDE + loop_of(readme_snippet()) + CHECK
    first = steps_line(run_script(tmp_path, script, "mpi", 100))
    assert first == "STEPS [50, 100] STEP 100 U 100.0 100.0 T 50.0", first  # no step 0, the live buffer saved
    again = steps_line(run_script(tmp_path, script, "mpi", 150))  # the same script later: continues from 100
    assert again == "STEPS [50, 100, 150] STEP 150 U 150.0 150.0 T 75.0", again


def async_snippet() -> str:
    code = python_blocks(read("docs/async.md"))[0][1]
    return code.replace('"/lustre/run/ckpt"', '"run/ckpt"').replace('"/dev/shm/run"', '"run/local"')


def test_the_async_snippet_saves_after_the_work_and_restarts(tmp_path):
    """docs/async.md's loop (the asynchronous, multi-level Checkpointer) with the README's state."""
    setup = textwrap.dedent('''
        import hpcckpt
        step, t = 0, 0.0

        def state():
            return {"u": hpcckpt.Block(u, offset=(r0, c0), global_shape=(NY, NX)),
                    "particles": hpcckpt.Ragged(parts), "step": step, "time": t}

        n = nsteps
        ''')
    code = async_snippet()
    assert "ck.register(state)" in code and "range(1, n + 1)" in code, code
    # the snippet's policy is the default (the first save after about 38 minutes): every 5 steps here
    code = code.replace("    keep=2)", "    keep=2, policy=FixedSteps(5))")
    script = PRELUDE + setup + "from hpcckpt.policy import FixedSteps\ncompute = advance\n" + code + CHECK
    out = steps_line(run_script(tmp_path, script, "mpi", 20))
    steps = eval(out.split("STEPS ")[1].split(" STEP")[0])
    assert steps and 0 not in steps and steps[-1] <= 20, out
    assert out.endswith("STEP 20 U 20.0 20.0 T 10.0"), out


# --------------------------------------------------------------------------- docs/porting.md

def porting_snippets():
    text = read("docs/porting.md")
    marked = [(text.count("\n", 0, m.start()) + 2, m.group(1), m.group(2)) for m in MARKED.finditer(text)]
    return text, marked


def test_every_python_block_of_the_porting_guide_is_marked_for_testing():
    text, marked = porting_snippets()
    assert {line for line, _ in python_blocks(text)} == {line for line, *_ in marked}
    assert len(marked) >= 6


@pytest.mark.parametrize("line,mode,code", [pytest.param(*m, id=f"porting.md:{m[0]}") for m in porting_snippets()[1]])
def test_porting_guide_snippet_runs(tmp_path, line, mode, code):
    run_script(tmp_path, code, mode)
