"""The describe stage of every save, and the planner call of its plan stage (saving/plan.py).

Every kind of save (blocking, incremental, asynchronous, multi-level) hands
over its state through :func:`describe_state`, so what a rank describes, the
layout key its plan cache compares and the digest the ranks agree on are
written once.
"""

from __future__ import annotations

from hpcckpt.mpi import agreement
from hpcckpt.codecs.core import spec_to_json
from hpcckpt.core.devices import as_local_array
from hpcckpt.codecs.pipeline import codec_summary, decide_codecs
from hpcckpt.core.encoding import encode_value
from hpcckpt.options import SaveOptions
from hpcckpt.saving.messages import Described
from hpcckpt.core.planning import plan_save
from hpcckpt.state import PerRank, split_state, summarize_for_save
from hpcckpt.storage import POSIX, Storage


def describe_state(state, rank: int, nranks: int, options: SaveOptions, step=None,
                   directory: str | None = None) -> Described:
    """This rank's part of a save, read from ``state`` now (messages.Described); no MPI.

    The layout key is taken here, before any codec summary is measured
    (:func:`measure_codecs` samples the data for ``codec="auto"``, which
    changes every save); the agreement entries and their digest are computed
    on every rank, the replicated values kept on rank 0 only.
    """
    distributed, replicated = split_state(state)
    per_rank = {name: encode_value(v.value, repr(name)) for name, v in replicated.items() if isinstance(v, PerRank)}
    values = {name: encode_value(v, repr(name)) for name, v in replicated.items() if not isinstance(v, PerRank)}
    summaries = {name: summarize_for_save(name, value) for name, value in distributed.items()}
    specs = {name: spec_to_json(getattr(value, "codec", None)) for name, value in distributed.items()}
    kinds = {name: "replicated-block" if s.get("replicated") else s["kind"] for name, s in summaries.items()}
    kinds.update({name: "per-rank" if name in per_rank else "value" for name in replicated})
    details = agreement.entry_digests(step, options, kinds, values, directory)
    return Described(summaries=summaries, distributed=distributed, specs=specs,
                     arrays={name: None if value.local is None else as_local_array(value.local)
                             for name, value in distributed.items()},
                     values=values if rank == 0 else None, per_rank=per_rank,
                     key=layout_key(nranks, options, summaries, specs), details=details,
                     digest=agreement.total(details))


def layout_key(nranks: int, options: SaveOptions, summaries: dict, specs: dict) -> str:
    """A rank's layout as a plan cache compares it: rank count, options, names, kinds, dtypes, boxes, codec specs.

    Taken before the codec summaries are measured (they sample the data, which changes every save).
    """
    return repr((nranks, options, sorted((n, sorted(s.items())) for n, s in summaries.items()),
                 sorted(specs.items())))


def measure_codecs(described: Described, options: SaveOptions) -> dict:
    """The summaries of :func:`describe_state` with each variable's codec summary added (a new dict each)."""
    return {name: {**summary, "codec": codec_summary(described.distributed[name], summary, options.codec)}
            for name, summary in described.summaries.items()}


def plan_variables(summaries: list[dict], options: SaveOptions) -> tuple:
    """Rank 0: ``(variables, boxes per rank, codec configs, replica parts per rank)`` of a version from every
    rank's summaries (pure; planning.plan_save)."""
    variables, boxes, replicas = plan_save(summaries)
    return variables, boxes, decide_codecs(variables, summaries, options.codec_threads), replicas


def create_version_directory(directory: str, storage: Storage = POSIX) -> None:
    """Rank 0: the new version's directory and its ``data/``; fails if it exists (two writers never share one)."""
    storage.make_version(directory)
