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
rules and errors are those of a checkpoint load (loading.py), under the same
``agree``: one rank's failure is every rank's CheckpointError.

Attribute mapping (docs/hdf5.md): bool, int (64-bit), float, str, numpy scalars
and numpy arrays of at least one axis are attributes of their own name; any
other value (None, lists, dicts, tuples, 0-d arrays, strings holding NUL,
dtypes HDF5 cannot hold) is the attribute ``NAME.json``, a JSON string in the
encoding of docs/format.md.  Root attributes named ``hpcckpt.*`` describe the
export (format, format_version, step, created) and are never values.

h5py is an optional dependency (``pip install hpcckpt[hdf5]``); it is imported
only when a function here needs it.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field, replace

import numpy as np

from .collective import agree, on_root, resolve_comm
from .encoding import decode_value, encode_value
from .errors import CheckpointError, CorruptCheckpointError, TemplateMismatchError
from .loading import check_template, plan_reads
from .metadata import FORMAT_NAME, FORMAT_VERSION
from .regions import volume
from .reader import allocate
from .state import Block, Ragged, split_state
from .storage.posix import open_regular

#: The first 8 bytes of an HDF5 superblock; found at offset 0, 512, 1024, 2048... (after a user block).
SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Suffix of the root attribute that holds a replicated value as JSON text.
JSON_SUFFIX = ".json"
#: Prefix of the root attributes that describe an export; no replicated value may use it.
RESERVED_PREFIX = "hpcckpt."
#: Library format bounds of exported files: dense attribute storage (attributes over 64 KiB,
#: replicated arrays may reach 1 MiB) while staying readable by HDF5 1.10 (h5dump of Debian 12).
LIBVER = ("v108", "v110")
#: Largest temporary buffer when a hyperslab must be read into a non-contiguous block.
SLAB_BYTES = 64 << 20
#: The range of the 64-bit integer attributes (``hpcckpt.step``, plain int values).
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _h5py():
    try:
        import h5py
    except ImportError:
        raise CheckpointError("HDF5 support needs h5py: pip install 'hpcckpt[hdf5]' (or h5py>=3.8)") from None
    return h5py


def is_hdf5(path) -> bool:
    """True when ``path`` is a regular file with the HDF5 signature (at offset 0 or after a user block)."""
    try:
        fd = open_regular(os.fspath(path))  # a FIFO must not block the check
    except (OSError, CheckpointError, ValueError, TypeError):
        return False
    try:
        size = os.fstat(fd).st_size
        offset = 0
        while offset + len(SIGNATURE) <= size:
            if os.pread(fd, len(SIGNATURE), offset) == SIGNATURE:
                return True
            offset = 512 if offset == 0 else offset * 2
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def _h5_errors(what: str, corrupt: bool = True):
    """Turn h5py's exceptions into CheckpointError (CorruptCheckpointError for unreadable content)."""
    try:
        yield
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"{what}: no such file") from None
    except PermissionError as exc:
        raise CheckpointError(f"{what}: {exc.strerror or exc}") from None
    except (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError) as exc:
        cls = CorruptCheckpointError if corrupt else CheckpointError
        raise cls(f"{what}: {' '.join(str(exc).split()) or type(exc).__name__}") from None


def _open_read(path: str):
    """Open an HDF5 file read-only with serial h5py (file locking where the file system supports it)."""
    h5py = _h5py()
    if not is_hdf5(path):
        if not os.path.exists(path):
            raise CheckpointError(f"{path!r}: no such file")
        if not os.path.isfile(path):
            raise CheckpointError(f"{path!r} is not a file")
        if not os.access(path, os.R_OK):
            raise CheckpointError(f"{path!r}: permission denied")
        raise CorruptCheckpointError(f"{path!r} is not an HDF5 file (no HDF5 signature)")
    with _h5_errors(f"cannot open {path!r} as HDF5"):
        try:
            return h5py.File(path, "r", locking="best-effort")
        except ValueError:  # an HDF5 older than 1.12.1 has no best-effort locking
            return h5py.File(path, "r")


# --------------------------------------------------------------------------- export

@dataclass
class ExportResult:
    """What an export wrote: the file, the bytes of array data, the datasets and root attributes."""

    path: str
    nbytes: int
    datasets: list[str] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)


def export_nbytes(checkpoint_path) -> int:
    """The bytes of array data an export of ``checkpoint_path`` moves (the total for a progress bar)."""
    from .view import CheckpointView

    with CheckpointView(os.fspath(checkpoint_path)) as view:
        return sum(v.nbytes for v in view.variables.values())


def export(checkpoint_path, out_h5, progress=None, *, overwrite: bool = False) -> ExportResult:
    """Write the committed checkpoint at ``checkpoint_path`` as the plain HDF5 file ``out_h5``.

    ``progress(nbytes)`` is called after each piece written (e.g. a tqdm bar's
    ``update``; :func:`export_nbytes` gives its total).  An existing ``out_h5``
    is refused unless ``overwrite=True``; the new file appears only once
    complete (written as ``out_h5 + ".tmp"``, then renamed).
    """
    from .view import CheckpointView

    h5py = _h5py()
    out = os.fspath(out_h5)
    if os.path.isdir(out):
        raise CheckpointError(f"{out!r} is a directory")
    if os.path.lexists(out) and not overwrite:
        raise CheckpointError(f"{out!r} already exists; pass overwrite=True (hpcckpt export --overwrite) to replace it")
    tmp = out + ".tmp"
    with CheckpointView(os.fspath(checkpoint_path)) as view:
        attributes = _value_attributes(view.values, h5py)
        for name in view.variables:
            problem = _dataset_name_problem(name)
            if problem:
                raise CheckpointError(f"variable {name!r} cannot be an HDF5 dataset name: {problem}")
        if view.step is not None and not _INT64_MIN <= view.step <= _INT64_MAX:
            raise CheckpointError(f"step {view.step} of {view.path} does not fit the 64-bit attribute "
                                  f"{RESERVED_PREFIX}step")
        if os.path.lexists(tmp):  # the leftover of an interrupted export
            os.remove(tmp)
        result = ExportResult(path=out, nbytes=0)
        try:
            with _h5_errors(f"cannot create {tmp!r}", corrupt=False):
                f = h5py.File(tmp, "w", libver=LIBVER)
            try:
                with _h5_errors(f"cannot write the attributes of {tmp!r}", corrupt=False):
                    f.attrs[RESERVED_PREFIX + "format"] = FORMAT_NAME
                    f.attrs[RESERVED_PREFIX + "format_version"] = np.int64(FORMAT_VERSION)
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
                with _h5_errors(f"cannot finish writing {tmp!r}", corrupt=False):
                    f.close()
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, out)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
    with contextlib.suppress(OSError):
        fd = os.open(os.path.dirname(os.path.abspath(out)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
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
    with _h5_errors(f"cannot create the dataset of {name!r}", corrupt=False):
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
        with _h5_errors(f"cannot write the dataset of {name!r}", corrupt=False):
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
        return (np.int64(value),) if _INT64_MIN <= value <= _INT64_MAX else None
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


# --------------------------------------------------------------------------- import


@dataclass(frozen=True)
class _Dataset:
    """What a template is checked against: the loading.py Variable fields a load uses."""

    name: str
    shape: tuple
    dtype: np.dtype
    kind: str = "block"
    #: the path of the dataset through hard links only, which every rank opens (None: ``name`` itself)
    source: str | None = None


@dataclass
class _Index:
    """The HDF5 file as loading.check_template sees a checkpoint: datasets and value names."""

    variables: dict = field(default_factory=dict)  # name -> _Dataset
    values: dict = field(default_factory=dict)  # value name -> attribute name
    unusable: dict = field(default_factory=dict)  # dataset name -> why it cannot be loaded


def load_hdf5(state, path, comm=None, *, strict: bool = True, allow_external: bool = False) -> dict:
    """Collectively fill the Blocks of ``state`` in place from the plain HDF5 file ``path``.

    Blocks and Ragged tables come from the datasets of the same name (a name may
    be a path such as ``"fields/u"``), replicated values from root attributes
    (``NAME`` or ``NAME.json``).  Returns the state with Ragged rows and
    replicated values filled in, as :func:`hpcckpt.load` does.  ``strict=False``
    allows the file to hold datasets and attributes the template does not name
    (usual for files written elsewhere).

    Only data inside ``path`` is read: a dataset reached through an external
    link, or whose data lies in external files (external storage, a virtual
    dataset mapping another file) is refused naming it, as a crafted file could
    otherwise hand over any file the process can read.  ``allow_external=True``
    lets HDF5 follow them (for trusted files).
    """
    comm = resolve_comm(comm)
    path = os.fspath(path)
    what = f"load of {path!r}"
    index = agree(comm, what, lambda: on_root(comm, lambda: _read_index(path, state, allow_external)))
    index = comm.bcast(index, root=0)
    local = agree(comm, what, lambda: _check(state, index, strict))
    requests = comm.gather(local["requests"], root=0)
    ranges = agree(comm, what, lambda: on_root(comm, lambda: plan_reads(requests, index)))
    rows = comm.scatter(ranges, root=0)
    loaded, values = agree(comm, what, lambda: _read(path, local["index"], local, rows))
    out = {}
    for name, value in state.items():
        out[name] = value if isinstance(value, Block) else loaded.get(name, values.get(name))
    return out


def _read_index(path: str, state, allow_external: bool) -> _Index:
    """Rank 0: the datasets (name, shape, dtype) and the value attributes of the file.

    The walk follows hard links only; a name the template asks for that it did
    not reach is looked up through soft links (and, with ``allow_external``,
    external ones).  Without ``allow_external``, a dataset whose data would
    come from another file is listed as unusable.
    """
    distributed, replicated = split_state(state)
    h5py = _h5py()
    index = _Index()
    with _open_read(path) as f, _h5_errors(f"{path!r}: cannot read the HDF5 structure"):
        found = {}

        def visit(name, obj):  # must return None: anything else stops the walk
            if isinstance(obj, h5py.Dataset):
                found[name] = obj

        f.visititems(visit)
        sources = {}
        for name in list(distributed) + list(replicated):  # links that the walk does not name
            if name in found:
                continue
            try:
                target = name if allow_external else _hard_path(f, name, h5py)
            except _Outside as exc:
                index.unusable[name] = str(exc)
                continue
            with contextlib.suppress(KeyError, OSError, ValueError, TypeError):
                obj = f.get(target) if target is not None else None
                if isinstance(obj, h5py.Dataset):
                    found[name], sources[name] = obj, target
        for name, ds in found.items():
            outside = None if allow_external else _outside_storage(f, ds, h5py)
            if outside is not None:
                index.unusable[name] = outside
            else:
                _index_dataset(index, name, ds, h5py, sources.get(name))
        names = list(f.attrs)
        for attr in names:
            if attr.startswith(RESERVED_PREFIX):
                continue
            base = attr[: -len(JSON_SUFFIX)] if attr.endswith(JSON_SUFFIX) else attr
            if base == attr or base not in names:  # NAME wins over NAME.json
                index.values[base] = attr
        for name in list(index.values):
            if name in index.variables:  # a dataset and an attribute of one name: the dataset is the variable
                del index.values[name]
    return index


class _Outside(Exception):
    """A link or storage that leads out of the HDF5 file; its text says which (internal to this module)."""


#: Most soft links followed to resolve one name (HDF5's own default limit, H5L_NUM_LINKS).
MAX_SOFT_LINKS = 16


def _hard_path(f, name: str, h5py, budget: list | None = None) -> str | None:
    """The path of the object ``name`` names in ``f`` through hard links only (None when there is none).

    Soft links are resolved here, at most :data:`MAX_SOFT_LINKS` per name (a
    cycle ends there); an external or user-defined link raises _Outside
    without being followed, since following it opens another file.
    """
    budget = [MAX_SOFT_LINKS] if budget is None else budget
    path = ""
    for part in name.split("/"):
        if part in ("", "."):
            continue
        group = f[path or "/"]
        link = group.get(part, getlink=True) if isinstance(group, h5py.Group) else None
        if link is None:
            return None
        if isinstance(link, h5py.SoftLink):
            budget[0] -= 1
            if budget[0] < 0:
                raise _Outside(f"resolving it follows more than {MAX_SOFT_LINKS} soft links")
            target = link.path if link.path.startswith("/") else f"{path}/{link.path}"
            path = _hard_path(f, target, h5py, budget)
            if path is None:
                return None
        elif isinstance(link, h5py.HardLink):
            path = f"{path}/{part}"
        elif isinstance(link, h5py.ExternalLink):
            raise _Outside(f"it is reached through an external link to {link.filename!r} "
                           f"({_EXTERNAL_HINT})")
        else:
            raise _Outside(f"it is reached through a user-defined link ({_EXTERNAL_HINT})")
    return path or "/"


_EXTERNAL_HINT = "load_hdf5(..., allow_external=True) follows it"


def _outside_storage(f, ds, h5py) -> str | None:
    """Why some data of dataset ``ds`` would be read from another file, or None when it is all inside ``f``.

    External storage (raw data in other files) and virtual datasets mapping
    other files count; a virtual dataset mapping datasets of ``f`` itself
    (source file ``"."``) is fine when those are plain datasets reached by
    hard and soft links.
    """
    if ds.external:
        return f"its data is stored in the external file {ds.external[0][0]!r} ({_EXTERNAL_HINT})"
    if not ds.is_virtual:
        return None
    for src in ds.virtual_sources():
        if src.file_name != ".":
            return f"it is a virtual dataset mapping {src.file_name!r} ({_EXTERNAL_HINT})"
        try:
            hard = _hard_path(f, src.dset_name, h5py)
        except _Outside as exc:
            return f"it is a virtual dataset mapping {src.dset_name!r}, where {exc}"
        source = f.get(hard) if hard is not None else None
        if isinstance(source, h5py.Dataset) and (source.external or source.is_virtual):
            return f"it is a virtual dataset mapping {src.dset_name!r}, itself external or virtual " \
                   f"({_EXTERNAL_HINT})"
    return None


def _index_dataset(index: _Index, name: str, ds, h5py, source: str | None = None) -> None:
    try:
        shape, dtype = ds.shape, ds.dtype
    except Exception as exc:  # noqa: BLE001 - h5py raises many types for types numpy cannot map
        index.unusable[name] = f"its HDF5 type has no numpy equivalent ({exc})"
        return
    if shape is None:
        index.unusable[name] = "it has a null dataspace (no data)"
    elif dtype.hasobject:
        index.unusable[name] = f"it holds variable-length data ({h5py.check_dtype(vlen=dtype) or 'object'})"
    else:
        index.variables[name] = _Dataset(name, tuple(int(s) for s in shape), dtype if dtype.fields is not None
                                         else np.dtype(dtype.str),  # .str drops h5py's enum metadata
                                         source=source)


def _byte_order_only(a: np.dtype, b: np.dtype) -> bool:
    """Plain numeric dtypes that differ in byte order alone (HDF5 converts between them on read)."""
    simple = all(d.fields is None and d.subdtype is None and d.kind in "biufc" for d in (a, b))
    return simple and a != b and a.newbyteorder("<") == b.newbyteorder("<")


def _check(state, index: _Index, strict: bool) -> dict:
    """loading.py's template checks, except that a template may ask for the other byte order."""
    distributed, replicated = split_state(state)
    for name in sorted(set(distributed) | set(replicated)):
        if name in index.unusable and name not in index.values:
            raise TemplateMismatchError(f"variable {name!r}: the HDF5 dataset cannot be loaded: "
                                        f"{index.unusable[name]}")
    variables = dict(index.variables)
    for name, value in distributed.items():
        want = getattr(value.local, "dtype", None) if isinstance(value.local, np.ndarray) else None
        if name in variables and want is not None and _byte_order_only(want, variables[name].dtype):
            variables[name] = replace(variables[name], dtype=want)
    mine = _Index(variables, index.values, index.unusable)
    local = check_template(state, mine, strict)
    local["index"] = mine
    return local


def _read(path: str, index: _Index, local: dict, rows: dict) -> tuple[dict, dict]:
    """Each rank: its hyperslab of every distributed variable, and the replicated values."""
    loaded, values = {}, {}
    with _open_read(path) as f:
        for name, value in sorted(local["distributed"].items()):
            var = index.variables[name]
            with _h5_errors(f"{path!r}: cannot read dataset {name!r}"):
                ds = f[var.source or name]
                if isinstance(value, Block):
                    _, start, stop = local["requests"][name]
                    _read_box(ds, start, stop, value.local)
                else:
                    lo, hi = rows[name]
                    out = allocate((hi - lo,) + var.shape[1:], var.dtype, name)
                    _read_box(ds, (lo,) + (0,) * (len(var.shape) - 1), (hi,) + var.shape[1:], out)
                    loaded[name] = Ragged(out)
        for name in local["replicated"]:
            values[name] = _read_value(f, name, index.values[name], path)
    return loaded, values


def _read_box(ds, start, stop, out: np.ndarray) -> None:
    """Fill ``out`` with the hyperslab ``[start, stop)`` of ``ds``: straight into it when it is contiguous."""
    if not start:
        out[...] = ds[()]
        return
    if volume(b - a for a, b in zip(start, stop)) == 0:
        return
    sel = tuple(slice(a, b) for a, b in zip(start, stop))
    if out.flags.c_contiguous and out.flags.writeable and out.flags.aligned:
        ds.read_direct(out, source_sel=sel)
        return
    row_bytes = max(1, out.nbytes // max(1, out.shape[0]))
    step = max(1, SLAB_BYTES // row_bytes)
    for lo in range(0, out.shape[0], step):
        hi = min(out.shape[0], lo + step)
        out[lo:hi] = ds[(slice(start[0] + lo, start[0] + hi),) + sel[1:]]


def _read_value(f, name: str, attr: str, path: str):
    with _h5_errors(f"{path!r}: cannot read attribute {attr!r}"):
        raw = f.attrs[attr]
    if attr != name:  # NAME.json
        if isinstance(raw, (bytes, np.bytes_)):
            raw = bytes(raw).decode("utf-8", "replace")
        if not isinstance(raw, str):
            raise CorruptCheckpointError(f"{path!r}: attribute {attr!r} should be a JSON string, "
                                         f"got {type(raw).__name__}")
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise CorruptCheckpointError(f"{path!r}: attribute {attr!r} is not valid JSON ({exc})") from None
        return decode_value(doc, repr(name))
    return _from_attribute(raw)


def _from_attribute(raw):
    """An attribute as a replicated value: Python scalars for 64-bit/bool numbers and text, else numpy."""
    h5py = _h5py()
    if isinstance(raw, h5py.Empty):
        return None
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (bytes, np.bytes_)):
        return bytes(raw).decode("utf-8", "replace")
    if isinstance(raw, np.generic):
        if raw.dtype in (np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.bool_)):
            return raw.item()
        return raw
    if isinstance(raw, np.ndarray) and raw.dtype.hasobject:  # variable-length strings
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in raw.ravel().tolist()]
    return raw
