"""The first stages of every save: describe this rank's state, then plan the version on rank 0.

Shared by the blocking and the incremental save (the asynchronous engine keeps
its own cached plan, built from the same planner), so that what a rank hands
over and how the global layout is decided are written once.
"""

from __future__ import annotations

import os

from .codecs.pipeline import codec_summary, decide_codecs
from .encoding import encode_value
from .names import DATA_DIR
from .options import SaveOptions
from .planning import plan_save
from .state import split_state, summarize_for_save


def describe_state(state, rank: int, options: SaveOptions) -> dict:
    """This rank's part of a save: ``summaries`` (what it holds, for the planner), ``arrays`` (its buffers,
    read now) and, on rank 0, ``values`` (the replicated values in their JSON form); no MPI."""
    distributed, replicated = split_state(state)
    summaries = {name: summarize_for_save(name, value) for name, value in distributed.items()}
    for name, value in distributed.items():
        summaries[name]["codec"] = codec_summary(value, summaries[name], options.codec)
    arrays = {name: value.local for name, value in distributed.items()}
    values = {name: encode_value(v, repr(name)) for name, v in replicated.items()} if rank == 0 else None
    return {"summaries": summaries, "arrays": arrays, "values": values}


def plan_and_prepare(summaries: list[dict], directory: str, options: SaveOptions) -> tuple:
    """Rank 0: ``(variables, boxes per rank, codec configs)`` of the version, and its new ``data/`` directory."""
    variables, boxes = plan_save(summaries)
    codecs = decide_codecs(variables, summaries, options.codec_threads)
    os.makedirs(os.path.join(directory, DATA_DIR), exist_ok=False)
    return variables, boxes, codecs
