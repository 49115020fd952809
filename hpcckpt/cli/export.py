"""``hpcckpt export``: one plain HDF5 file of a version (hpcckpt.hdf5 does the work)."""

from __future__ import annotations

from hpcckpt.cli.common import EXIT_OK, add_progress_flags, human_bytes, progress_bar, resolve_version, show_progress


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
    from hpcckpt.hdf5 import export, export_nbytes

    path, note = resolve_version(args.path)
    with progress_bar(show_progress(args, True), export_nbytes(path), "export") as bar:
        result = export(path, args.out, progress=bar.update, overwrite=args.overwrite)
    print(f"OK: {path} -> {result.path}: {len(result.datasets)} datasets, {len(result.attributes)} attributes, "
          f"{human_bytes(result.nbytes)}" + (f" ({note})" if note else ""))
    return EXIT_OK
