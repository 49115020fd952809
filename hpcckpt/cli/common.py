"""What every ``hpcckpt`` subcommand shares: exit codes, argument types, version lookup, and the one output style.

The output style of every command (ls, inspect, verify, gc, stats, export,
unlock, interval, simulate) is set here: tables are aligned columns under an
upper-case header row, two spaces apart, numbers right-aligned
(:func:`print_table`); tables, durations, times and sizes are written as
hpcckpt.core.humanize writes them for the library's text too (``1.4ms``,
``113m``; ``2026-12-01 14:03:05Z``, UTC; ``16.1 MiB``), re-exported here as
:func:`duration_text`, :func:`time_text` and :func:`human_bytes`.
``--json`` outputs keep the stored forms (ISO 8601 strings, seconds, bytes).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass

import numpy as np

from hpcckpt.root.catalog import VersionEntry, current, list_versions
from hpcckpt.root.catalog import resolve_version as catalog_resolve
from hpcckpt.errors import CheckpointError
from hpcckpt.format.metadata import Metadata
from hpcckpt.core.names import DATA_DIR, METADATA_FILE
from hpcckpt.storage import POSIX, Storage
from hpcckpt.storage.base import DIRECTORY
from hpcckpt.storage.metadata_file import read_metadata
from hpcckpt.storage.s3 import storage_for
from hpcckpt.core.humanize import format_duration as duration_text  # noqa: F401 - re-exported: the commands' one style
from hpcckpt.core.humanize import format_time as time_text  # noqa: F401
from hpcckpt.core.humanize import human_bytes  # noqa: F401
from hpcckpt.core.humanize import table_lines


#: ``gc`` leaves alone a partial version touched more recently than this (a save may be running).
DEFAULT_GRACE = "5m"

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

# --------------------------------------------------------------------------- the output style

def print_table(rows: list[tuple], right: set[int] = frozenset(), indent: str = "") -> None:
    """Print ``rows`` (the first one the upper-case header) in the one table style (humanize.table_lines)."""
    for line in table_lines(rows, right, indent):
        print(line)


def progress_bar(show: bool, total, desc: str, unit: str = "B"):
    """A tqdm bar on stderr (a disabled one when ``show`` is false); bytes are counted in KiB/MiB/..."""
    from tqdm import tqdm

    scale = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(total=total, unit=unit, file=sys.stderr, desc=desc, leave=False, dynamic_ncols=True,
                disable=not show, **scale)


def show_progress(args, default: bool) -> bool:
    """Whether a command shows its progress bar: ``--progress`` / ``--no-progress``, else ``default`` when
    stderr is a terminal (never in a pipe or a script's capture, so stdout and stderr stay parseable)."""
    return args.progress if args.progress is not None else (default and sys.stderr.isatty())


def shape_str(shape) -> str:
    return "x".join(str(s) for s in shape) if shape else "()"


def box_str(start, count) -> str:
    return "[" + ", ".join(f"{a}:{a + c}" for a, c in zip(start, count)) + "]" if len(start) else "[]"


def dtype_str(dtype: np.dtype) -> str:
    return dtype.str if dtype.fields is None and dtype.subdtype is None else str(dtype)


def short_repr(value, width: int = 60) -> str:
    """One line, at most ``width`` characters, describing a replicated value."""
    if isinstance(value, np.ndarray):
        body = np.array2string(value, threshold=8, edgeitems=3, separator=", ", max_line_width=10**6)
        text = f"ndarray {dtype_str(value.dtype)} {value.shape}: {body}"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def storage_of(path: str) -> Storage:
    """The storage ``path`` is in, as ``hpcckpt.open`` chooses it: a bucket for ``s3://bucket/prefix``
    (hpcckpt.storage.s3), else POSIX."""
    return storage_for(path, POSIX)


def _tree(path: str):
    """The Stat of ``path`` and of everything below it, links not followed (what cannot be looked at is left
    out): through the storage ``path`` is in."""
    storage = storage_of(path)
    todo = [path]
    while todo:
        here = todo.pop()
        try:
            st = storage.stat(here)
        except OSError:
            continue
        if st is None:
            continue
        yield st
        if st.kind == DIRECTORY:
            try:
                todo += [os.path.join(here, name) for name in storage.listdir(here)]
            except OSError:
                continue


def dir_size(path: str) -> int:
    """Apparent size of everything but directories below ``path`` (symlinks not followed)."""
    return sum(st.size for st in _tree(path) if st.kind != DIRECTORY)


def newest_mtime(path: str) -> float:
    """The latest modification time of ``path`` or anything below it, in seconds."""
    return max((st.modified / 1e9 for st in _tree(path)), default=0.0)


def require_dir(path: str, what: str = "directory") -> str:
    storage = storage_of(path)
    if not storage.exists(path):
        raise CheckpointError(f"{path}: no such {what}")
    if not storage.is_directory(path):
        raise CheckpointError(f"{path}: not a directory")
    return path


def require_root(root: str) -> str:
    require_dir(root, "checkpoint root")
    storage = storage_of(root)
    if storage.is_file(os.path.join(root, METADATA_FILE)):
        raise CheckpointError(f"{root} is a single checkpoint version, not a root of versions "
                              f"(try: hpcckpt inspect {root})")
    if storage.is_directory(os.path.join(root, DATA_DIR)):
        parent = os.path.dirname(storage.realpath(root))
        raise CheckpointError(f"{root} is a partial version (an interrupted save: it has {DATA_DIR}/ but no "
                              f"{METADATA_FILE}), not a root of versions; it never counts, and "
                              f"`hpcckpt gc {parent}` removes it")
    return root


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_TERM = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*([smhd]?)", re.ASCII)
_FULL = re.compile(r"^\s*(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*[smhd]?\s*)+$", re.ASCII)


def parse_duration(text) -> float:
    """``"40"`` -> 40.0, ``"40s"``, ``"5m"``, ``"12h"``, ``"1.5d"``, ``"1h30m"``; seconds.

    Raises CheckpointError with a one-line message for anything else
    (negative, empty, NaN, unknown suffix).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        v = float(text)
        if math.isfinite(v) and v >= 0:
            return v
        raise CheckpointError(f"bad duration {text!r}: must be finite and >= 0")
    s = str(text).strip().lower()
    if not s or not _FULL.match(s):
        raise CheckpointError(
            f"bad duration {text!r}: use seconds or a number with s/m/h/d, e.g. 40, 40s, 5m, 12h, 2d, 1h30m")
    total = 0.0
    terms = list(_TERM.finditer(s))
    if len(terms) > 1 and any(m.group(2) == "" for m in terms):
        raise CheckpointError(f"bad duration {text!r}: every term of a compound duration needs a unit (1h30m)")
    for m in terms:
        num = float(m.group(0)[: len(m.group(0)) - len(m.group(2))].strip())
        total += num * _UNITS.get(m.group(2) or "s")
    if not math.isfinite(total):
        raise CheckpointError(f"bad duration {text!r}: too large")
    return total


def duration(text: str) -> float:
    """argparse type of a DURATION option (:func:`parse_duration`)."""
    try:
        return parse_duration(text)
    except CheckpointError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


@dataclass
class VersionRow:
    """One line of ``hpcckpt ls``."""

    entry: VersionEntry
    state: str  # committed, superseded, partial, damaged
    size: int
    meta: Metadata | None = None
    problem: str | None = None


def version_rows(root: str) -> list[VersionRow]:
    storage = storage_of(root)
    entries = list_versions(root, storage)
    live = {e.name for e in current(entries)}
    rows = []
    for e in entries:
        row = VersionRow(e, "partial", dir_size(e.path))
        if e.committed:
            row.state = "committed" if e.name in live else "superseded"
            try:
                row.meta = read_metadata(e.path, storage)
            except CheckpointError as exc:
                row.state, row.problem = "damaged", str(exc)
        rows.append(row)
    return rows


def failure_estimate(root: str, prior_mtbf: float | None, details: bool = False):
    """(summary dict, footer line) of the failure history under ``root``, or None when there is none.

    The footer says in plain words how many runs failed and how often a
    failure is expected; ``details`` adds the estimator's own line (method,
    exposure, prior; see :class:`hpcckpt.policy.Estimate`).  The history is
    read read-only: a malformed file stays where it is.
    """
    from hpcckpt.policy import FailureHistory, estimate_mtbf
    from hpcckpt.policy.history import HISTORY_FILENAME

    path = os.path.join(root, HISTORY_FILENAME)
    storage = storage_of(root)
    if not storage.is_file(path):
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = FailureHistory.load(root, read_only=True, storage=storage)
    if caught:
        reason = str(caught[0].message).split(" (", 1)[-1].rsplit(")", 1)[0]
        return {"error": f"unreadable: {reason}"}, f"failure history: {path} is unreadable ({reason})"
    est = estimate_mtbf(history, prior_mtbf=prior_mtbf)
    nopen = 1 if history.current is not None else 0
    summary = {"runs": len(history.runs), "open": nopen, "failures": est.n_failures, "exposure_s": est.exposure,
               "mtbf_s": est.mtbf, "method": est.method, "prior_mtbf_s": est.prior_mtbf,
               "weibull_shape": est.weibull_shape}
    runs = f"{len(history.runs)} run{'s' if len(history.runs) != 1 else ''}"
    if nopen:
        runs += ", the last still running or not yet seen to fail (not counted)"
    if est.method == "prior":
        expect = f"no finished run yet, so a failure is assumed every {duration_text(est.mtbf)}"
    else:
        failures = f"{est.n_failures} failure{'s' if est.n_failures != 1 else ''}"
        expect = (f"{failures} in {duration_text(est.exposure)} of running time, so a failure is expected "
                  f"about every {duration_text(est.mtbf)}")
    line = f"failure history: {runs}; {expect}"
    return summary, line + (f"; estimate: {est}" if details else "")


def add_progress_flags(p: argparse.ArgumentParser, default: str) -> None:
    """``--progress`` / ``--no-progress`` (``args.progress`` is None when neither is given)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help=f"always show a progress bar on stderr (default: {default})")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")


def metadata_dir(path: str) -> str:
    """``path``, or the version directory it names when it is that version's ``metadata.json`` file."""
    if os.path.basename(os.path.normpath(path)) == METADATA_FILE and storage_of(path).is_file(path):
        return os.path.dirname(os.path.normpath(path)) or "."
    return path


def resolve_version(path: str) -> tuple[str, str | None]:
    """A version directory for ``path``: itself (or the directory of a ``metadata.json`` path), or the newest
    committed version when it is a root."""
    path = metadata_dir(path)
    require_dir(path, "checkpoint")
    version, entry = catalog_resolve(path, storage_of(path))
    if entry is None:
        return version, None
    return version, f"{path} is a root; showing its newest committed version {entry.name}"
