"""Candidate binary forms of the chunk table against JSON columns (metadata parse target).

    python bench/chunk_table_forms.py [--ranks 16384 65536] [--vars 20] [--repeat 3] [--json out.json]

The design measurement behind format version 3: the ``zlib1+b64`` form below
is what hpcckpt.format.chunk_columns writes for tables of 4096 chunks or more
(docs/format.md section 3.3.1, with a 32-byte header and a ``hash`` as three
columns); ``bench/scale.py --metadata-only`` measures the real writer and
parser.  The metadata of bench/scale.py's save case (a
3-D grid of P ranks, ``--vars`` float64 variables, one chunk per rank and
variable) is given a distinct random checksum per chunk (as real data has),
then written and parsed in each form, all in one run so the figures pair up
(CPU seconds per million chunks, best of ``--repeat``):

* ``json``: ``Metadata.to_json_bytes`` and ``metadata.parse`` with every table as JSON arrays (the
  writer's columnar threshold set out of reach);
* ``raw``: the columns as little-endian uint64, one block per variable
  (file, offset, nbytes, checksum, start[d], count[d]), as a sidecar file
  would hold them: encoding, and decoding with the checks a reader must make
  (XXH3-64 of the block, every int column in [0, 2^62), file indexes listed,
  checksums back to the hex strings ChunkTable holds); the JSON skeleton that
  would reference the blocks is parsed on top, reading the file is not counted;
* ``b64``, ``zlib1+b64``, ``zlib6+b64``: the same block inside metadata.json as
  a base64 string, raw or deflated (zlib level 1 or 6) first: the whole
  document written and parsed (sealed JSON, base64, inflate, the same checks).

The rest of validation that no form changes (one path check per data file,
the bounds and coverage checks) is measured separately.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchutil import print_table  # noqa: E402
from scale import save_case  # noqa: E402

from hpcckpt.format import chunk_columns  # noqa: E402
from hpcckpt.core.checksum import checksum  # noqa: E402
from hpcckpt.format.metadata import check_relative_path, parse, seal  # noqa: E402

LIMIT = 1 << 62


def cpu_per_million(fn, nchunks: int, repeat: int):
    """Best CPU seconds of ``repeat`` calls of ``fn``, per million chunks, and its last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best / nchunks * 1e6, out


def columns(table) -> bytes:
    """A chunk table as 4 + 2d little-endian uint64 columns, column after column."""
    d, n = table.start.shape[1], len(table)
    cols = np.empty((4 + 2 * d, n), "<u8")
    cols[0], cols[1], cols[2] = table.file, table.offset, table.nbytes
    cols[3] = np.frombuffer(bytes.fromhex("".join(table.checksum)), ">u8")
    cols[4:4 + d], cols[4 + d:] = table.start.T, table.count.T
    return cols.tobytes()


def decode(block: bytes, rows: int, ndim: int, nfiles: int, digest: str | None = None):
    """A block back to int64 columns and hex checksums, with a reader's checks (AssertionError if one fails)."""
    assert digest is None or checksum(block) == digest
    assert len(block) == rows * (4 + 2 * ndim) * 8
    cols = np.frombuffer(block, "<u8").reshape(4 + 2 * ndim, rows)
    ints = np.delete(cols, 3, axis=0)
    assert bool((ints < LIMIT).all()) and bool((cols[0] < nfiles).all())
    hexes = cols[3].astype(">u8").tobytes().hex()
    return ints.astype(np.int64), [hexes[i:i + 16] for i in range(0, len(hexes), 16)]


def document(meta, chunk_entry) -> bytes:
    """The sealed metadata with each variable's chunk table replaced by ``chunk_entry(name, variable)``."""
    doc = {"format": "hpcckpt", "format_version": 3, "checksum": "xxh3_64", "step": meta.step,
           "created": meta.created, "nranks": meta.nranks, "files": meta.files,
           "variables": {name: {**var.to_json(False), "chunks": chunk_entry(name, var)} for name, var in meta.variables.items()},
           "values": meta.values, "extra": meta.extra}
    return seal(json.dumps(doc, separators=(",", ":"), allow_nan=False).encode())


def measure(p: int, nvars: int, repeat: int) -> dict:
    _, meta, _ = save_case(p, nvars, [0])
    rng = np.random.default_rng(0)
    for var in meta.variables.values():
        hexes = rng.integers(0, 1 << 63, len(var.chunks)).astype(">u8").tobytes().hex()
        var.chunks.checksum = [hexes[i:i + 16] for i in range(0, len(hexes), 16)]
    n = sum(len(v.chunks) for v in meta.variables.values())
    nfiles, ndim = len(meta.files), 3

    def timed(fn):
        return cpu_per_million(fn, n, repeat)

    out = {"ranks": p, "chunks": n, "files": nfiles, "forms": {}}
    chunk_columns.COLUMNAR_MIN_CHUNKS = 1 << 62  # JSON arrays at any size
    t_write, raw = timed(meta.to_json_bytes)
    t_parse, _ = timed(lambda: parse(raw))
    t_loads, _ = timed(lambda: json.loads(raw))
    out["forms"]["json"] = {"bytes_per_chunk": len(raw) / n, "write": t_write, "parse": t_parse, "json_loads": t_loads}

    t_enc, blocks = timed(lambda: {name: columns(v.chunks) for name, v in meta.variables.items()})
    digests = {name: checksum(b) for name, b in blocks.items()}
    skeleton = document(meta, lambda name, v: {"rows": len(v.chunks), "checksum": digests[name]})
    t_skel, _ = timed(lambda: document(meta, lambda name, v: {"rows": len(v.chunks), "checksum": digests[name]}))
    t_dec, _ = timed(lambda: (json.loads(skeleton),
                              [decode(b, len(meta.variables[name].chunks), ndim, nfiles, digests[name])
                               for name, b in blocks.items()]))
    out["forms"]["raw"] = {"bytes_per_chunk": (sum(map(len, blocks.values())) + len(skeleton)) / n,
                           "write": t_enc + t_skel, "parse": t_dec}

    for form, pack, unpack in (("b64", bytes, bytes), ("zlib1+b64", lambda b: zlib.compress(b, 1), zlib.decompress),
                               ("zlib6+b64", lambda b: zlib.compress(b, 6), zlib.decompress)):
        def write(pack=pack):
            packed = {name: columns(v.chunks) for name, v in meta.variables.items()}
            return document(meta, lambda name, v: {"rows": len(v.chunks),
                                                   "data": base64.b64encode(pack(packed[name])).decode()})

        def read(doc, unpack=unpack):
            variables = json.loads(doc)["variables"]
            return [decode(unpack(binascii.a2b_base64(v["chunks"]["data"])), v["chunks"]["rows"], ndim, nfiles)
                    for v in variables.values()]

        t_w, doc = timed(write)
        t_r, _ = timed(lambda doc=doc: read(doc))
        out["forms"][form] = {"bytes_per_chunk": len(doc) / n, "write": t_w, "parse": t_r}

    def bounds():
        for var in meta.variables.values():
            c, shape = var.chunks, np.asarray(var.shape, np.int64)
            volumes = np.prod(c.count, axis=1)
            assert bool(np.all(c.start <= shape) and np.all(c.count <= shape - c.start))
            assert bool(np.all(c.nbytes == volumes * var.dtype.itemsize)) and int(volumes.sum()) == np.prod(var.shape)

    out["file_checks"], _ = timed(lambda: [check_relative_path(f) for f in meta.files])
    out["bounds_checks"], _ = timed(bounds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[16384, 65536])
    ap.add_argument("--vars", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = [measure(p, args.vars, args.repeat) for p in args.ranks]
    rows = []
    for r in results:
        for form, f in r["forms"].items():
            rows.append([f"{r['ranks']:,}", f"{r['chunks']:,}", form, f"{f['bytes_per_chunk']:.1f}",
                         f"{f['write']:.2f}", f"{f['parse']:.2f}"])
    print("CPU s per million chunks (best of --repeat); raw: the sidecar's file read not counted")
    print_table(["P", "chunks", "form", "bytes/chunk", "write", "parse (+checks)"], rows)
    for r in results:
        print(f"P={r['ranks']:,}: json.loads alone {r['forms']['json']['json_loads']:.2f}; checks no form changes: "
              f"{r['files']:,} file names {r['file_checks']:.2f}, bounds and coverage {r['bounds_checks']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
