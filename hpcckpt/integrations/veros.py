"""Checkpoint/restart for Veros 1.7 setups: one mixin class, configured by Veros settings.

Usage (the one added line is the base class)::

    from hpcckpt.integrations.veros import Checkpointing
    class MySetup(Checkpointing, VerosSetup): ...      # or (Checkpointing, ACCSetup)

What it does, and why each piece is where it is:

* **Settings.**  The mixin adds this module as a Veros plugin, whose
  settings (``checkpoint_dir``, ``checkpoint_frequency``, ``checkpoint_keep``,
  ``checkpoint_restore``, ``checkpoint_cast``; see :data:`SETTINGS`) are set
  like any Veros setting: in ``set_parameter`` or ``Setup(override={...})``.
  A plugin alone cannot do the rest: its run entry point is called inside the
  step, before ``itt`` advances and the time levels rotate.
* **Where it saves.**  After ``step()`` returns: the step done, diagnostics
  done, ``taum1, tau, taup1`` rotated, ``itt`` advanced -- the same boundary
  at which Veros writes its own restart (the start of the next step).
  ``after_timestep`` is the wrong place (it runs before the diagnostics and
  the rotation).  ``maybe_save(itt)`` decides (hpcckpt's policy, or every
  ``checkpoint_frequency`` model seconds).
* **What it saves.**  Every variable Veros writes to its restart files (core
  and diagnostics, the overturning accumulators included) plus ``itt``, which
  Veros' restart lacks, each as the ghost-padded global array: a rank's Block
  is its interior plus the ghost cells at the global edges (which hold data:
  the cyclic copies), Veros' own ``include_overlap`` split.  An array with
  only one of the x and y axes (the overturning accumulators: y only) is the
  same on every rank of a row of the process grid: ``replicated=True``.
  Also saved: ``float_type`` and the start time of the first run.
* **Restore.**  At the end of ``setup()`` (where Veros reads its restart
  file), on any process grid: each rank fills its part, then Veros' own
  ``exchange_overlap`` fills the inner halos.  A checkpoint of another float
  type needs ``checkpoint_cast=True`` (without it, one CheckpointError on
  every rank).
* **runlen.**  The length of the whole run from its first start: a restored
  run runs what is left (a larger ``runlen`` on a restart extends the run).
* **Signals.**  SIGTERM/SIGUSR1/SIGINT, the halt file (``hpcckpt halt
  ROOT``) and a SLURM deadline make the next boundary a final checkpoint on
  every rank, then Veros' loop ends there, cleanly, on every rank.  Veros'
  ``run()`` installs its own SIGTERM/SIGINT handler (raising SystemExit
  wherever the signal lands, which deadlocks an MPI job); hpcckpt installs
  its handlers at the first boundary, chains to Veros' and holds its
  SystemExit until the final checkpoint is committed; the mixin then ends
  the run as it ends on the other ranks.  :attr:`Checkpointing.stop_reason`
  says why a run stopped early ('SIGTERM', ...), None otherwise.
* **End of run.**  A run that reaches its end saves a last checkpoint (as
  Veros writes its restart file at the end).
"""

from __future__ import annotations

import numpy as np
from veros import logger, runtime_settings, runtime_state
from veros.distributed import SCATTERED_DIMENSIONS, exchange_overlap, get_chunk_slices
from veros.settings import Setting
from veros.variables import get_shape

import hpcckpt
from hpcckpt.policy import FixedSteps

__all__ = ["Checkpointing", "SETTINGS", "checkpoint_state", "restore_state", "own_part", "is_replicated"]

#: The plugin's Veros settings.
SETTINGS = {
    "checkpoint_dir": Setting("{identifier}.checkpoints", str,
                              "hpcckpt checkpoint root (may contain format strings of settings)"),
    "checkpoint_frequency": Setting(0.0, float, "Checkpoint every this many model seconds "
                                               "(0: hpcckpt's default policy)"),
    "checkpoint_keep": Setting(2, int, "Checkpoint versions kept"),
    "checkpoint_restore": Setting(True, bool, "Restore the newest checkpoint in checkpoint_dir, if any"),
    "checkpoint_cast": Setting(False, bool, "Restore a checkpoint of another float type by casting"),
}


def _no_op(state):
    """The plugin's setup and run entry points: the mixin does the work, at places a plugin is not called."""


#: Veros reads this (veros.plugins.load_plugin): the plugin contributes the settings only.
__VEROS_INTERFACE__ = {"name": "hpcckpt", "setup_entrypoint": _no_op, "run_entrypoint": _no_op, "settings": SETTINGS}


def _restart_groups(state):
    """``(group, dimensions, variables, metas)`` of every set of variables Veros writes to its restart files.

    ``group``: where in the (nested) hpcckpt state they go: ``("core",)`` or ``("diagnostics", name)``.
    """
    yield ("core",), state.dimensions, state.variables, state.var_meta
    for name, diagnostic in state.diagnostics.items():
        if diagnostic.var_meta:
            dims = dict(state.dimensions)
            dims.update(diagnostic.extra_dimensions or {})
            yield ("diagnostics", name), dims, diagnostic.variables, diagnostic.var_meta


def _slot(tree: dict, group: tuple) -> dict:
    """The dict at ``group`` in a nested dict, made on the way when missing."""
    for part in group:
        tree = tree.setdefault(part, {})
    return tree


def _restart_metas(metas):
    """The variables Veros' own restart writes (veros.restart.write_restart's selection)."""
    return {name: meta for name, meta in metas.items() if meta.write_to_restart and meta.active}


def own_part(dims, dimensions, proc_idx=None):
    """A rank's ``(offset in the padded global array, local slices)``: Veros' ``include_overlap`` split.

    The interior plus the ghost cells at the global edges, so the ranks' parts
    tile the ghost-padded global array.  ``proc_idx``: the rank's ``(px, py)``
    in the process grid (default: this rank's).
    """
    gidx, lidx = get_chunk_slices(dimensions["xt"], dimensions["yt"], dims, proc_idx=proc_idx, include_overlap=True)
    return tuple(s.start or 0 for s in gidx), lidx


def is_replicated(dims) -> bool:
    """Whether an array of these Veros dimensions is the same on several ranks: without both an x and a y axis
    it is the same on every rank of a grid row or column (the overturning accumulators: y only), or
    everywhere."""
    return not all(any(d in group for d in dims) for group in SCATTERED_DIMENSIONS)


def _block(local, dims, dimensions):
    """The Block of a ghost-padded local array."""
    offset, lidx = own_part(dims, dimensions)
    return hpcckpt.Block(local[lidx], offset=offset, global_shape=get_shape(dimensions, dims, local=False),
                         replicated=is_replicated(dims))


def checkpoint_state(state, start_time: float) -> dict:
    """The hpcckpt state of a Veros state: its restart variables, ``itt``, ``float_type`` and ``start_time``."""
    out = {}
    for group, dimensions, variables, metas in _restart_groups(state):
        for name, meta in _restart_metas(metas).items():
            _slot(out, group)[name] = _entry(np.asarray(getattr(variables, name)), meta.dims, dimensions)
    out["itt"] = np.asarray(state.variables.itt)
    out["hpcckpt_veros"] = {"float_type": runtime_settings.float_type, "start_time": float(start_time)}
    return out


def _entry(value, dims, dimensions):
    return _block(value, dims, dimensions) if dims else value


def restore_state(ck, state, cast: bool) -> float:
    """Restore the newest checkpoint of ``ck`` into the Veros state, on this run's grid; the run's start time.

    Each rank's part of every array is filled into a new ghost-padded array,
    whose inner halos Veros' ``exchange_overlap`` then fills (as Veros' own
    restart reader does); the part is then put back as saved, since that
    exchange also overwrites the cyclic edge ghosts, which some variables
    (``dtemp``, ``K_diss_v``, ...) do not keep in sync between steps.
    """
    padded, template = {}, {}
    for group, dimensions, variables, metas in _restart_groups(state):
        for name, meta in _restart_metas(metas).items():
            padded[group, name] = np.empty_like(np.asarray(getattr(variables, name)))
            _slot(template, group)[name] = _entry(padded[group, name], meta.dims, dimensions)
    template["itt"] = np.asarray(state.variables.itt)
    template["hpcckpt_veros"] = {"float_type": "", "start_time": 0.0}
    restored = ck.restore(template, cast=cast)
    cyclic = state.settings.enable_cyclic_x
    for group, dimensions, variables, metas in _restart_groups(state):
        values = _slot(restored, group)
        with variables.unlock():
            for name, meta in _restart_metas(metas).items():
                value = values[name]
                if meta.dims:
                    _, lidx = own_part(meta.dims, dimensions)
                    part = padded[group, name][lidx].copy()  # as saved, edge ghosts included
                    value = np.array(exchange_overlap(padded[group, name], meta.dims, cyclic))
                    value[lidx] = part
                setattr(variables, name, value)
    with state.variables.unlock():
        state.variables.itt = restored["itt"]
    return float(restored["hpcckpt_veros"]["start_time"])


class Checkpointing:
    """Mixin for a ``VerosSetup`` subclass: checkpoints at step boundaries, restore, clean stop (module doc)."""

    #: Why the last run() stopped before its end ('SIGTERM', the halt file, the deadline), or None.
    stop_reason = None

    def __init__(self, *args, **kwargs):
        import sys

        plugins = tuple(getattr(type(self), "__veros_plugins__", ()))
        me = sys.modules[__name__]
        if me not in plugins:
            self.__veros_plugins__ = plugins + (me,)
        self.checkpointer = None
        self._run_start = None  # vs.time when run() started (None outside run(): step() called directly)
        super().__init__(*args, **kwargs)

    def setup(self):
        super().setup()
        state, settings = self.state, self.state.settings
        statedict = dict(state.variables.items())
        statedict.update(settings.items())
        root = settings.checkpoint_dir.format(**statedict)
        policy = None
        if settings.checkpoint_frequency > 0:
            policy = FixedSteps(max(1, round(settings.checkpoint_frequency / settings.dt_tracer)))
        self.checkpointer = ck = hpcckpt.Checkpointer(root, comm=runtime_settings.mpi_comm,
                                                      keep=settings.checkpoint_keep, policy=policy)
        self._start_time = float(state.variables.time)
        if settings.checkpoint_restore and ck.latest() is not None:
            try:
                self._start_time = restore_state(ck, state, settings.checkpoint_cast)
            except hpcckpt.TemplateMismatchError as exc:
                raise hpcckpt.TemplateMismatchError(
                    f"{exc} (this run: float_type {runtime_settings.float_type}, {settings.nx}x{settings.ny}"
                    f"x{settings.nz}; a checkpoint of another float type restores with checkpoint_cast=True)"
                ) from exc
            logger.info(f"hpcckpt: restored iteration {int(state.variables.itt)} from {ck.last_restored} "
                        f"on {runtime_state.proc_num} process(es)")
        ck.register(lambda: checkpoint_state(self.state, self._start_time))

    def step(self, state):
        super().step(state)
        ck = self.checkpointer
        if ck is None:
            return
        itt = int(state.variables.itt)
        try:
            last = self._run_start is not None and not state.variables.time - self._run_start < state.settings.runlen
            if last:  # Veros' loop ends after this step (run()'s own test): a last checkpoint, as Veros writes
                ck.save(itt)  # its restart file there
            else:
                ck.maybe_save(itt)
        except SystemExit:  # Veros' run() handler, held by hpcckpt until the final checkpoint was committed
            if not ck.should_exit():
                raise
        if ck.should_exit():
            self.stop_reason = ck.stop_reason
            logger.warning(f"hpcckpt: checkpoint of iteration {itt} written ({self.stop_reason}); stopping")
            with state.settings.unlock():
                state.settings.runlen = 0.0  # ends Veros' loop after this step, on every rank alike

    def run(self, show_progress_bar=None):
        settings, vs = self.state.settings, self.state.variables
        runlen = settings.runlen
        with settings.unlock():  # runlen counts from the first start, across restarts
            settings.runlen = max(0.0, self._start_time + runlen - float(vs.time))
        self.stop_reason, self._run_start = None, vs.time  # run()'s start_time
        try:
            super().run(show_progress_bar=show_progress_bar)
        finally:
            self._run_start = None
            with settings.unlock():
                settings.runlen = runlen
            if self.checkpointer is not None:
                self.checkpointer.close()
                self.checkpointer = None
