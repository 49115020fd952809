"""HDF5 interop: export a checkpoint to one plain HDF5 file, and restart from a plain HDF5 file.

``export(checkpoint, "out.h5")`` writes every variable as a global dataset of
its global shape and dtype (structured dtypes become HDF5 compound types,
Ragged tables a dataset with one row per record) and every replicated value as
an attribute of the root group, so that plain h5py, h5dump or any HDF5 reader
can use it.  Data moves one stored chunk at a time (each chunk verified against
its checksum), so memory stays bounded by the largest chunk however large the
variable.  The file is written as ``out.h5.tmp`` and renamed into place.

``load_hdf5(state, "input.h5", comm)`` (what ``hpcckpt.load`` calls for an HDF5
file) fills a template from a file hpcckpt did not write: the Blocks in place
from the datasets of the same names, each rank reading only its own hyperslab
with serial h5py (every rank opens the file read-only), Ragged rows split as
in a checkpoint load, replicated values from root attributes.  The template
rules and errors are those of a checkpoint load (loading/load.py), under the same
``agree``: one rank's failure is every rank's CheckpointError.

Attribute mapping (docs/hdf5.md): bool, int (64-bit), float, str, numpy scalars
and numpy arrays of at least one axis are attributes of their own name; any
other value (None, lists, dicts, tuples, 0-d arrays, strings holding NUL,
dtypes HDF5 cannot hold) is the attribute ``NAME.json``, a JSON string in the
encoding of docs/format.md.  Root attributes named ``hpcckpt.*`` describe the
export (format, format_version, step, created) and are never values.

The work is split in common.py, export.py and load.py; this package exports
their public names.  h5py is an optional dependency (``pip install hpcckpt[hdf5]``); it is imported
only when a function here needs it.
"""

from __future__ import annotations

from hpcckpt.hdf5.common import JSON_SUFFIX, LIBVER, RESERVED_PREFIX, SIGNATURE, SLAB_BYTES, is_hdf5
from hpcckpt.hdf5.export import ExportResult, export, export_nbytes
from hpcckpt.hdf5.load import MAX_SOFT_LINKS, load_hdf5

__all__ = ["ExportResult", "JSON_SUFFIX", "LIBVER", "MAX_SOFT_LINKS", "RESERVED_PREFIX", "SIGNATURE", "SLAB_BYTES",
           "export", "export_nbytes", "is_hdf5", "load_hdf5"]
