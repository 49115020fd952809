"""slurm/hpcckpt.sbatch as sbatch reads it: the #SBATCH directives the documented workflow depends on.

sbatch takes ``#SBATCH`` lines only from the top of the script, up to the first
line that is neither a comment nor blank; a directive after that is silently
ignored.  The multi-node test (tests/cluster/test_slurm_nodes.py) loses a node
for real and needs the rerun inside the allocation that ``--no-kill`` allows;
this file checks, without SLURM, that the template itself carries it.
"""

from __future__ import annotations

import os
import re
import shlex
from testpaths import REPO

ROOT = REPO
TEMPLATE = os.path.join(ROOT, "slurm", "hpcckpt.sbatch")


def sbatch_directives(path: str) -> list[str]:
    """The options of the ``#SBATCH`` lines sbatch honours in ``path`` (those before the first command)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            text = line.strip()
            if text and not text.startswith("#"):
                break  # sbatch stops looking for directives at the first command
            m = re.match(r"#SBATCH\s+(.*)$", text)
            if m:
                out.extend(shlex.split(m.group(1), comments=True))
    return out


def test_the_parser_stops_at_the_first_command(tmp_path):
    script = tmp_path / "s.sbatch"
    script.write_text("#!/bin/bash\n# a comment\n\n#SBATCH --ntasks=2  # two\n#SBATCH -k\necho hi\n#SBATCH --no-kill\n")
    assert sbatch_directives(str(script)) == ["--ntasks=2", "-k"]


def test_the_template_carries_no_kill_and_the_rest_of_its_documented_options():
    opts = sbatch_directives(TEMPLATE)
    # without --no-kill a node failure ends the whole allocation, restart-loop.sh included, so the
    # documented in-allocation rerun after a node dies (docs/slurm.md, section 4) could never happen
    assert "--no-kill" in opts or "-k" in opts, opts
    assert not any(o.startswith("--no-kill=") for o in opts), opts  # not "--no-kill=off"
    for needed in ("--requeue", "--signal=B:USR1@300", "--open-mode=append"):
        assert needed in opts, (needed, opts)
    assert "--no-requeue" not in opts


def test_the_template_header_and_the_guide_say_why():
    with open(TEMPLATE, encoding="utf-8") as f:
        header = f.read()
    assert re.search(r"^#   \* --no-kill: a node that fails does not end the allocation", header, re.M), header[:2000]
    with open(os.path.join(ROOT, "docs", "slurm.md"), encoding="utf-8") as f:
        guide = f.read()
    table_row = next(line for line in guide.splitlines() if line.startswith("| `slurm/hpcckpt.sbatch` |"))
    assert "`--no-kill`" in table_row
    assert "With\n`--no-kill` slurmctld instead removes the failed node" in guide


def test_the_multi_node_test_relies_on_the_template_not_on_its_own_flag():
    """tests/cluster/test_slurm_nodes.py submits the template with -N/-n only, so it exercises the template's
    own --no-kill (passing --no-kill itself would hide a template that lacks it)."""
    with open(os.path.join(ROOT, "tests", "cluster", "test_slurm_nodes.py"), encoding="utf-8") as f:
        text = f.read()
    submit = re.search(r'job\.client\("sbatch",[^)]*TEMPLATE', text, re.S)
    assert submit and "--no-kill" not in submit.group(0) and '"-k"' not in submit.group(0), submit
