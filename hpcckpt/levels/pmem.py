"""PM: a persistent-memory tier, each rank's data file kept as an image in a memory-mapped file, updated in place.

The image file (``pmem_dir/<rank>.pmem``; ``pmem_dir/node-<k>/`` with
simulated nodes) lives on a DAX or memory file system (tmpfs stands for one)
and holds two slots, each with its own header (layout in docs/async.md,
"The persistent-memory image").  An update writes the slot that does not
hold the newest version, crash-consistently:

1. its header is zeroed and flushed (``msync``): the slot no longer counts;
2. every block (``block`` bytes) of the new data that differs from what
   the slot holds is copied into it; the slot is flushed;
3. its header (sequence number one above the other slot's, version name,
   length, CRC-32) is written and flushed.

A SIGKILL or power loss at any instant leaves the other slot's version
intact and this slot invalid (zeroed or torn header: a wrong CRC), or the
new version whole: never a mix.  A read maps the file and serves the slot's
bytes from the map (:class:`PmemStorage`, the storage the restore loads with).
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from hpcckpt.mpi.collective import agree, best_effort
from hpcckpt.errors import CheckpointError, CorruptCheckpointError, TemplateMismatchError
from hpcckpt.core.names import parse_version_name, rank_file
from hpcckpt.loading.load import load_version
from hpcckpt.storage import POSIX
from hpcckpt.storage.base import Storage, hash_segments
from hpcckpt.storage.commit import commit_version
from hpcckpt.storage.metadata_file import read_metadata_bytes
from hpcckpt.storage.opening import create_replacing, open_regular
from hpcckpt.levels.base import Attempt, Level, check_int
from hpcckpt.levels.fetch import fetcher

MAGIC = b"HCKPMEM1"
PAGE = 4096
#: Header of one slot: magic, slot, nranks, rank, seq, capacity, length, block, name (UTF-8, zero-padded); CRC-32.
_HEADER = struct.Struct("<8sIIIQQQQ96s")
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEADER.size + _CRC.size
#: Byte offset of slot s's header in the header page.
HEADER_AT = (0, PAGE // 2)
DEFAULT_BLOCK = 4096


def image_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"{rank:06d}.pmem")


def pack_header(slot: int, nranks: int, rank: int, seq: int, capacity: int, length: int, block: int,
                name: str) -> bytes:
    raw = name.encode()
    if len(raw) > 96:
        raise CheckpointError(f"version name {name!r} is too long for the persistent-memory image (96 bytes)")
    body = _HEADER.pack(MAGIC, slot, nranks, rank, seq, capacity, length, block, raw)
    return body + _CRC.pack(zlib.crc32(body))


def unpack_header(raw: bytes, slot: int, file_size: int) -> dict | None:
    """The header of ``slot`` as a dict, or None when the slot holds no valid version (never written, zeroed,
    torn, or pointing outside the file)."""
    body, (crc,) = raw[:_HEADER.size], _CRC.unpack(raw[_HEADER.size:HEADER_BYTES])
    if zlib.crc32(body) != crc:
        return None
    magic, s, nranks, rank, seq, capacity, length, block, name = _HEADER.unpack(body)
    if magic != MAGIC or s != slot or seq == 0 or length > capacity or slot_offset(slot, capacity) + capacity > file_size:
        return None
    return {"slot": s, "nranks": nranks, "rank": rank, "seq": seq, "capacity": capacity, "length": length,
            "block": block, "name": name.rstrip(b"\0").decode(errors="replace")}


def slot_offset(slot: int, capacity: int) -> int:
    return PAGE + slot * capacity


def changed_blocks(old: np.ndarray, new: np.ndarray, block: int) -> np.ndarray:
    """Indexes of the ``block``-byte blocks of ``new`` that differ from ``old`` (uint8 arrays; ``old`` may be
    shorter: the blocks past its end all count, a partial last block too)."""
    n = new.size
    nblocks = -(-n // block)
    common = min(old.size, n) // block  # whole blocks both hold
    out = np.ones(nblocks, dtype=bool)
    if common:
        out[:common] = np.any(old[:common * block].reshape(common, block) != new[:common * block].reshape(common, block),
                              axis=1)
    if common < nblocks and common * block < min(old.size, n) and old.size >= n:  # the tail block, held whole
        out[common] = not np.array_equal(old[common * block:n], new[common * block:n])
    return np.flatnonzero(out)


class PmemImage:
    """One rank's two-slot image file.  Not thread-safe; one writer process at a time.

    The image is mapped into memory, which needs a real file descriptor: it
    lives on POSIX (a DAX or memory file system) whatever storage the node
    directories use, and its names are made and replaced through POSIX.
    """

    def __init__(self, path: str, rank: int, nranks: int, block: int = DEFAULT_BLOCK):
        check_int("pmem_block", block, 1)
        self.path, self.rank, self.nranks, self.block = path, rank, nranks, block
        self.bytes_written = 0  # data bytes the last update wrote (changed blocks), header bytes excluded

    def headers(self) -> list:
        """``[header of slot 0 or None, header of slot 1 or None]`` as the file holds them now."""
        try:
            fd = open_regular(self.path)
        except (FileNotFoundError, CorruptCheckpointError):  # none, or not a regular file: it holds no version
            return [None, None]
        try:
            size = os.fstat(fd).st_size
            page = os.pread(fd, PAGE, 0)
        finally:
            os.close(fd)
        if len(page) < PAGE:
            return [None, None]
        return [unpack_header(page[at:at + HEADER_BYTES], s, size) for s, at in enumerate(HEADER_AT)]

    def holding(self, name: str) -> dict | None:
        """The valid header of the slot that holds version ``name`` of this rank and rank count, or None."""
        for h in self.headers():
            if h is not None and h["name"] == name and h["rank"] == self.rank and h["nranks"] == self.nranks:
                return h
        return None

    def update(self, data: np.ndarray, name: str, fsync: bool = True) -> int:
        """Store ``data`` (uint8) as version ``name`` in the slot not holding the newest version; the data bytes
        written (the blocks that differ from what that slot held)."""
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
        headers = self.headers()
        valid = [h for h in headers if h is not None]
        newest = max(valid, key=lambda h: h["seq"]) if valid else None
        seq = newest["seq"] + 1 if newest else 1
        capacity = next((h["capacity"] for h in valid), None)
        if capacity is None or data.size > capacity or not os.path.isfile(self.path):
            return self._recreate(data, name, seq, fsync)
        target = 1 - newest["slot"]
        old_length = headers[target]["length"] if headers[target] is not None else 0
        fd = open_regular(self.path, write=True)
        try:
            mm = mmap.mmap(fd, slot_offset(2, capacity))
        finally:
            os.close(fd)
        try:
            at = HEADER_AT[target]
            mm[at:at + HEADER_BYTES] = bytes(HEADER_BYTES)  # 1. the slot no longer counts
            if fsync:
                mm.flush(0, PAGE)
            base = slot_offset(target, capacity)
            slot = np.frombuffer(mm, dtype=np.uint8, count=capacity, offset=base)
            try:
                blocks = changed_blocks(slot[:old_length], data, self.block)  # 2. the changed blocks
                written = self._copy_blocks(slot, data, blocks)
            finally:
                del slot
            if fsync and written:
                mm.flush(base, capacity)
            mm[at:at + HEADER_BYTES] = pack_header(target, self.nranks, self.rank, seq, capacity, data.size,
                                                   self.block, name)  # 3. the new version counts
            if fsync:
                mm.flush(0, PAGE)
        finally:
            mm.close()
        self.bytes_written = written
        return written

    def _copy_blocks(self, slot: np.ndarray, data: np.ndarray, blocks: np.ndarray) -> int:
        """Copy the listed blocks of ``data`` into ``slot`` (runs of adjacent blocks in one copy); bytes copied."""
        if blocks.size == 0:
            return 0
        b = self.block
        breaks = np.flatnonzero(np.diff(blocks) != 1) + 1
        written = 0
        for run in np.split(blocks, breaks):
            lo, hi = int(run[0]) * b, min((int(run[-1]) + 1) * b, data.size)
            slot[lo:hi] = data[lo:hi]
            written += hi - lo
        return written

    def _recreate(self, data: np.ndarray, name: str, seq: int, fsync: bool) -> int:
        """A new image file (first use, or data beyond the slots' capacity) with ``data`` in slot 0, renamed over
        the old one: a crash leaves the old file or the new one."""
        capacity = max(PAGE, -(-data.size // PAGE) * PAGE)
        POSIX.make_directories(os.path.dirname(self.path) or ".")
        tmp = self.path + ".part"
        fd = create_replacing(tmp, readable=True)
        try:
            # the space reserved now: a full file system is an OSError here, not a SIGBUS at a store into the map
            os.posix_fallocate(fd, 0, slot_offset(2, capacity))
            mm = mmap.mmap(fd, slot_offset(2, capacity))
        finally:
            os.close(fd)
        try:
            mm[slot_offset(0, capacity):slot_offset(0, capacity) + data.size] = memoryview(data)
            mm[0:HEADER_BYTES] = pack_header(0, self.nranks, self.rank, seq, capacity, data.size, self.block, name)
            if fsync:
                mm.flush()
        finally:
            mm.close()
        POSIX.replace(tmp, self.path)
        if fsync:
            POSIX.sync_directory(os.path.dirname(self.path) or ".")
        self.bytes_written = data.size
        return data.size

    def open_version(self, name: str):
        """``(read-only map of the file, header)`` of the slot holding ``name`` (None when none does)."""
        h = self.holding(name)
        if h is None:
            return None
        fd = open_regular(self.path)
        try:
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        h2 = unpack_header(mm[HEADER_AT[h["slot"]]:HEADER_AT[h["slot"]] + HEADER_BYTES], h["slot"], len(mm))
        if h2 != h:  # rewritten since it was read (another writer): refuse rather than read a moving slot
            mm.close()
            return None
        return mm, h

    def read_version(self, name: str) -> np.ndarray | None:
        """A copy of version ``name``'s bytes (None when no slot holds it)."""
        opened = self.open_version(name)
        if opened is None:
            return None
        mm, h = opened
        try:
            view = np.frombuffer(mm, dtype=np.uint8, count=h["length"], offset=slot_offset(h["slot"], h["capacity"]))
            out = view.copy()
            del view
        finally:
            mm.close()
        return out


class PmemStorage:
    """The storage ``fallback`` (the node directories' or the root's, where the version is read from) but for
    one data file, served from a slot of a persistent-memory image (by mapping)."""

    def __init__(self, path: str, mapped, header: dict, fallback: Storage):
        self.mapped_path, self.mm, self.header, self.fallback = os.path.realpath(path), mapped, header, fallback
        self.mapped_reads = 0

    def __getattr__(self, name: str):
        return getattr(self.fallback, name)  # everything but the mapped file's reads

    def mapped_bytes(self) -> bytes:
        """A copy of the whole mapped slot (the data file's bytes)."""
        base = slot_offset(self.header["slot"], self.header["capacity"])
        return self.mm[base:base + self.header["length"]]

    def open_read(self, path: str) -> tuple:
        if os.path.realpath(path) == self.mapped_path:
            h = self.header
            return ("pmem", slot_offset(h["slot"], h["capacity"])), h["length"]
        return self.fallback.open_read(path)

    def read_segments(self, handle, offset: int, buffer, name: str, segments) -> None:
        if not isinstance(handle, tuple):
            return self.fallback.read_segments(handle, offset, buffer, name, segments)
        from hpcckpt.errors import CorruptCheckpointError

        view = memoryview(buffer).cast("B")
        if offset + len(view) > self.header["length"]:
            raise CorruptCheckpointError(f"{name} (persistent-memory image) is truncated: wanted {len(view)} bytes "
                                         f"at offset {offset} of {self.header['length']}")
        base = handle[1] + offset
        view[:] = self.mm[base:base + len(view)]
        self.mapped_reads += len(view)
        hash_segments(view, segments)

    def close_read(self, handle) -> None:
        if not isinstance(handle, tuple):
            self.fallback.close_read(handle)

    def close(self) -> None:
        self.mm.close()


@dataclass(frozen=True)
class PmemOptions:
    """``pmem_dir``: the tier's directory on a DAX or memory file system; ``pmem_every=k`` (0: never; default 1
    with ``pmem_dir``) stores every k-th checkpoint there, in blocks of ``pmem_block`` bytes."""

    pmem_dir: str | None = None
    pmem_every: int | None = None
    pmem_block: int = DEFAULT_BLOCK

    def __post_init__(self):
        check_int("pmem_every", self.pmem_every, 0, optional=True)
        check_int("pmem_block", self.pmem_block, 1)
        if self.pmem_dir is None and self.pmem_every:
            raise CheckpointError("pmem_every needs pmem_dir (the persistent-memory tier's directory)")
        if self.pmem_dir is not None:
            object.__setattr__(self, "pmem_dir", os.fspath(self.pmem_dir))


class PmemLevel(Level):
    """PM: this rank's data file of the version stored in place in its persistent-memory image.

    Its restore half serves whole versions: when every rank's image holds
    one, each rank's own data file is read from the map, the rest as from L1.
    """

    key = "pmem"
    label = "PM"
    title = "the persistent-memory tier"
    recovers = "a crash or restart of the processes of a node (not the node's loss)"
    Options = PmemOptions
    derived_every = None  # its interval is its own: every checkpoint once pmem_dir is given

    def __init__(self, options=None):
        super().__init__(options)
        self.image: PmemImage | None = None  # this rank's image, once started with pmem_dir

    def interval(self, derived: bool) -> int:
        if self.given_every is not None:
            return self.given_every
        return 0 if self.options.pmem_dir is None else 1

    def needs_local_dir(self) -> list[str]:
        return [] if self.options.pmem_dir is None else ["pmem_dir"]

    def start(self, node) -> None:
        if self.options.pmem_dir is not None:
            self.image = PmemImage(image_path(node.node_directory(self.options.pmem_dir), node.rank), node.rank,
                                   node.comm.Get_size(), self.options.pmem_block)

    def available(self, node) -> bool:
        return self.image is not None

    def protect(self, node, directory: str, sizes: list[int], fsync: bool, what: str):
        rank, name = node.rank, os.path.basename(os.path.normpath(directory))

        def update():
            data = np.empty(sizes[rank], np.uint8)
            if sizes[rank]:
                path = os.path.join(directory, rank_file(rank))
                handle, _ = self.storage.open_read(path)
                try:
                    self.storage.read_segments(handle, 0, data, path, [(data.nbytes, None)])
                finally:
                    self.storage.close_read(handle)
            return self.image.update(data, name, fsync)

        agree(node.comm, what + " (persistent-memory tier)", update)
        return {"block": self.image.block}

    def serves(self, attempt: Attempt) -> bool:
        return self.image is not None and (attempt.name in attempt.local_sets[0] or attempt.name in attempt.root_names)

    def load(self, attempt: Attempt):
        """Collective.  Rank 0 reads the metadata from its node directory (else from the root, where every file
        is).  Before the load, ranks whose node directory lost their file write it from the map (removed again
        if the load fails), so that the files other ranks read can be fetched from their node (levels/fetch.py)."""
        node, name = attempt.node, attempt.name
        comm, rank = node.comm, node.rank
        what = f"restore of {name} from the persistent-memory tier"
        vdir = node.path(name)
        directory = vdir if name in attempt.local_sets[0] else os.path.join(attempt.root, name)
        source = self.storage if directory == vdir else node.root_storage  # where the other files are read

        def held():
            try:
                return self.image.holding(name) is not None
            except OSError:
                return False

        missing = [r for r, h in enumerate(comm.allgather(held())) if not h]
        if missing:
            return None, (f"rank(s) {missing} hold no image of it (a tier gone, another rank count, or an older "
                          "version)")
        own = os.path.join(directory, rank_file(rank))
        opened = self.image.open_version(name)  # None if rewritten since: this rank then reads its L1 file
        storage = PmemStorage(own, *opened, source) if opened is not None else source
        refilled = os.path.join(vdir, rank_file(rank))

        def refill():
            if opened is not None and opened[1]["length"] and not self.storage.is_file(refilled):
                self.storage.make_directories(os.path.dirname(refilled))
                self.storage.atomic_write(refilled, storage.mapped_bytes())
                return True
            return False

        wrote = False
        try:
            wrote = agree(comm, what + " (node-local files from the map)", refill)
            out = load_version(attempt.state, directory, comm, strict=attempt.strict,
                               expect_step=parse_version_name(name)[0], storage=storage, cast=attempt.cast,
                               before_reads=fetcher(self.storage, comm, vdir, node.layout.node_of, what)
                               if directory == vdir else None)
            raw = comm.bcast(agree(comm, what, lambda: read_metadata_bytes(directory, source)
                                   if rank == 0 else None), root=0)
            agree(comm, what, lambda: node.leader and name not in attempt.local_sets[rank] and
                  commit_version(vdir, raw, storage=self.storage))
        except CheckpointError as exc:
            if wrote:  # unverified bytes: not left for the node-local levels to trust
                best_effort(f"removing {refilled!r}", lambda: self.storage.remove_file(refilled))
            if isinstance(exc, TemplateMismatchError):
                raise
            return None, str(exc)
        finally:
            if opened is not None:
                storage.close()
        return out, None
