#!/usr/bin/env python
"""Which erasure-code library the Reed-Solomon level uses: zfec against PyECLib (liberasurecode), one process.

    python bench/erasure_libs.py --k 6 --m 2 --mib 4 --repeats 7 --json libs.json

Encodes k blocks of ``--mib`` MiB each into m check blocks, and decodes with
m data blocks lost, with every library importable here: zfec (block API:
the k blocks in, the m check blocks out) and PyECLib with each Reed-Solomon
backend its wheel can load (``liberasurecode_rs_vand``, ``isa_l_rs_vand``,
``isa_l_rs_cauchy``; its API takes one payload and returns framed fragments),
and the level's own path, ``hpcckpt rs_coder`` (levels/rs_coder.py: ISA-L's
Cauchy code on plain blocks; its decode frames k shards with the library's
headers and rebuilds the first lost data block only).
Rounds alternate the libraries; each figure is the median over repeats of
the data bytes (k blocks) per second, and ``vs zfec`` the median of the
paired ratio of times.  Every decode is checked against the input.  A
library that does not import is listed as missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def coders(k: int, m: int, blocks: list[bytes]):
    """name -> (encode(), decode()) closures over the same data; decode loses the first m data blocks."""
    out = {}
    try:
        import zfec
    except ImportError:
        print("zfec: missing")
    else:
        enc, dec = zfec.Encoder(k, k + m), zfec.Decoder(k, k + m)
        checks = enc.encode(tuple(blocks), tuple(range(k, k + m)))
        have, nums = tuple(blocks[m:]) + tuple(checks), tuple(range(m, k + m))
        assert dec.decode(have, nums)[0] == blocks[0]
        out["zfec"] = (lambda: enc.encode(tuple(blocks), tuple(range(k, k + m))), lambda: dec.decode(have, nums))
    payload = b"".join(blocks)
    try:
        from pyeclib.ec_iface import ECDriver
    except ImportError:
        print("pyeclib: missing")
        return out
    for ec_type in ("liberasurecode_rs_vand", "isa_l_rs_vand", "isa_l_rs_cauchy"):
        try:
            driver = ECDriver(k=k, m=m, ec_type=ec_type)
        except Exception as exc:  # noqa: BLE001 - a backend the wheel does not carry
            print(f"pyeclib {ec_type}: not available ({type(exc).__name__})")
            continue
        fragments = driver.encode(payload)
        have_f = fragments[m:]
        assert driver.decode(have_f) == payload
        out[f"pyeclib {ec_type}"] = (lambda d=driver: d.encode(payload), lambda d=driver, h=have_f: d.decode(h))
    from hpcckpt.levels import rs_coder

    stripe = np.frombuffer(payload, np.uint8)  # the level receives a stripe's segments contiguous, in order
    checks = rs_coder.encode(k, m, stripe)
    shards, sources = blocks[m:] + [bytes(c) for c in checks], list(range(m, k + m))
    assert bytes(rs_coder.decode(k, m, shards, sources, 0)) == blocks[0]
    out["hpcckpt rs_coder"] = (lambda: rs_coder.encode(k, m, stripe), lambda: rs_coder.decode(k, m, shards, sources, 0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--m", type=int, default=2)
    ap.add_argument("--mib", type=float, default=4, help="MiB per data block")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    size = int(args.mib * (1 << 20))
    blocks = [os.urandom(size) for _ in range(args.k)]
    libs = coders(args.k, args.m, blocks)
    times = {(name, op): [] for name in libs for op in ("encode", "decode")}
    for rep in range(args.repeats):
        names = list(libs)
        names = names[rep % len(names):] + names[:rep % len(names)]
        for name in names:
            for op, fn in zip(("encode", "decode"), libs[name]):
                t0 = time.perf_counter()
                fn()
                times[name, op].append(time.perf_counter() - t0)
    data = args.k * size
    print(f"k={args.k} m={args.m}, {args.mib:g} MiB per block, {args.repeats} repeats (decode: {args.m} data "
          "blocks lost)")
    print("| library | encode MB/s | decode MB/s | encode vs zfec | decode vs zfec |")
    print("|---|---|---|---|---|")
    rows = []
    for name in libs:
        row = {"library": name}
        for op in ("encode", "decode"):
            row[op + "_MBps"] = data / statistics.median(times[name, op]) / 1e6
            if "zfec" in libs:
                row[op + "_vs_zfec"] = statistics.median(a / b for a, b in zip(times[name, op], times["zfec", op]))
        rows.append(row)
        print(f"| {name} | {row['encode_MBps']:.0f} | {row['decode_MBps']:.0f} | "
              f"{row.get('encode_vs_zfec', float('nan')):.2f}x | {row.get('decode_vs_zfec', float('nan')):.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"k": args.k, "m": args.m, "mib": args.mib, "rows": rows,
                       "seconds": {f"{n} {op}": t for (n, op), t in times.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
