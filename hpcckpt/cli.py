"""The ``hpcckpt`` command: look at, verify and clean checkpoints; checkpoint-interval tools.

Subcommands (``hpcckpt SUBCOMMAND --help`` for each)::

    hpcckpt ls ROOT                 versions under a Checkpointer root (+ the learned MTBF)
    hpcckpt inspect PATH            variables, values, files of one version [--chunks] [--json]
    hpcckpt verify PATH             read every chunk and check its checksum (a version or a root)
    hpcckpt gc ROOT                 remove partial leftovers, superseded revisions [--keep N]
    hpcckpt stats PATH              per-rank phase timings of the save, bandwidth, straggler [--plot PNG]
    hpcckpt export PATH OUT.h5      one plain HDF5 file of a version (docs/hdf5.md)
    hpcckpt interval / simulate     Young/Daly intervals and the failure simulator (hpcckpt.policy)

Exit status: 0 success; 1 an error, or ``verify`` found damage; 2 bad usage.
Errors are one line on stderr (``hpcckpt: error: ...``), never a traceback;
set ``HPCCKPT_DEBUG=1`` to get the traceback of an unexpected internal error.
The format read here is specified in docs/format.md; the commands in docs/cli.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import numpy as np

from . import __version__
from .catalog import VersionEntry, current, list_versions, remove_versions, removable
from .encoding import dtype_to_json
from .errors import CheckpointError, CorruptCheckpointError
from .metadata import CHECKSUM_ALGORITHM, FORMAT_NAME, FORMAT_VERSION, Metadata
from .names import METADATA_FILE
from .metadata_file import read_metadata
from .view import CheckpointView

#: ``verify`` shows a progress bar on a terminal from this many bytes on.
PROGRESS_THRESHOLD = 64 << 20
#: ``gc`` leaves alone a partial version touched more recently than this (a save may be running).
DEFAULT_GRACE = "5m"

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


# --------------------------------------------------------------------------- helpers

def human_bytes(n: int) -> str:
    """``132`` -> ``"132 B"``, ``1536`` -> ``"1.5 KiB"``."""
    n = int(n)
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024.0
        if value < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    return f"{n} B"  # pragma: no cover


def _shape_str(shape) -> str:
    return "x".join(str(s) for s in shape) if shape else "()"


def _box_str(start, count) -> str:
    return "[" + ", ".join(f"{a}:{a + c}" for a, c in zip(start, count)) + "]" if len(start) else "[]"


def _dtype_str(dtype: np.dtype) -> str:
    return dtype.str if dtype.fields is None and dtype.subdtype is None else str(dtype)


def short_repr(value, width: int = 60) -> str:
    """One line, at most ``width`` characters, describing a replicated value."""
    if isinstance(value, np.ndarray):
        body = np.array2string(value, threshold=8, edgeitems=3, separator=", ", max_line_width=10**6)
        text = f"ndarray {_dtype_str(value.dtype)} {value.shape}: {body}"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _dir_size(path: str) -> int:
    """Apparent size of every regular file below ``path`` (symlinks not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += st.st_size
    return total


def _newest_mtime(path: str) -> float:
    """The latest modification time of ``path`` or anything below it."""
    newest = 0.0
    for dirpath, _dirs, files in os.walk(path):
        for name in [None, *files]:
            try:
                newest = max(newest, os.lstat(dirpath if name is None else os.path.join(dirpath, name)).st_mtime)
            except OSError:
                continue
    return newest


def _require_dir(path: str, what: str = "directory") -> str:
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such {what}")
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory")
    return path


def _require_root(root: str) -> str:
    _require_dir(root, "checkpoint root")
    if os.path.isfile(os.path.join(root, METADATA_FILE)):
        raise CheckpointError(f"{root} is a single checkpoint version, not a root of versions "
                              f"(try: hpcckpt inspect {root})")
    return root


def _duration(text: str) -> float:
    from .policy.cli import parse_duration

    try:
        return parse_duration(text)
    except CheckpointError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


@dataclass
class _Row:
    """One line of ``hpcckpt ls``."""

    entry: VersionEntry
    state: str  # committed, superseded, partial, damaged
    size: int
    meta: Metadata | None = None
    problem: str | None = None


def _rows(root: str) -> list[_Row]:
    entries = list_versions(root)
    live = {e.name for e in current(entries)}
    rows = []
    for e in entries:
        row = _Row(e, "partial", _dir_size(e.path))
        if e.committed:
            row.state = "committed" if e.name in live else "superseded"
            try:
                row.meta = read_metadata(e.path)
            except CheckpointError as exc:
                row.state, row.problem = "damaged", str(exc)
        rows.append(row)
    return rows


def _failure_estimate(root: str, prior_mtbf: float | None):
    """(summary dict, footer line) of the failure history under ``root``, or None when there is none.

    The history is read from a private copy: FailureHistory.load renames a
    malformed file to ``.bad``, which a read-only listing must not do.
    """
    from .policy import FailureHistory, estimate_mtbf
    from .policy.history import HISTORY_FILENAME

    path = os.path.join(root, HISTORY_FILENAME)
    if not os.path.isfile(path):
        return None
    with tempfile.TemporaryDirectory(prefix="hpcckpt-ls-") as tmp:
        shutil.copyfile(path, os.path.join(tmp, HISTORY_FILENAME))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = FailureHistory.load(tmp)
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
        runs += ", the last still open (not counted)"
    return summary, f"failure history: {runs}; estimate: {est}"


# --------------------------------------------------------------------------- ls

def cmd_ls(args) -> int:
    root = _require_root(args.root)
    rows = _rows(root)
    estimate = _failure_estimate(root, args.prior_mtbf)
    from .levels.status import format_levels, levels_status

    levels = levels_status(root)  # None unless a multi-level Checkpointer used this root
    if args.json:
        doc = {"root": root, "versions": [_row_json(r) for r in rows],
               "failure_history": estimate[0] if estimate else None, "levels": levels}
        print(json.dumps(doc, indent=1))
        return EXIT_OK
    if not rows:
        print(f"{root}: no versions")
    else:
        table = [("STEP", "VERSION", "STATE", "SIZE", "CREATED", "VARS", "VALUES")]
        for r in rows:
            m = r.meta
            table.append((str(r.entry.step), r.entry.name, r.state, human_bytes(r.size),
                          m.created if m else "-", str(len(m.variables)) if m else "-",
                          str(len(m.values)) if m else "-"))
        _print_table(table, right={0, 3, 5, 6})
        for r in rows:
            if r.problem:
                print(f"  {r.entry.name}: {r.problem}")
        counts = {s: sum(1 for r in rows if r.state == s) for s in ("committed", "superseded", "partial", "damaged")}
        live = [r for r in rows if r.state == "committed"]
        parts = [f"{counts['committed']} committed" + (f" (newest step {live[-1].entry.step})" if live else "")]
        parts += [f"{n} {s}" for s, n in counts.items() if n and s != "committed"]
        total = sum(r.size for r in rows)
        print(f"{len(rows)} version{'s' if len(rows) != 1 else ''}: {', '.join(parts)}; {human_bytes(total)} on disk"
              + ("  (hpcckpt gc removes partial and superseded ones)" if counts["partial"] or counts["superseded"]
                 else ""))
    if levels:
        print("\n".join(format_levels(levels)))
    if estimate:
        print(estimate[1])
    return EXIT_OK


def _row_json(r: _Row) -> dict:
    m = r.meta
    return {"name": r.entry.name, "step": r.entry.step, "revision": r.entry.revision, "state": r.state,
            "size": r.size, "created": m.created if m else None,
            "variables": len(m.variables) if m else None, "values": len(m.values) if m else None,
            "problem": r.problem}


def _print_table(rows: list[tuple], right: set[int] = frozenset(), indent: str = "") -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        print((indent + "  ".join(cells)).rstrip())


# --------------------------------------------------------------------------- inspect

def _resolve_version(path: str) -> tuple[str, str | None]:
    """A version directory for ``path``: itself, or the newest committed version when it is a root."""
    _require_dir(path, "checkpoint")
    if os.path.isfile(os.path.join(path, METADATA_FILE)):
        return path, None
    live = current(list_versions(path))
    if live:
        return live[-1].path, f"{path} is a root; showing its newest committed version {live[-1].name}"
    return path, None  # read_metadata names the missing metadata.json


def _file_sizes(view: CheckpointView) -> list[int | None]:
    """Size of each data file (None when missing or not allowed); ``@VERSION/...`` references resolved."""
    from .storage.posix import confined_path

    out = []
    for name in view.meta.files:
        try:
            out.append(os.stat(confined_path(view.path, name)).st_size)
        except (OSError, CheckpointError):
            out.append(None)
    return out


def cmd_inspect(args) -> int:
    path, note = _resolve_version(args.path)
    with CheckpointView(path) as view:
        meta = view.meta
        sizes = _file_sizes(view)
        if args.json:
            print(json.dumps(_inspect_json(view, sizes, args.chunks), indent=1))
            return EXIT_OK
        if note:
            print(f"({note})")
        print(f"checkpoint   {path}")
        print(f"format       hpcckpt format version {FORMAT_VERSION}, chunk checksums {CHECKSUM_ALGORITHM}")
        print(f"step         {meta.step if meta.step is not None else '-'}")
        print(f"created      {meta.created}")
        print(f"written by   {meta.nranks} rank{'s' if meta.nranks != 1 else ''}")
        own = sum(s or 0 for n, s in zip(meta.files, sizes) if not n.startswith("@"))
        refs = sum(1 for n in meta.files if n.startswith("@"))
        print(f"files        {len(meta.files)}, {human_bytes(own)}"
              + (f" (+ {refs} file{'s' if refs != 1 else ''} of other versions, referenced)" if refs else ""))
        width = max((len(n) for n in meta.files), default=0)
        for name, size in zip(meta.files, sizes):
            print(f"  {name.ljust(width)}  {human_bytes(size) if size is not None else 'MISSING'}")
        print(f"variables    {len(meta.variables)}")
        if meta.variables:
            table = [("NAME", "KIND", "SHAPE", "DTYPE", "CODEC", "CHUNKS", "BYTES", "STORED")]
            for name, var in meta.variables.items():
                table.append((name, var.kind, _shape_str(var.shape), _dtype_str(var.dtype),
                              str(var.codec.get("id")), str(len(var.chunks)), human_bytes(var.nbytes),
                              human_bytes(var.stored_bytes)))
            _print_table(table, right={5, 6, 7}, indent="  ")
        print(f"values       {len(view.values)}")
        width = max((len(k) for k in view.values), default=0)
        for name, value in view.values.items():
            print(f"  {name.ljust(width)} = {short_repr(value)}")
        if meta.extra:
            print(f"extra        {len(meta.extra)}")
            width = max(len(k) for k in meta.extra)
            for key, value in meta.extra.items():
                print(f"  {key.ljust(width)} = {short_repr(value)}")
        if args.chunks:
            for name, var in meta.variables.items():
                print(f"chunks of {name} ({len(var.chunks)}):")
                if not len(var.chunks):
                    continue
                table = [("#", "BOX", "FILE", "OFFSET", "LENGTH", "CHECKSUM")]
                c = var.chunks
                for k in range(len(c)):
                    table.append((str(k), _box_str(c.start[k].tolist(), c.count[k].tolist()),
                                  meta.files[int(c.file[k])], str(int(c.offset[k])), str(int(c.nbytes[k])),
                                  c.checksum[k]))
                _print_table(table, right={0, 3, 4}, indent="  ")
    return EXIT_OK


def _inspect_json(view: CheckpointView, sizes, with_chunks: bool) -> dict:
    meta = view.meta
    variables = {}
    for name, var in meta.variables.items():
        doc = {"kind": var.kind, "shape": list(var.shape), "dtype": dtype_to_json(var.dtype),
               "dtype_str": str(var.dtype), "codec": var.codec, "nchunks": len(var.chunks),
               "nbytes": var.nbytes, "stored_bytes": var.stored_bytes}
        if with_chunks:
            c = var.chunks
            doc["chunks"] = [{"file": meta.files[int(c.file[k])], "offset": int(c.offset[k]),
                              "nbytes": int(c.nbytes[k]), "checksum": c.checksum[k],
                              "start": c.start[k].tolist(), "count": c.count[k].tolist()}
                             for k in range(len(c))]
        variables[name] = doc
    return {"path": view.path, "format": FORMAT_NAME, "format_version": FORMAT_VERSION,
            "checksum": CHECKSUM_ALGORITHM, "step": meta.step, "created": meta.created, "nranks": meta.nranks,
            "files": [{"name": n, "size": s} for n, s in zip(meta.files, sizes)],
            "variables": variables, "values": meta.values, "extra": meta.extra}


# --------------------------------------------------------------------------- verify

def _targets(path: str) -> tuple[list[str], str]:
    """The version directories ``verify PATH`` checks, and a note on what it skipped."""
    _require_dir(path, "checkpoint")
    if os.path.isfile(os.path.join(path, METADATA_FILE)):
        return [path], ""
    entries = list_versions(path)
    live = current(entries)
    if not entries:
        return [path], ""  # not a root either: read_metadata gives the "no committed checkpoint" error
    if not live:
        raise CheckpointError(f"no committed version under {path} ({len(entries)} partial)")
    skipped = [e for e in entries if e not in live]
    note = f" (skipped {len(skipped)} partial or superseded)" if skipped else ""
    return [e.path for e in live], note


def cmd_verify(args) -> int:
    targets, note = _targets(args.path)
    t0 = time.perf_counter()
    views, problems = [], []
    try:
        for target in targets:
            try:
                views.append(CheckpointView(target))
            except CorruptCheckpointError as exc:
                problems.append(str(exc))
            except CheckpointError as exc:
                if len(targets) == 1:
                    raise
                problems.append(str(exc))
        total = sum(v.meta.variables[n].stored_bytes for v in views for n in v.meta.variables)
        nchunks = sum(len(var.chunks) for v in views for var in v.meta.variables.values())
        show = args.progress if args.progress is not None else (total > PROGRESS_THRESHOLD and sys.stderr.isatty())
        bar = None
        if show:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                       desc="verify", leave=False, dynamic_ncols=True)
        try:
            for view in views:
                problems.extend(view.verify(progress=bar.update if bar is not None else None))
        finally:
            if bar is not None:
                bar.close()
    finally:
        for view in views:
            view.close()
    seconds = time.perf_counter() - t0
    if problems:
        for line, n in _dedupe(problems):
            print(f"CORRUPT: {line}" + (f" ({n} chunks)" if n > 1 else ""))
        print(f"FAILED: {len(problems)} problem{'s' if len(problems) != 1 else ''} in {args.path}")
        return EXIT_FAIL
    what = f"{len(views)} version{'s' if len(views) != 1 else ''}, " if len(views) > 1 else ""
    print(f"OK: {args.path}: {what}{nchunks} chunk{'s' if nchunks != 1 else ''}, {human_bytes(total)} "
          f"verified in {seconds:.2f} s{note}")
    return EXIT_OK


def _dedupe(lines: list[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return list(counts.items())


# --------------------------------------------------------------------------- unlock

def cmd_unlock(args) -> int:
    from .rootlock import break_lock, describe

    root = _require_root(args.root)
    holder = break_lock(root)
    print(f"removed the writer lock of {root} (held by {describe(holder)})" if holder is not None
          else f"{root} has no writer lock")
    return 0


# --------------------------------------------------------------------------- the `hpcckpt export` command

def add_export_command(sub) -> None:
    """Add ``hpcckpt export PATH OUT.h5`` to the CLI's subparsers (hpcckpt.hdf5 does the work)."""
    p = sub.add_parser("export", help="write one checkpoint version as a plain HDF5 file (needs h5py)",
                       description="Write a checkpoint version (or the newest committed version under a root) as "
                                   "one plain HDF5 file: each variable a global dataset of its global shape and "
                                   "dtype, each replicated value an attribute of the root group (docs/hdf5.md). "
                                   "Every chunk is verified against its checksum on the way.")
    p.add_argument("path", metavar="PATH", help="a checkpoint version directory or a Checkpointer root")
    p.add_argument("out", metavar="OUT.h5", help="the HDF5 file to write (written as OUT.h5.tmp, then renamed)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT.h5 if it exists")
    add_progress_flags(p, "only on a terminal")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    """``hpcckpt export``: one OK line on stdout; a tqdm bar on stderr while it runs."""
    from tqdm import tqdm

    from .hdf5 import export, export_nbytes

    path, note = _resolve_version(args.path)
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    with tqdm(total=export_nbytes(path), unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
              desc="export", leave=False, dynamic_ncols=True, disable=not show) as bar:
        result = export(path, args.out, progress=bar.update, overwrite=args.overwrite)
    print(f"OK: {path} -> {result.path}: {len(result.datasets)} datasets, {len(result.attributes)} attributes, "
          f"{human_bytes(result.nbytes)}" + (f" ({note})" if note else ""))
    return EXIT_OK


# --------------------------------------------------------------------------- gc

def cmd_gc(args) -> int:
    root = _require_root(args.root)
    entries = list_versions(root)
    if args.compact:
        from .chain import compact

        for line in compact(root, args.keep, dry_run=args.dry_run):
            print(("would compact  " if args.dry_run else "compacted  ") + line)
        entries = list_versions(root)
    live = current(entries)
    kept_by_keep = {e.name for e in (live[-args.keep:] if args.keep else live)}
    newest_rev = {e.step: e.name for e in live}
    now = time.time()
    plan, busy = [], []
    doomed = removable(entries, args.keep)
    # removable() keeps what a kept incremental version references: say why such a version stays
    unprotected = {e.name for e in entries if e.name not in {x.name for x in (live[-args.keep:] if args.keep else live)}}
    referenced = [e for e in entries if e.name in unprotected - {d.name for d in doomed}]
    for e in doomed:
        if not e.committed:
            age = now - _newest_mtime(e.path)
            if age < args.grace:
                busy.append((e, age))
                continue
            why = "partial (never committed)"
        elif e.name in {x.name for x in live} and e.name not in kept_by_keep:
            why = f"beyond --keep {args.keep}"
        else:
            why = f"superseded by {newest_rev.get(e.step, '?')}"
        plan.append((e, why, _dir_size(e.path)))
    for e in referenced:
        print(f"kept    {e.name}: a kept version references its data (incremental save)")
    for e, age in busy:
        print(f"kept    {e.name}: partial, but modified {age:.0f} s ago (a save may be running; "
              f"--grace 0 removes it)")
    if args.dry_run:
        for e, why, size in plan:
            print(f"would remove  {e.name}  {human_bytes(size)}  {why}")
        print(f"dry run: would remove {len(plan)} version{'s' if len(plan) != 1 else ''}, "
              f"{human_bytes(sum(s for _, _, s in plan))}")
        return EXIT_OK
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        removed = set(remove_versions([e for e, _, _ in plan]))
    for e, why, size in plan:
        if e.name in removed:
            print(f"removed  {e.name}  {human_bytes(size)}  {why}")
    for w in caught:
        print(f"hpcckpt: warning: {str(w.message).removeprefix('hpcckpt: ')}", file=sys.stderr)
    freed = sum(s for e, _, s in plan if e.name in removed)
    print(f"removed {len(removed)} version{'s' if len(removed) != 1 else ''}, freed {human_bytes(freed)}")
    return EXIT_OK if len(removed) == len(plan) else EXIT_FAIL


# --------------------------------------------------------------------------- main

def add_progress_flags(p: argparse.ArgumentParser, default: str) -> None:
    """``--progress`` / ``--no-progress`` (``args.progress`` is None when neither is given)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help=f"always show a progress bar on stderr (default: {default})")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcckpt",
        description="Inspect, verify and clean hpcckpt checkpoints; compute checkpoint intervals.",
        epilog="Run 'hpcckpt COMMAND --help' for each command. Exit status: 0 ok, 1 error or damage found, "
               "2 bad usage. The on-disk format: docs/format.md.")
    parser.add_argument("--version", action="version", version=f"hpcckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("ls", help="list the versions under a Checkpointer root",
                       description="List the versions under a Checkpointer root: step, directory, state "
                                   "(committed, superseded by a newer revision of the same step, partial = an "
                                   "interrupted save, damaged = unreadable metadata), size on disk, creation "
                                   "time and number of variables and replicated values; then the MTBF "
                                   "estimated from the root's failure history, when it has one. "
                                   "Reads metadata only (hpcckpt verify checks the data).")
    p.add_argument("root", metavar="ROOT", help="the Checkpointer root directory")
    p.add_argument("--prior-mtbf", type=_duration, default=None, metavar="DURATION",
                   help="prior MTBF for the estimate (e.g. 12h; default that of hpcckpt.policy, 24h)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("inspect", help="describe one checkpoint version",
                       description="Describe one checkpoint version: step, rank count that wrote it, data "
                                   "files, variables (kind, global shape, dtype, codec, chunks, bytes) and "
                                   "replicated values. PATH is a version directory, or a root (its newest "
                                   "committed version is shown). Reads metadata only.")
    p.add_argument("path", metavar="PATH", help="a checkpoint version directory or a Checkpointer root")
    p.add_argument("--chunks", action="store_true",
                   help="also list every chunk: global box, file, byte offset, length, checksum")
    p.add_argument("--json", action="store_true", help="machine-readable output (with --chunks: chunk lists)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("verify", help="read every chunk and check its checksum",
                       description="Read every chunk of a checkpoint version (or of every committed, "
                                   "non-superseded version under a root) and check its length and xxh3 "
                                   "checksum and that the chunks tile each variable. Exit 0 with one OK line, "
                                   "or 1 with one CORRUPT line per damaged file/chunk.")
    p.add_argument("path", metavar="PATH", help="a checkpoint version directory or a Checkpointer root")
    add_progress_flags(p, "only on a terminal, above 64 MiB")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("gc", help="remove partial and superseded versions (and old ones with --keep)",
                       description="Remove the leftovers of interrupted saves (partial versions), revisions "
                                   "superseded by a newer revision of the same step, and with --keep N every "
                                   "committed version but the newest N. A partial version modified less than "
                                   f"--grace ago (default {DEFAULT_GRACE}) is kept: a save may be writing it.")
    p.add_argument("root", metavar="ROOT", help="the Checkpointer root directory")
    p.add_argument("--keep", type=_positive_int, default=None, metavar="N",
                   help="also remove committed versions older than the newest N")
    p.add_argument("--dry-run", "-n", action="store_true", help="print what would be removed, remove nothing")
    p.add_argument("--compact", action="store_true",
                   help="first rewrite the kept versions so that none references a version beyond --keep "
                        "(incremental chains; the oldest kept becomes full), then remove the rest")
    p.add_argument("--grace", type=_duration, default=_duration(DEFAULT_GRACE), metavar="DURATION",
                   help=f"keep partial versions modified more recently than this (default {DEFAULT_GRACE}; 0 = none)")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("unlock", help="remove the writer lock of a root whose holder is known to be gone",
                       description="Remove ROOT/.hpcckpt-lock whoever holds it. A save takes over a stale lock "
                                   "by itself when the holder's process is gone on this host or was an earlier "
                                   "attempt of the same SLURM job; use this for a holder on another host that "
                                   "you know has ended. Never while the holder still writes.")
    p.add_argument("root", metavar="ROOT", help="the Checkpointer root directory")
    p.set_defaults(func=cmd_unlock)

    p = sub.add_parser("stats", help="where the time of a save went: per-rank phases, bandwidth, straggler",
                       description="Print the per-phase timings that every save stores with its version (min, "
                                   "median and max over the ranks, and the slowest rank), the aggregate write "
                                   "bandwidth and the straggler. PATH is a version, or a root (newest version).")
    p.add_argument("path", metavar="PATH", help="a checkpoint version directory or a Checkpointer root")
    p.add_argument("--plot", metavar="PNG", default=None, help="also draw a per-rank timeline (needs matplotlib)")
    p.set_defaults(func=cmd_stats)

    from .policy.cli import add_subcommands

    add_export_command(sub)
    add_subcommands(sub)
    return parser


def cmd_stats(args) -> int:
    """``hpcckpt stats``: the timing record of one save as a table (and optionally a timeline PNG)."""
    from . import stats

    path, note = _resolve_version(args.path)
    if note:
        print(note)
    meta = read_metadata(path)
    record = stats.save_stats(meta.extra)
    print(f"{path}: saved by {meta.nranks} ranks with strategy {meta.extra.get('strategy', '?')}")
    _print_table([("phase", "min s", "median s", "max s", "slowest rank"), *map(tuple, stats.table(record))],
                 right={1, 2, 3, 4})
    rate = stats.bandwidth(record)
    if rate is not None:
        print(f"bandwidth: {human_bytes(sum(record['bytes']))} at {rate / 1e9:.2f} GB/s (slowest rank's write phase)")
    slow = stats.straggler(record)
    if slow is not None:
        print(slow)
    if args.plot:
        stats.plot_timeline(record, args.plot, title=os.path.basename(os.path.normpath(path)))
        print(f"timeline written to {args.plot}")
    return EXIT_OK


def _run_policy(args) -> int:
    from .policy.cli import run

    return run(args)


def main(argv=None) -> int:
    """Entry point of the ``hpcckpt`` console script and ``python -m hpcckpt``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse already printed
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    func = _run_policy if getattr(args, "policy_command", None) else args.func
    try:
        return int(func(args) or 0)
    except CheckpointError as exc:
        return _fail(str(exc))
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # `hpcckpt ls ROOT | head`: stop quietly
            try:
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            return EXIT_FAIL
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}")
    except KeyboardInterrupt:
        print("hpcckpt: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line, unless the user asks for the traceback
        if os.environ.get("HPCCKPT_DEBUG"):
            raise
        return _fail(f"internal error {type(exc).__name__}: {exc} (please report; HPCCKPT_DEBUG=1 shows the "
                     "traceback)")


def _fail(message: str) -> int:
    print(f"hpcckpt: error: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_FAIL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
