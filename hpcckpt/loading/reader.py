"""Reading stored chunks into any global region: the core of load, ``open`` and ``verify``.

For a target box, the reader finds the overlapping chunks (the chunk index), checks
that they cover the box exactly once, and fetches each chunk:

* a chunk that lies wholly inside the target and maps onto contiguous target
  memory is read straight into the caller's buffer (no copy) and checksummed
  there; runs of such chunks stored back to back in one file and adjacent in
  the target are read in one pass (:func:`coalesce`), each chunk still
  checksummed on its own slice (an incremental version's chunks are many and
  small, so their per-chunk cost is what a chain restore pays);
* any other chunk is read into one reused scratch buffer, checksummed, and the
  overlapping part copied out.

So a load on the same decomposition moves each byte once, and a reshard load
reads at most one chunk per boundary beyond what it needs.  A CuPy target gets
each chunk's verified stored bytes on its device, where they are decoded
(codecs/gpu.py).  Every chunk is verified on every read; a truncated file or a bad checksum raises
CorruptCheckpointError naming the file.
"""

from __future__ import annotations


import numpy as np

from hpcckpt.core.arrays import byte_view
from hpcckpt.core.checksum import hexdigest, new_hasher
from hpcckpt.core.devices import array_module, is_device_array, pinned_empty
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import Metadata, Variable
from hpcckpt.core.regions import tiling_problem, volume
from hpcckpt.storage import POSIX, Storage


def allocate(shape, dtype, name: str) -> np.ndarray:
    """``np.empty(shape, dtype)`` for a region of variable ``name``, or a CheckpointError if it cannot exist here.

    Shapes come from metadata (or an HDF5 file) that may be crafted: a 10**18
    element variable must be a clear error naming it, not a MemoryError (or
    numpy's ValueError for sizes beyond the address space).
    """
    try:
        return np.empty(shape, dtype)
    except (MemoryError, ValueError):
        nbytes = np.dtype(dtype).itemsize
        for n in shape:
            nbytes *= int(n)
        raise CheckpointError(f"variable {name!r}: cannot allocate {nbytes} bytes (shape {tuple(shape)}, dtype "
                              f"{np.dtype(dtype)}) in this process") from None


def direct_targets(starts: np.ndarray, counts: np.ndarray, box_start, shape, itemsize: int):
    """Which chunks can be read straight into a C-ordered target, and where: ``(mask, byte offsets)``.

    ``starts``/``counts``: ``(n, ndim)`` global boxes of chunks; the target is
    the box at ``box_start`` of extent ``shape``.  A chunk qualifies when it lies
    wholly inside the box and its elements form one contiguous run of the
    target: every axis after its first one longer than 1 spans the whole box.
    The offset (meaningful where the mask is set) is its first byte's in the target.
    """
    shape_arr = np.asarray(shape, np.int64)
    rel = starts - np.asarray(box_start, np.int64)
    inside = np.all((rel >= 0) & (rel + counts <= shape_arr), axis=1)
    longer = counts > 1
    after_first_long = np.cumsum(longer, axis=1) > longer
    contiguous = np.all(~after_first_long | (counts == shape_arr), axis=1)
    strides = np.append(np.cumprod(shape_arr[:0:-1])[::-1], 1) * itemsize
    return inside & contiguous, rel @ strides


def coalesce(file: np.ndarray, offset: np.ndarray, nbytes: np.ndarray, target: np.ndarray) -> list[tuple[int, int]]:
    """Runs ``[a, b)`` of chunks to read in one pass: each follows the previous in its file and in the target.

    The chunks are given in target order (``target``: ascending byte offsets).
    Chunk ``i + 1`` joins chunk ``i``'s run when it is in the same file, starts
    where chunk ``i`` ends there, and lands where chunk ``i`` ends in the target.
    """
    n = len(file)
    if n == 0:
        return []
    joins = ((file[1:] == file[:-1]) & (offset[1:] == offset[:-1] + nbytes[:-1])
             & (target[1:] == target[:-1] + nbytes[:-1]))
    cuts = np.flatnonzero(~joins) + 1
    bounds = [0, *cuts.tolist(), n]
    return list(zip(bounds[:-1], bounds[1:]))


def _truncated(path: str, var: Variable, offset: int, nbytes: int, size: int) -> CorruptCheckpointError:
    """The error for a chunk that runs past the end of its file."""
    return CorruptCheckpointError(f"{path} is truncated: a chunk of {var.name!r} needs bytes "
                                  f"{offset}..{offset + nbytes}, the file has {size}")


def _bad_checksum(path: str, var: Variable, offset: int, stored: str, read: str) -> CorruptCheckpointError:
    """The error for a chunk whose bytes do not match its stored checksum."""
    return CorruptCheckpointError(f"{path}: the chunk of {var.name!r} at offset {offset} fails its checksum "
                                  f"(stored {stored}, read {read})")


class ChunkReader:
    """Reads and verifies chunks of one version; keeps its files open until :meth:`close`."""

    def __init__(self, directory: str, meta: Metadata, storage: Storage = POSIX):
        self.directory = directory
        self.meta = meta
        self.storage = storage
        self._files: dict[int, tuple] = {}  # index -> (storage handle, size, path)
        self._roots: dict = {}  # version name (None: this one) -> its real directory, resolved once
        self._scratch = np.empty(0, np.uint8)
        self._pinned_scratch = np.empty(0, np.uint8)  # replaced by page-locked memory when a GPU target is read
        self._decoded = np.empty(0, np.uint8)  # decoded chunks that are copied out partially
        self._codecs: dict = {}  # variable name -> codec object (compressed variables only)

    def close(self) -> None:
        for handle, _, _ in self._files.values():
            self.storage.close_read(handle)
        self._files.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _file(self, index: int) -> tuple[int, int, str]:
        if index not in self._files:
            path = self.storage.resolve(self.directory, self.meta.files[index], self._roots)
            try:
                handle, size = self.storage.open_read(path)  # POSIX: never a FIFO or device in its place
            except FileNotFoundError:
                raise CorruptCheckpointError(f"data file {path} is missing") from None
            self._files[index] = (handle, size, path)
        return self._files[index]

    def _fetch(self, var: Variable, k: int, into: np.ndarray | None) -> np.ndarray:
        """Read chunk ``k`` of ``var`` into ``into`` (a contiguous target) or the scratch buffer; verify it."""
        coded = var.codec.get("id") != "none"
        buf, path = self._read_verified(var, k, None if into is None or coded else byte_view(into))
        if coded:  # the checksum covers the stored (compressed) bytes; decode into the target or scratch
            return self._decode(var, k, buf, into, path)
        return buf

    def _read_verified(self, var: Variable, k: int, buf: np.ndarray | None, pinned: bool = False):
        """(stored bytes, file path) of chunk ``k``, read into ``buf`` or a reused scratch buffer and checksummed.

        ``pinned``: the scratch buffer is page-locked (its bytes go on to a GPU).
        """
        chunks = var.chunks
        fd, size, path = self._file(int(chunks.file[k]))
        offset, nbytes = int(chunks.offset[k]), int(chunks.nbytes[k])
        if offset + nbytes > size:
            raise _truncated(path, var, offset, nbytes, size)
        if buf is None:
            attr = "_pinned_scratch" if pinned else "_scratch"
            if getattr(self, attr).nbytes < nbytes:
                fresh = pinned_empty(nbytes, np.uint8) if pinned else allocate((nbytes,), np.uint8, var.name)
                setattr(self, attr, fresh)
            buf = getattr(self, attr)[:nbytes]
        hasher = new_hasher()
        self.storage.read_segments(fd, offset, buf, path, [(buf.nbytes, hasher)])
        digest = hexdigest(hasher)
        if digest != chunks.checksum[k]:
            raise _bad_checksum(path, var, offset, chunks.checksum[k], digest)
        return buf, path

    def _codec(self, var: Variable):
        """The codec object of ``var`` (made once per variable)."""
        if var.name not in self._codecs:
            from hpcckpt.codecs import from_config

            self._codecs[var.name] = from_config(var.codec, var.dtype)
        return self._codecs[var.name]

    def _decode(self, var: Variable, k: int, stored: np.ndarray, into: np.ndarray | None, path: str) -> np.ndarray:
        """Decode a verified compressed chunk into ``into`` or the decode scratch buffer (exact size checked)."""
        raw = int(np.prod(var.chunks.count[k])) * var.dtype.itemsize
        if into is None:
            if self._decoded.nbytes < raw:
                self._decoded = allocate((raw,), np.uint8, var.name)
            out = self._decoded[:raw]
        else:
            out = byte_view(into)
        try:
            self._codec(var).decode(stored, out)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{path}: the chunk of {var.name!r} at offset "
                                         f"{int(var.chunks.offset[k])} cannot be decoded: {exc}") from None
        return out

    def read_into(self, var: Variable, start, stop, out: np.ndarray, skip=()) -> None:
        """Fill ``out`` (shape ``stop - start``) with the global box ``[start, stop)``.

        ``out`` of another dtype than ``var.dtype`` (a load with cast=True):
        each chunk is read into the scratch buffer in the stored dtype and cast
        into its part of ``out`` (memory: one chunk); a matching dtype takes the
        direct paths below unchanged.

        Chunks whose index is in ``skip`` are left out (a collective load gets
        those parts from the rank that reads them).
        """
        start = tuple(int(s) for s in start)
        stop = tuple(int(s) for s in stop)
        if volume(b - a for a, b in zip(start, stop)) == 0:
            return
        starts, stops = var.chunks.start, var.chunks.stop
        idx = var.chunks.index().query(start, stop)  # O(the chunks touched): the index comes with the metadata
        self._check_cover(var, starts[idx], stops[idx], start, stop)
        if skip:
            idx = np.asarray([k for k in idx.tolist() if k not in skip], np.int64)
        rest = idx
        # host memory only: any other kind of target (device arrays) goes through fill_from_chunk
        if (var.codec.get("id") == "none" and isinstance(out, np.ndarray) and out.flags.c_contiguous and out.ndim
                and out.dtype == var.dtype):
            direct, target = direct_targets(starts[idx], var.chunks.count[idx], start, out.shape, out.itemsize)
            rest = idx[~direct]
            self._read_direct(var, idx[direct], target[direct], byte_view(out))
        for k in rest.tolist():
            self.fill_from_chunk(var, k, start, out)

    def _read_direct(self, var: Variable, ks: np.ndarray, target: np.ndarray, out: np.ndarray) -> None:
        """Read uncompressed chunks ``ks`` straight into the flat bytes ``out`` at byte offsets ``target``.

        Runs that are back to back both in their file and in ``out`` are read in
        one pass; every chunk is verified against its own checksum.
        """
        chunks = var.chunks
        order = np.argsort(target, kind="stable")
        ks, target = ks[order], target[order]
        for a, b in coalesce(chunks.file[ks], chunks.offset[ks], chunks.nbytes[ks], target):
            run = ks[a:b].tolist()
            self._read_run(var, run, out[int(target[a]):int(target[b - 1]) + int(chunks.nbytes[run[-1]])])

    def _read_run(self, var: Variable, run: list[int], dest: np.ndarray) -> None:
        """Read chunks ``run`` of ``var`` (stored back to back in one file) into ``dest``; verify each one."""
        chunks = var.chunks
        fd, size, path = self._file(int(chunks.file[run[0]]))
        offsets, sizes = chunks.offset[run].tolist(), chunks.nbytes[run].tolist()
        if offsets[-1] + sizes[-1] > size:  # back to back: the last chunk ends last; name the first cut short
            i = next(i for i, (o, n) in enumerate(zip(offsets, sizes)) if o + n > size)
            raise _truncated(path, var, offsets[i], sizes[i], size)
        hashers = [new_hasher() for _ in run]
        self.storage.read_segments(fd, offsets[0], dest, path, list(zip(sizes, hashers)))
        for k, offset, hasher in zip(run, offsets, hashers):
            digest = hexdigest(hasher)
            if digest != chunks.checksum[k]:
                raise _bad_checksum(path, var, offset, chunks.checksum[k], digest)

    def fill_from_chunk(self, var: Variable, k: int, start, out: np.ndarray) -> None:
        """Copy the part of chunk ``k`` that overlaps the box starting at ``start`` with ``out``'s shape.

        A chunk wholly inside the box that maps to contiguous memory of ``out``
        is read straight into it; any other goes through the scratch buffer.
        """
        # per chunk, so plain Python lists: cheaper than numpy for a few dimensions
        c_start = var.chunks.start[k].tolist()
        c_stop = [a + n for a, n in zip(c_start, var.chunks.count[k].tolist())]
        lo = [max(a, s) for a, s in zip(c_start, start)]
        hi = [min(b, s + n) for b, s, n in zip(c_stop, start, out.shape)]
        sel = tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, start))
        dest = out[sel] if sel else out  # out[()] of a 0-d array would be a scalar, not a view
        if is_device_array(dest):
            self._fill_device(var, k, dest, tuple(slice(a - c, b - c) for a, b, c in zip(lo, hi, c_start)))
            return
        if lo == c_start and hi == c_stop and dest.flags.c_contiguous and dest.dtype == var.dtype:
            self._fetch(var, k, into=dest)
            return
        # a dest of another dtype (a load with cast=True) gets the chunk cast from the stored dtype
        dest[...] = self.chunk_array(var, k)[tuple(slice(a - c, b - c) for a, b, c in zip(lo, hi, c_start))]

    def _fill_device(self, var: Variable, k: int, dest, part: tuple) -> None:
        """Fill the CuPy array ``dest`` with the ``part`` of chunk ``k``: the stored bytes cross to the device
        (from a pinned buffer) and are decoded there, straight into ``dest`` when it is the whole chunk."""
        from hpcckpt.codecs.gpu import device_decode

        stored, path = self._read_verified(var, k, None, pinned=True)
        extent = tuple(int(n) for n in var.chunks.count[k])
        whole = tuple(dest.shape) == extent and dest.flags.c_contiguous and dest.dtype == var.dtype
        with dest.device:
            target = dest if whole else array_module(dest).empty(extent, var.dtype)
            try:
                device_decode(self._codec(var), stored, target)
            except CorruptCheckpointError as exc:
                raise CorruptCheckpointError(f"{path}: the chunk of {var.name!r} at offset "
                                             f"{int(var.chunks.offset[k])} cannot be decoded: {exc}") from None
            if not whole:
                dest[...] = target[part]

    def chunk_array(self, var: Variable, k: int, own: bool = False) -> np.ndarray:
        """Chunk ``k`` of ``var`` as an array of its extent, verified: a view of the reused scratch buffer, or
        (``own``) a new array read straight into, for a caller that keeps it."""
        extent = tuple(int(n) for n in var.chunks.count[k])
        if own:
            out = allocate(extent, var.dtype, var.name)
            self._fetch(var, k, into=out)
            return out
        return self._fetch(var, k, into=None).view(var.dtype).reshape(extent)

    @staticmethod
    def _check_cover(var: Variable, starts, stops, start, stop) -> None:
        """The chunks found must cover the target exactly once (malformed metadata could overlap or leave gaps)."""
        if not start:
            if len(starts) != 1:
                raise CorruptCheckpointError(f"variable {var.name!r} has {len(starts)} chunks for a 0-d array")
            return
        if len(starts) == 1 and all(a <= s and t <= b for a, b, s, t in zip(starts[0].tolist(), stops[0].tolist(),
                                                                             start, stop)):
            return  # one chunk holding the whole target (a small load): covered once
        lo = np.maximum(starts, np.asarray(start)) - np.asarray(start)
        hi = np.minimum(stops, np.asarray(stop)) - np.asarray(start)
        problem = tiling_problem(lo, hi, [b - a for a, b in zip(start, stop)], label="chunk")
        if problem is not None:
            raise CorruptCheckpointError(f"the chunks of {var.name!r} do not cover the region read: {problem}")

    def verify_variable(self, var: Variable, progress=None) -> list[str]:
        """Read every chunk of ``var`` and report each problem (one line each) instead of raising."""
        problems = []
        tiling = tiling_problem(var.chunks.start, var.chunks.stop, var.shape, label="chunk")
        if tiling is not None:
            problems.append(f"variable {var.name!r}: chunks do not tile the array: {tiling}")
        for k in range(len(var.chunks)):
            try:
                self._fetch(var, k, into=None)
            except CheckpointError as exc:
                problems.append(str(exc))
            if progress is not None:
                progress(int(var.chunks.nbytes[k]))
        return problems
