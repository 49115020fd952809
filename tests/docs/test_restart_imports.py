"""What a fresh process that imports hpcckpt and loads once (a restart) imports, and that its logging still works.

A restart pays for every module it imports (docs/performance.md, "The first load in a fresh job"): the save side,
logging and shutil are left out of ``import hpcckpt`` and of a load, and the "hpcckpt" logger is made when the
application can have given it a handler (it imported logging, or set HPCCKPT_LOG_LEVEL).
"""

from __future__ import annotations

import os
import subprocess
import sys

from testpaths import REPO  # noqa: E402

ROOT = REPO

SAVE_THEN_LOAD = """
import subprocess, sys, numpy as np
import hpcckpt
path = sys.argv[1]
subprocess.run([sys.executable, "-c", "import numpy as np, hpcckpt; hpcckpt.save({'u': hpcckpt.Block("
                "np.arange(6.0), (0,), (6,))}, %r)" % path], check=True)
out = np.zeros(6)
hpcckpt.load({"u": hpcckpt.Block(out, (0,), (6,))}, path)
assert np.array_equal(out, np.arange(6.0))
"""


def _run(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh process (no MPI, no HPCCKPT_LOG_LEVEL but as given), the version's path its argument."""
    base = {k: v for k, v in os.environ.items() if k != "HPCCKPT_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", code, str(tmp_path / "ck")], capture_output=True, text=True,
                          timeout=120, check=True, cwd=ROOT, env=dict(base, PYTHONPATH=ROOT, HPCCKPT_NO_MPI="1", **env))


def test_a_restart_imports_neither_the_save_side_nor_logging_nor_shutil(tmp_path):
    out = _run(SAVE_THEN_LOAD + ("print(sorted(m for m in ('logging', 'shutil', 'hpcckpt.saving.pipeline', "
                                 "'hpcckpt.checkpointer') if m in sys.modules))"), tmp_path)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_logger_configured_after_the_import_gets_the_load_line(tmp_path):
    code = ("import logging\nlogging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
            + SAVE_THEN_LOAD)
    assert "hpcckpt loaded" in _run(code, tmp_path).stderr


def test_hpcckpt_log_level_in_the_environment_logs_the_load_line(tmp_path):
    assert "hpcckpt INFO: loaded" in _run(SAVE_THEN_LOAD, tmp_path, HPCCKPT_LOG_LEVEL="INFO").stderr
