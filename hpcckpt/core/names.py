"""Every name hpcckpt gives inside a root and inside a version, the one parser of version names, and the
rule for the names of variables and values (:func:`state_name_problem`).

A version directory holds ``metadata.json`` (its presence commits the version),
``data/`` with the data files the metadata lists, and, on node-local levels,
``parity/``.  A root holds the version directories ``step-<12 digits>[.rN]``
and a few bookkeeping files.  docs/format.md (sections 1 and 3.5) is the
normative description; this module is the only place that spells the names, so
that a new transport, level or tool cannot invent a second spelling.
"""

from __future__ import annotations

import re
from typing import NamedTuple

#: The longest variable or value name, in characters (docs/format.md, section 3.1): a nested state's
#: path name ("group/key") counts whole.  Saves refuse a longer one; readers refuse a longer variable name.
MAX_NAME_CHARS = 1024

#: The index of a version; written last, its presence commits the version.
METADATA_FILE = "metadata.json"
#: The directory of a version's data files.
DATA_DIR = "data"
#: The directory of a version's parity files, XOR and Reed-Solomon (node-local levels).
PARITY_DIR = "parity"
#: The one data file of the shared-file strategy.
SHARED_FILE = f"{DATA_DIR}/shared.bin"

#: The name of a version directory: ``step-<12 digits>`` then an optional revision ``.r<N>``.
_VERSION = re.compile(r"^step-(\d{12})(?:\.r(\d{1,6}))?$")
#: Largest step a version name holds (12 digits).
MAX_VERSION_STEP = 10**12 - 1
#: A version named in a reference ``@NAME/path``: one plain directory name next to the version.
_REFERENCE_VERSION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}$")


class VersionName(NamedTuple):
    """The step and revision a version directory's name encodes."""

    step: int
    revision: int


def state_name_problem(name) -> str | None:
    """Why ``name`` cannot name a variable or value (None when it can): not a non-empty string, or too long."""
    if not isinstance(name, str) or not name:
        return f"state keys must be non-empty strings, got {name!r}"
    if len(name) > MAX_NAME_CHARS:
        return (f"the name {name[:40]!r}... is {len(name)} characters long: a variable or value name (the whole "
                f"path \"group/key\" of nested state) is at most {MAX_NAME_CHARS} characters (docs/format.md, "
                "section 3.1)")
    return None


def version_name(step: int, revision: int = 0) -> str:
    """The directory name of revision ``revision`` of ``step`` (revision 0 has no suffix)."""
    return f"step-{step:012d}" + (f".r{revision}" if revision else "")


def parse_version_name(name: str) -> VersionName | None:
    """``(step, revision)`` of a version directory name, None for any other name."""
    m = _VERSION.match(name)
    return None if m is None else VersionName(int(m.group(1)), int(m.group(2) or 0))


#: Under a root: where each rank's pre-copy rounds write before the version they belong to is named
#: (``.hpcckpt-precopy/r<rank>/``; moved into the version by its save, hpcckpt.saving.precopy).
PRECOPY_DIR = ".hpcckpt-precopy"


def precopy_file(rank: int, count: int) -> str:
    """The data file of a rank's ``count``-th pre-copy round of a run, relative to a version directory."""
    return f"{DATA_DIR}/precopy-{rank:06d}-{count:02d}.bin"


def rank_file(rank: int) -> str:
    """The data file of ``rank`` under the file-per-rank strategy (and on node-local levels)."""
    return f"{DATA_DIR}/part-{rank:06d}.bin"


def aggregator_file(rank: int) -> str:
    """The data file the aggregator ``rank`` writes under the aggregated strategy."""
    return f"{DATA_DIR}/agg-{rank:06d}.bin"


def compacted_file(n: int) -> str:
    """The ``n``-th data file a compaction writes into a version (copies of blocks it referenced)."""
    return f"{DATA_DIR}/compact-{n:06d}.bin"


def parity_file(rank: int) -> str:
    """The XOR parity file ``rank`` keeps for its parity group (node-local levels)."""
    return f"{PARITY_DIR}/xor-{rank:06d}.bin"


def rs_parity_file(rank: int) -> str:
    """The Reed-Solomon check blocks ``rank`` keeps for its group (node-local levels)."""
    return f"{PARITY_DIR}/rs-{rank:06d}.bin"


def reference(version: str, path: str) -> str:
    """The name, in another version's ``files`` list, of data file ``path`` of the sibling ``version``."""
    return f"@{version}/{path}"


def split_reference(name: str) -> tuple[str, str] | None:
    """``(version name, path inside it)`` for a reference ``@NAME/path``, None for a file of this version."""
    if not name.startswith("@"):
        return None
    version, _, rest = name[1:].partition("/")
    return version, rest


def is_reference_version(name: str) -> bool:
    """Whether ``name`` may be the version of a reference (a plain directory name, no path)."""
    return bool(_REFERENCE_VERSION.match(name))
