"""The ``hpcckpt`` command: look at, verify and clean checkpoints; checkpoint-interval tools.

Subcommands (``hpcckpt SUBCOMMAND --help`` for each)::

    hpcckpt ls ROOT                 versions under a Checkpointer root (+ the learned failure rate)
    hpcckpt inspect PATH            variables, values, files of one version [--chunks] [--json]
    hpcckpt verify PATH             read every chunk and check its checksum (a version or a root)
    hpcckpt gc ROOT                 remove partial leftovers, superseded revisions [--keep N]
    hpcckpt unlock ROOT             remove the writer lock of a job known to be gone [--force]
    hpcckpt halt ROOT               ask the job writing ROOT to checkpoint and exit [--reason TEXT] [--remove]
    hpcckpt stats PATH              per-rank phase timings of the save, bandwidth, straggler [--plot PNG]
    hpcckpt export PATH OUT.h5      one plain HDF5 file of a version (docs/hdf5.md)
    hpcckpt interval / simulate     Young/Daly intervals and the failure simulator (hpcckpt.policy)

Exit status: 0 success; 1 an error, or ``verify`` found damage; 2 bad usage.
Errors are one line on stderr (``hpcckpt: error: ...``), never a traceback;
set ``HPCCKPT_DEBUG=1`` to get the traceback of an unexpected internal error.
The format read here is specified in docs/format.md; the commands in docs/cli.md.
One module per subcommand (listing, inspect, verify, maintenance, export,
stats, intervals), their shared helpers and the one output style in
common.py; this module builds the parser.
"""

from __future__ import annotations

import argparse
import os
import sys

from hpcckpt import __version__
from hpcckpt.errors import CheckpointError
from hpcckpt.cli.common import DEFAULT_GRACE, EXIT_FAIL, EXIT_OK, EXIT_USAGE, add_progress_flags, duration, positive_int
from hpcckpt.cli.export import add_export_command
from hpcckpt.cli.inspect import cmd_inspect
from hpcckpt.cli.intervals import add_subcommands
from hpcckpt.cli.listing import cmd_ls
from hpcckpt.cli.maintenance import cmd_gc, cmd_halt, cmd_unlock
from hpcckpt.cli.stats import cmd_stats
from hpcckpt.cli.verify import cmd_verify


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
                                   "time and number of variables and replicated values; then how often "
                                   "a failure is expected, learned from the root's failure history, when it "
                                   "has one. Given a directory without versions, it names the Checkpointer "
                                   "roots up to 3 levels below it (exit status 1 when there is none). "
                                   "Reads metadata only (hpcckpt verify checks the data).")
    p.add_argument("root", metavar="ROOT", help="the Checkpointer root directory")
    p.add_argument("--prior-mtbf", type=duration, default=None, metavar="DURATION",
                   help="prior MTBF for the estimate (e.g. 12h; default that of hpcckpt.policy, 24h)")
    p.add_argument("--details", action="store_true",
                   help="add how the failure rate is estimated (estimator, exposure, prior)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("inspect", help="describe one checkpoint version",
                       description="Describe one checkpoint version: step, rank count that wrote it, data "
                                   "files, variables (kind, global shape, dtype, codec, chunks, bytes) and "
                                   "replicated values. PATH is a version directory, its metadata.json, or a "
                                   "root (its newest committed version is shown). Reads metadata only.")
    p.add_argument("path", metavar="PATH",
                   help="a checkpoint version directory, its metadata.json, or a Checkpointer root")
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
    p.add_argument("--keep", type=positive_int, default=None, metavar="N",
                   help="also remove committed versions older than the newest N")
    p.add_argument("--dry-run", "-n", action="store_true", help="print what would be removed, remove nothing")
    p.add_argument("--compact", action="store_true",
                   help="first rewrite the kept versions so that none references a version beyond --keep "
                        "(incremental chains; the oldest kept becomes full), then remove the rest")
    p.add_argument("--grace", type=duration, default=duration(DEFAULT_GRACE), metavar="DURATION",
                   help=f"keep partial versions modified more recently than this (default {DEFAULT_GRACE}; 0 = none)")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("unlock", help="remove the writer lock of a root whose holder is known to be gone",
                       description="Remove ROOT/.hpcckpt-lock. A save takes over a stale lock by itself when the "
                                   "holder's process is gone on this host or was an earlier attempt of the same "
                                   "SLURM job; use this for a holder on another host that you know has ended. "
                                   "A holder running on this host and still holding the lock is refused, named, "
                                   "unless --force. Something hpcckpt cannot have written there (a FIFO, a "
                                   "symbolic link, a file too long, an empty directory) is removed; a directory "
                                   "that is not empty never is.")
    p.add_argument("root", metavar="ROOT", help="the Checkpointer root directory")
    p.add_argument("--force", action="store_true",
                   help="remove the lock even of a holder running on this host (only if you are sure it no "
                        "longer writes the root)")
    p.set_defaults(func=cmd_unlock)

    p = sub.add_parser("halt", help="ask the job writing a root to checkpoint and exit (the halt file)",
                       description="Write ROOT/.hpcckpt-halt. The job writing ROOT sees it at its next "
                                   "maybe_save/should_save decision (rank 0 looks), saves a final checkpoint on "
                                   "every rank, and should_exit() becomes True; the job removes the file when it "
                                   "closes, so the next run of the same command continues. No signal is needed: "
                                   "only the shared file system.")
    p.add_argument("root", metavar="ROOT", help="the Checkpointer root directory")
    p.add_argument("--reason", default=None, metavar="TEXT", help="why (the job prints it when it stops)")
    p.add_argument("--remove", action="store_true", help="withdraw a halt request the job has not honoured yet")
    p.set_defaults(func=cmd_halt)

    p = sub.add_parser("stats", help="where the time of a save went: per-rank phases, bandwidth, straggler",
                       description="Print the per-phase timings that every save stores with its version (min, "
                                   "median and max over the ranks, and the slowest rank), the aggregate write "
                                   "bandwidth and the straggler. PATH is a version, or a root (newest version).")
    p.add_argument("path", metavar="PATH", help="a checkpoint version directory or a Checkpointer root")
    p.add_argument("--plot", metavar="PNG", default=None, help="also draw a per-rank timeline (needs matplotlib)")
    p.set_defaults(func=cmd_stats)

    add_export_command(sub)
    add_subcommands(sub)
    return parser


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
    try:
        return int(args.func(args) or 0)
    except CheckpointError as exc:
        return _fail(str(exc))
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # `hpcckpt ls ROOT | head`: the reader had enough; stop quietly
            try:
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            return EXIT_OK
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
