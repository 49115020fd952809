"""``hpcckpt inspect``: one version's variables, values, files and (with --chunks) its chunk index."""

from __future__ import annotations

import json


from hpcckpt.core.encoding import dtype_to_json
from hpcckpt.errors import CheckpointError
from hpcckpt.format.metadata import CHECKSUM_ALGORITHM, FORMAT_NAME
from hpcckpt.loading.view import CheckpointView


from hpcckpt.cli.common import (EXIT_OK, box_str, dtype_str, human_bytes, print_table, resolve_version, shape_str, short_repr,
                     storage_of, time_text)


# --------------------------------------------------------------------------- inspect

def _file_sizes(view: CheckpointView) -> list[int | None]:
    """Size of each data file (None when missing or not allowed); ``@VERSION/...`` references resolved."""
    out = []
    for name in view.meta.files:
        try:
            st = view.storage.stat(view.storage.resolve(view.path, name), follow=True)
        except (OSError, CheckpointError):
            st = None
        out.append(None if st is None else st.size)
    return out


def cmd_inspect(args) -> int:
    path, note = resolve_version(args.path)
    with CheckpointView(path, storage_of(path)) as view:
        meta = view.meta
        sizes = _file_sizes(view)
        if args.json:
            print(json.dumps(_inspect_json(view, sizes, args.chunks), indent=1))
            return EXIT_OK
        if note:
            print(f"({note})")
        print(f"checkpoint   {path}")
        print(f"format       hpcckpt format version {meta.format_version}, chunk checksums {CHECKSUM_ALGORITHM}")
        print(f"step         {meta.step if meta.step is not None else '-'}")
        print(f"created      {time_text(meta.created)}")
        print(f"written by   {meta.nranks} rank{'s' if meta.nranks != 1 else ''}")
        own = sum(s or 0 for n, s in zip(meta.files, sizes) if not n.startswith("@"))
        refs = sum(1 for n in meta.files if n.startswith("@"))
        print(f"files        {len(meta.files) - refs}, {human_bytes(own)}"  # its own: the count and bytes alike
              + (f" (+ {refs} file{'s' if refs != 1 else ''} of other versions, referenced)" if refs else ""))
        width = max((len(n) for n in meta.files), default=0)
        for name, size in zip(meta.files, sizes):
            print(f"  {name.ljust(width)}  {human_bytes(size) if size is not None else 'MISSING'}")
        print(f"variables    {len(meta.variables)}")
        if meta.variables:
            table = [("NAME", "KIND", "SHAPE", "DTYPE", "CODEC", "CHUNKS", "BYTES", "STORED")]
            for name, var in meta.variables.items():
                table.append((name, var.kind, shape_str(var.shape), dtype_str(var.dtype),
                              str(var.codec.get("id")), str(len(var.chunks)), human_bytes(var.nbytes),
                              human_bytes(var.stored_bytes)))
            print_table(table, right={5, 6, 7}, indent="  ")
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
                    table.append((str(k), box_str(c.start[k].tolist(), c.count[k].tolist()),
                                  meta.files[int(c.file[k])], str(int(c.offset[k])), str(int(c.nbytes[k])),
                                  c.checksum[k]))
                print_table(table, right={0, 3, 4}, indent="  ")
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
    return {"path": view.path, "format": FORMAT_NAME, "format_version": meta.format_version,
            "checksum": CHECKSUM_ALGORITHM, "step": meta.step, "created": meta.created, "nranks": meta.nranks,
            "files": [{"name": n, "size": s} for n, s in zip(meta.files, sizes)],
            "variables": variables, "values": meta.values, "extra": meta.extra}
