"""``load_hdf5``: fill a template from a plain HDF5 file hpcckpt did not write (what ``hpcckpt.load`` calls
for an HDF5 file); each rank reads its own hyperslab with serial h5py, under the rules of a checkpoint load."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field, replace

import numpy as np

from hpcckpt.mpi.collective import agree, attempt, bcast_checked, resolve_comm, root_phase_scattered
from hpcckpt.core.encoding import decode_value
from hpcckpt.errors import CorruptCheckpointError, TemplateMismatchError
from hpcckpt.loading.load import check_template, plan_reads
from hpcckpt.core.regions import volume
from hpcckpt.loading.reader import allocate
from hpcckpt.state import Block, Ragged, split_state
from hpcckpt.stateful import deliver, flatten, materialize, unflatten
from hpcckpt.hdf5.common import JSON_SUFFIX, RESERVED_PREFIX, SLAB_BYTES, h5_errors, h5py_module, open_read


# --------------------------------------------------------------------------- import


@dataclass(frozen=True)
class _Dataset:
    """What a template is checked against: the loading/load.py Variable fields a load uses."""

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


def load_hdf5(state, path, comm=None, *, strict: bool = True, allow_external: bool = False,
              cast: bool = False) -> dict:
    """Collectively fill the Blocks of ``state`` in place from the plain HDF5 file ``path``.

    Blocks and Ragged tables come from the datasets of the same name (a name may
    be a path such as ``"fields/u"``, and a nested template ``{"fields": {"u":
    Block}}`` names the same dataset), replicated values from root attributes
    (``NAME`` or ``NAME.json``).  Returns the state with Ragged rows and
    replicated values filled in, nested as the template, as :func:`hpcckpt.load`
    does (a Stateful template gets ``load_state_dict`` with it).  ``strict=False``
    allows the file to hold datasets and attributes the template does not name
    (usual for files written elsewhere).  ``cast=True``: a template dtype that
    differs from the dataset's is filled by casting, under the rule of
    :func:`hpcckpt.load`.

    Only data inside ``path`` is read: a dataset reached through an external
    link, or whose data lies in external files (external storage, a virtual
    dataset mapping another file) is refused naming it, as a crafted file could
    otherwise hand over any file the process can read.  ``allow_external=True``
    lets HDF5 follow them (for trusted files).
    """
    comm = resolve_comm(comm)
    path = os.fspath(path)
    what = f"load of {path!r}"
    tree, flat = agree(comm, what, lambda: _template(state))
    index = bcast_checked(comm, what, lambda: _read_index(path, flat, allow_external))
    local, failure = attempt(lambda: _check(flat, index, strict, cast))
    _, rows = root_phase_scattered(comm, what, failure, None if failure else local["requests"],
                                   lambda requests: (None, plan_reads(requests, index)))
    loaded, values = agree(comm, what, lambda: _read(path, local["index"], local, rows))
    out = {}
    for name, value in flat.items():
        out[name] = value if isinstance(value, Block) else loaded.get(name, values.get(name))
    restored = unflatten(out, tree)
    deliver(state, restored)  # load_state_dict of Stateful objects, after every collective of the load
    return restored


def _template(state) -> tuple[dict, dict]:
    """The template read now, as a checkpoint load reads it (hpcckpt.stateful): its tree and its flat names.

    Nested dicts name datasets by path (``{"grid": {"u": Block}}`` is ``/grid/u``, what an export of the
    checkpoint the same template saved holds); Stateful objects, callables and getters are resolved.
    """
    tree = materialize(state)
    return tree, flatten(tree)


def _read_index(path: str, state, allow_external: bool) -> _Index:
    """Rank 0: the datasets (name, shape, dtype) and the value attributes of the file.

    The walk follows hard links only; a name the template asks for that it did
    not reach is looked up through soft links (and, with ``allow_external``,
    external ones).  Without ``allow_external``, a dataset whose data would
    come from another file is listed as unusable.
    """
    distributed, replicated = split_state(state)
    h5py = h5py_module()
    index = _Index()
    with open_read(path) as f, h5_errors(f"{path!r}: cannot read the HDF5 structure"):
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


def _check(state, index: _Index, strict: bool, cast: bool = False) -> dict:
    """loading/load.py's template checks, except that a template may ask for the other byte order."""
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
    local = check_template(state, mine, strict, cast)
    local["index"] = mine
    return local


def _read(path: str, index: _Index, local: dict, rows: dict) -> tuple[dict, dict]:
    """Each rank: its hyperslab of every distributed variable, and the replicated values."""
    loaded, values = {}, {}
    with open_read(path) as f:
        for name, value in sorted(local["distributed"].items()):
            var = index.variables[name]
            with h5_errors(f"{path!r}: cannot read dataset {name!r}"):
                ds = f[var.source or name]
                if isinstance(value, Block):
                    _, start, stop = local["requests"][name]
                    _read_box(ds, start, stop, value.local)
                else:
                    lo, hi = rows[name]
                    out = allocate((hi - lo,) + var.shape[1:], local["dtypes"].get(name, var.dtype), name)
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
    with h5_errors(f"{path!r}: cannot read attribute {attr!r}"):
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
    h5py = h5py_module()
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
