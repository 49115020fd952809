"""The codec stage of the save and load pipelines.

Save: :class:`EncodedPieces` wraps the stream of (variable, start, count,
array) pieces a transport writes.  Pieces of uncompressed host variables pass
through untouched (still views of the caller's memory: zero-copy); pieces of
compressed variables, and every piece of a CuPy array (filtered and maybe
compressed on its device, then copied to pinned host memory: codecs/gpu.py),
are encoded in a thread pool (numcodecs and CUDA copies release the GIL), at
most ``2 * threads`` pieces ahead of the writer, so the extra memory is bounded
by a few chunks whatever the state's size.  Output order is input order.

Load: :func:`plan_codecs` and the reader's ``_fetch`` decode one chunk at a
time, only the chunks a read needs.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from hpcckpt.core.devices import as_local_array, is_device_array
from hpcckpt.codecs import auto, auto_lossy, blosc2_codec
from hpcckpt.codecs.core import AUTO, NAMES, NoneCodec, from_config, resolve, spec_to_json
from hpcckpt.codecs.gpu import device_encode


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class EncodedPieces:
    """Turns a stream of pieces into the stored bytes of each piece, compressing in a thread pool."""

    def __init__(self, codecs: dict, threads: int | None = None):
        self.codecs = codecs
        self.threads = threads or default_threads()
        blosc2_codec.set_threads(self.threads)  # blosc2's own threads share the pool's count: no oversubscription
        self.wait_seconds = 0.0  # time the writer spent waiting for compression
        self.write_seconds = 0.0  # time the consumer spent between pieces (checksum + write)
        self.raw_bytes = self.stored_bytes = 0

    @classmethod
    def for_save(cls, configs: dict, summaries: dict, threads: int | None) -> "EncodedPieces":
        """The encoder of one rank's save: ``configs`` from rank 0, dtypes from this rank's summaries."""
        from hpcckpt.core.encoding import dtype_from_json

        dtypes = {name: dtype_from_json(s["dtype"]) for name, s in summaries.items() if s.get("dtype") is not None}
        return cls(codecs_for({n: c for n, c in configs.items() if n in dtypes}, dtypes), threads)

    def wrap(self, pieces, timer=None):
        """Yield (variable, start, count, array or stored uint8 bytes) in input order; record the write bandwidth."""
        pool = None  # started at the first piece that needs encoding
        pending: deque = deque()
        try:
            for variable, start, count, arr in pieces:
                self.raw_bytes += arr.nbytes
                job = self._job(self.codecs.get(variable), arr)
                if job is None:
                    pending.append((variable, start, count, arr, None))
                else:
                    if pool is None:
                        pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="hpcckpt-codec")
                    pending.append((variable, start, count, None, pool.submit(job)))
                while len(pending) > (2 * self.threads if pool is not None else 0):
                    yield from self._emit(pending.popleft(), timer)
            while pending:
                yield from self._emit(pending.popleft(), timer)
            auto.observe_write(self.stored_bytes, self.write_seconds)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _job(codec, arr):
        """What turns the piece into its stored bytes, or None when it is stored as it is (a host array, no codec)."""
        if is_device_array(arr):
            return partial(device_encode, codec or NoneCodec(), arr)
        if codec is None or codec.is_none:
            return None
        return partial(codec.encode, arr)

    def _emit(self, item, timer):
        variable, start, count, arr, future = item
        if future is not None:
            t = time.perf_counter()
            if timer is not None:
                with timer.phase("compress"):
                    arr = future.result()
            else:
                arr = future.result()
            self.wait_seconds += time.perf_counter() - t
        self.stored_bytes += arr.nbytes
        t = time.perf_counter()
        yield variable, start, count, arr
        self.write_seconds += time.perf_counter() - t


def summary_for(spec, arr, dtype) -> dict:
    """What a rank sends rank 0 about a variable's codec: its spec (JSON) or, for auto, a sample measurement."""
    spec = spec_to_json(spec)
    if spec == AUTO:
        return {"auto": auto.measure(arr, dtype) if dtype is not None else {"bytes": 0, "sample": 0, "bw": 0}}
    if auto_lossy.is_auto_lossy(spec):  # the spec too: the ranks must ask for the same bound
        return {"spec": spec, "measure": auto_lossy.measure(arr if dtype is not None else None, dtype, spec)}
    return {"spec": spec}


def decide(name: str, dtype, per_rank: list[dict], threads: int) -> dict:
    """Rank 0: the codec config of variable ``name`` from every rank's summary (they must agree on the spec)."""
    from hpcckpt.errors import TemplateMismatchError

    specs = [s.get("spec") for s in per_rank]
    autos = [s["auto"] for s in per_rank if "auto" in s]
    if autos and len(autos) != len(per_rank) or any(sp != specs[0] for sp in specs):
        raise TemplateMismatchError(f"variable {name!r}: the ranks ask for different codecs")
    if autos:
        for m in autos:
            m.setdefault("seconds", {})
        return resolve(auto.decide(autos, threads), dtype).config
    if auto_lossy.is_auto_lossy(specs[0]):
        chosen = auto_lossy.decide(specs[0], dtype, [s["measure"] for s in per_rank], threads)
        return resolve(chosen, dtype).config
    return resolve(specs[0], dtype).config


def decide_alone(name: str, dtype, summary: dict, threads: int, agreed: dict | None) -> dict:
    """A rank's codec config of variable ``name`` when it plans its part alone (an asynchronous save after its
    layout changed), from its own ``summary`` only; the commit then checks that every rank chose the same.

    An automatic choice keeps ``agreed``, the ranks' earlier choice: always for ``"auto"``, for an AutoLossy
    spec when ``agreed`` is one of its candidates at the same bound.  An AutoLossy variable without such a
    choice takes the quantizer, as every rank does alike (a sample of one rank's part could differ).
    """
    spec = summary.get("spec")
    if agreed is not None and ("auto" in summary or (
            auto_lossy.is_auto_lossy(spec) and agreed in auto_lossy.choices(spec))):
        return agreed
    if auto_lossy.is_auto_lossy(spec):
        return resolve(auto_lossy.choices(spec)[0], dtype).config
    return decide(name, dtype, [summary], threads)


def codecs_for(configs: dict, dtypes: dict) -> dict:
    """Codec objects from configs (already validated by rank 0)."""
    return {name: (NoneCodec() if cfg.get("id") == "none" else from_config(cfg, dtypes[name]))
            for name, cfg in configs.items()}


def check_codec_option(codec, threads) -> None:
    """Validate the save options ``codec`` and ``codec_threads`` (CheckpointError)."""
    from hpcckpt.errors import CheckpointError

    spec = spec_to_json(codec)
    if isinstance(spec, str) and spec != AUTO and spec not in NAMES:
        raise CheckpointError(f"unknown codec {spec!r}; known: {sorted(NAMES) + [AUTO]}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise CheckpointError(f"codec_threads must be a positive integer or None, got {threads!r}")


def codec_summary(value, summary: dict, default) -> dict:
    """This rank's codec summary of a Block/Ragged (its own codec, else the save's default)."""
    from hpcckpt.core.encoding import dtype_from_json

    spec = getattr(value, "codec", None)
    spec = default if spec is None else spec
    dtype = dtype_from_json(summary["dtype"]) if summary.get("dtype") is not None else None
    arr = as_local_array(value.local) if value.local is not None else None
    return summary_for(spec, arr, dtype)


def decide_codecs(variables: dict, summaries: list[dict], threads: int | None) -> dict:
    """Rank 0: the codec config of every planned variable."""
    from hpcckpt.core.encoding import dtype_from_json

    return {name: decide(name, dtype_from_json(plan.dtype), [s[name]["codec"] for s in summaries],
                         threads or default_threads())
            for name, plan in variables.items()}
