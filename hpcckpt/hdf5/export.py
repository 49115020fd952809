"""``export``: one checkpoint version as one plain HDF5 file (docs/hdf5.md).

Every variable a global dataset of its global shape and dtype, every
replicated value an attribute of the root group; data moves one verified chunk
at a time, and the file is written as ``OUT.h5.tmp`` and renamed into place.
The HDF5 library writes a local file by name, so the output's names are made,
replaced and removed through POSIX storage.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from hpcckpt.core.encoding import encode_value
from hpcckpt.errors import CheckpointError
from hpcckpt.format.metadata import FORMAT_NAME
from hpcckpt.core.regions import volume
from hpcckpt.storage.posix import POSIX, fsync_path
from hpcckpt.hdf5.common import INT64_MAX, INT64_MIN, JSON_SUFFIX, LIBVER, RESERVED_PREFIX, h5_errors, h5py_module


# --------------------------------------------------------------------------- export

@dataclass
class ExportResult:
    """What an export wrote: the file, the bytes of array data, the datasets and root attributes."""

    path: str
    nbytes: int
    datasets: list[str] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)


def _view(checkpoint_path):
    """A view of the checkpoint at ``checkpoint_path``, in the storage its path names (s3://: a bucket)."""
    from hpcckpt.loading.view import CheckpointView
    from hpcckpt.storage.s3 import storage_for

    path = os.fspath(checkpoint_path)
    return CheckpointView(path, storage_for(path, POSIX))


def export_nbytes(checkpoint_path) -> int:
    """The bytes of array data an export of ``checkpoint_path`` moves (the total for a progress bar)."""
    with _view(checkpoint_path) as view:
        return sum(v.nbytes for v in view.variables.values())


def export(checkpoint_path, out_h5, progress=None, *, overwrite: bool = False) -> ExportResult:
    """Write the committed checkpoint at ``checkpoint_path`` as the plain HDF5 file ``out_h5``.

    ``progress(nbytes)`` is called after each piece written (e.g. a tqdm bar's
    ``update``; :func:`export_nbytes` gives its total).  An existing ``out_h5``
    is refused unless ``overwrite=True``; the new file appears only once
    complete (written as ``out_h5 + ".tmp"``, then renamed).
    """
    h5py = h5py_module()
    out = os.fspath(out_h5)
    if os.path.isdir(out):
        raise CheckpointError(f"{out!r} is a directory")
    if os.path.lexists(out) and not overwrite:
        raise CheckpointError(f"{out!r} already exists; pass overwrite=True (hpcckpt export --overwrite) to replace it")
    tmp = out + ".tmp"
    parent = os.path.dirname(os.path.abspath(out))
    try:
        POSIX.make_directories(parent)  # `hpcckpt export run/ckpt out/step300.h5` into a new directory
    except OSError as exc:
        raise CheckpointError(f"cannot create the directory {parent!r} for {out!r}: {exc.strerror or exc}") from None
    with _view(checkpoint_path) as view:
        attributes = _value_attributes(view.values, h5py)
        for name in view.variables:
            problem = _dataset_name_problem(name)
            if problem:
                raise CheckpointError(f"variable {name!r} cannot be an HDF5 dataset name: {problem}")
        if view.step is not None and not INT64_MIN <= view.step <= INT64_MAX:
            raise CheckpointError(f"step {view.step} of {view.path} does not fit the 64-bit attribute "
                                  f"{RESERVED_PREFIX}step")
        if os.path.lexists(tmp):  # the leftover of an interrupted export
            POSIX.remove_file(tmp)
        result = ExportResult(path=out, nbytes=0)
        try:
            with h5_errors(f"cannot create {tmp!r}", corrupt=False):
                f = h5py.File(tmp, "w", libver=LIBVER)
            try:
                with h5_errors(f"cannot write the attributes of {tmp!r}", corrupt=False):
                    f.attrs[RESERVED_PREFIX + "format"] = FORMAT_NAME
                    f.attrs[RESERVED_PREFIX + "format_version"] = np.int64(view.meta.format_version)
                    if view.step is not None:
                        f.attrs[RESERVED_PREFIX + "step"] = np.int64(view.step)
                    f.attrs[RESERVED_PREFIX + "created"] = str(view.meta.created)
                    for attr, value in attributes:
                        f.attrs[attr] = value
                        result.attributes.append(attr)
                for name in sorted(view.variables):
                    result.nbytes += _export_variable(f, view, view.variables[name], progress, h5py)
                    result.datasets.append(name)
            finally:
                with h5_errors(f"cannot finish writing {tmp!r}", corrupt=False):
                    f.close()
            fsync_path(tmp)
            POSIX.replace(tmp, out)
        except BaseException:
            with contextlib.suppress(OSError):
                POSIX.remove_file(tmp)
            raise
    with contextlib.suppress(OSError, CheckpointError):
        fsync_path(os.path.dirname(os.path.abspath(out)))
    return result


def _dataset_name_problem(name: str) -> str | None:
    """Why HDF5 would not store a dataset under exactly ``name`` (None when it would).

    HDF5 names are C strings, so a NUL would cut the name; an empty component
    (a leading, trailing or doubled ``/``) or a ``.`` component would be
    normalised away, so the dataset would not be found under its own name.
    """
    if "\0" in name:
        return "it holds a NUL character"
    if name.startswith(RESERVED_PREFIX):
        return f"names starting with {RESERVED_PREFIX!r} are reserved in an HDF5 export"
    if any(part in ("", ".") for part in name.split("/")):
        return "HDF5 would store it under another path (empty or '.' components)"
    return None


def _export_variable(f, view, var, progress, h5py) -> int:
    """Create the dataset of ``var`` and copy it chunk by chunk; the bytes written."""
    name = var.name
    try:
        h5py.h5t.py_create(var.dtype, logical=True)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"variable {name!r}: dtype {var.dtype} has no HDF5 equivalent ({exc})") from None
    with h5_errors(f"cannot create the dataset of {name!r}", corrupt=False):
        if name in f:
            raise CheckpointError(f"variable {name!r} clashes with another variable's HDF5 group")
        dset = f.create_dataset(name, shape=var.shape, dtype=var.dtype)
        dset.attrs[RESERVED_PREFIX + "kind"] = var.kind
    written = 0
    order = np.lexsort(var.chunks.start.T[::-1]) if var.shape else np.arange(len(var.chunks))
    stops = var.chunks.stop  # a computed column: once, not per chunk
    for k in order.tolist():
        start = tuple(var.chunks.start[k].tolist())
        stop = tuple(stops[k].tolist())
        if var.shape and volume(b - a for a, b in zip(start, stop)) == 0:
            continue
        sel = tuple(slice(a, b) for a, b in zip(start, stop))
        data = view.read(name, sel if sel else None)  # exactly one stored chunk: read in place and verified
        with h5_errors(f"cannot write the dataset of {name!r}", corrupt=False):
            if sel:
                dset.write_direct(np.ascontiguousarray(data), dest_sel=sel)
            else:
                dset[()] = data
        written += data.nbytes
        if progress is not None:
            progress(data.nbytes)
    return written


def _value_attributes(values: dict, h5py) -> list[tuple[str, object]]:
    """(attribute name, attribute value) for each replicated value; refuses names that would clash."""
    out, taken = [], {}
    for name in sorted(values):
        if name.startswith(RESERVED_PREFIX):
            raise CheckpointError(f"replicated value {name!r}: names starting with {RESERVED_PREFIX!r} are "
                                  "reserved in an HDF5 export")
        if "\0" in name or not name:
            raise CheckpointError(f"replicated value {name!r} cannot be an HDF5 attribute name "
                                  f"({'it holds a NUL character' if name else 'it is empty'})")
        plain = _plain_attribute(values[name], h5py)
        if plain is not None:
            attr, value = name, plain[0]
        else:
            attr = name + JSON_SUFFIX
            value = json.dumps(encode_value(values[name], repr(name)), allow_nan=False, separators=(",", ":"))
        if attr in taken:
            raise CheckpointError(f"replicated values {taken[attr]!r} and {name!r} would both be the HDF5 "
                                  f"attribute {attr!r}")
        taken[attr] = name
        out.append((attr, value))
    return out


def _plain_attribute(value, h5py):
    """``(attribute value,)`` when ``value`` is a plain HDF5 attribute, else None (stored as JSON)."""
    if isinstance(value, (bool, np.bool_)):
        return (np.bool_(value),)
    if isinstance(value, int):
        return (np.int64(value),) if INT64_MIN <= value <= INT64_MAX else None
    if isinstance(value, float):
        return (np.float64(value),)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return None
        return (str(value),) if "\0" not in value else None
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return None  # h5py would give it back as a scalar: JSON keeps it an array
    if isinstance(value, (np.generic, np.ndarray)):
        if value.dtype.kind in "OUSV" or value.dtype.hasobject:
            return None  # text arrays, bytes and opaque data: JSON keeps them exact
        try:
            h5py.h5t.py_create(value.dtype, logical=True)
        except (TypeError, ValueError):
            return None
        return (value,)
    return None
