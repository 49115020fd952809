"""What a state stands for, read at the moment of a save or a restore (the one place that resolves it).

A state may be

* a dict (as always): ``{"u": Block(u, ...), "step": 3}``;
* an object with ``state_dict()`` and ``load_state_dict(d)`` (the Stateful
  protocol of torch.distributed.checkpoint): ``state_dict()`` is called at
  every save and at the start of every restore (the template), and
  ``load_state_dict(restored)`` once a restore has succeeded;
* a callable returning the state dict, called at every save and restore.

Inside the dict, a ``Block`` or ``Ragged`` may be built from a getter
(``Block(lambda: u, offset, global_shape)``): the getter is called at every
save (the array saved is the one it returns then) and at every restore (the
array it returns is filled in place).  A value that is itself a Stateful
object is resolved the same way, and gets ``load_state_dict`` at a restore.

Nested state: a dict value that holds a Block or Ragged (at any depth) is a
group; its entries are stored under path names ``"group/name"``
(:data:`SEPARATOR`) and restored with the same nesting.  A key inside a group
may not contain the separator.  Any other dict value is a replicated value,
stored whole, as at the top level.

Every kind of save gets the resolution from saving.pipeline.describe (once per
save, at its start, inside the agreed describe stage) and every restore from
loading.load_version (inside its agreed template check): a getter or
``state_dict()`` that raises on one rank is the same TemplateMismatchError on
every rank.  No I/O, no MPI here.
"""

from __future__ import annotations

from typing import Any

from hpcckpt.errors import TemplateMismatchError
from hpcckpt.state import Block, Ragged, is_distributed

#: Joins the keys of nested dicts into one stored variable name ("fluid/u").
SEPARATOR = "/"

#: Nested groups deeper than this are refused (a dict that contains itself).
MAX_DEPTH = 32


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` follows the Stateful protocol (``state_dict()`` and ``load_state_dict(d)``)."""
    return (not isinstance(obj, dict) and callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None)))


def state_dict_of(state: Any, where: str = "the state") -> dict:
    """The dict ``state`` stands for now: itself, its ``state_dict()``, or what the callable returns."""
    if isinstance(state, dict):
        return state
    if is_stateful(state):
        how = f"{type(state).__name__}.state_dict()"
        d = _call(state.state_dict, where, how)
    elif callable(state):
        how = f"the callable {getattr(state, '__name__', type(state).__name__)!s}"
        d = _call(state, where, how)
    else:
        raise TemplateMismatchError(
            f"{where} must be a dict, an object with state_dict()/load_state_dict(), or a callable returning a "
            f"dict; got {type(state).__name__}")
    if not isinstance(d, dict):
        raise TemplateMismatchError(f"{where}: {how} returned {type(d).__name__}, not a dict")
    return d


def _call(fn, where: str, how: str):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - turned into the error every rank raises alike
        raise TemplateMismatchError(f"{where}: {how} raised {type(exc).__name__}: {exc}") from exc


def _getter_name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def materialize(state: Any) -> dict:
    """``state`` as a tree of plain dicts, read now: Stateful objects and callables resolved, getters called.

    The tree keeps the nesting of the state; :func:`flatten` names its leaves.
    """
    return _materialize(state_dict_of(state), "the state", 0)


def _materialize(d: dict, where: str, depth: int) -> dict:
    if depth > MAX_DEPTH:
        raise TemplateMismatchError(f"{where}: nested dicts deeper than {MAX_DEPTH} (or a dict that contains itself)")
    out = {}
    for key, value in d.items():
        here = f"variable {key!r}" if depth == 0 else f"{where}{SEPARATOR}{key}"
        if is_stateful(value):
            value = _materialize(state_dict_of(value, here), here, depth + 1)
        elif isinstance(value, dict):
            value = _materialize(value, here, depth + 1) if _holds_distributed(value, 0) else value
        elif isinstance(value, Block) and callable(value.local):
            arr = _call(value.local, here, f"the Block's getter {_getter_name(value.local)}")
            value = Block(arr, value.offset, value.global_shape, value.codec, value.replicated)
        elif isinstance(value, Ragged) and callable(value.local):
            arr = _call(value.local, here, f"the Ragged's getter {_getter_name(value.local)}")
            value = Ragged(arr, value.rows, value.codec)
        out[key] = value
    return out


def _holds_distributed(value: Any, depth: int) -> bool:
    """Whether a dict holds a Block, Ragged or Stateful object at any depth (then it is a group)."""
    if depth > MAX_DEPTH:
        return False
    return any(is_distributed(v) or is_stateful(v) or (isinstance(v, dict) and _holds_distributed(v, depth + 1))
               for v in value.values())


def flatten(tree: dict) -> dict:
    """The flat state a save stores: the leaves of ``tree`` under their path names ("fluid/u")."""
    flat: dict = {}
    _flatten(tree, "", flat)
    return flat


def _flatten(tree: dict, prefix: str, flat: dict) -> None:
    for key, value in tree.items():
        if prefix:
            if not isinstance(key, str) or not key:
                raise TemplateMismatchError(f"group {prefix[:-1]!r}: keys must be non-empty strings, got {key!r}")
            if SEPARATOR in key:
                raise TemplateMismatchError(f"group {prefix[:-1]!r}: key {key!r} contains {SEPARATOR!r}, which "
                                            "joins the keys of nested dicts into stored names")
        name = f"{prefix}{key}" if prefix else key
        if isinstance(value, dict) and _is_group(value):
            _flatten(value, f"{name}{SEPARATOR}", flat)
            continue
        if name in flat:
            raise TemplateMismatchError(f"variable {name!r} is named twice (a key with {SEPARATOR!r} and a nested dict)")
        flat[name] = value


def _is_group(value: dict) -> bool:
    """A materialized dict is a group when it holds a Block or Ragged at any depth (up to MAX_DEPTH: a deeper
    or self-containing dict is a replicated value, refused by the value encoding with its own message)."""
    return _holds_distributed(value, 0)


def resolve(state: Any) -> dict:
    """The flat state dict a save of ``state`` writes, read now (the start of every save)."""
    return flatten(materialize(state))


def unflatten(flat: dict, tree: dict) -> dict:
    """The restored values of ``flat`` (by path name) in the nesting of ``tree`` (the template)."""
    return _unflatten(flat, tree, "")


def _unflatten(flat: dict, tree: dict, prefix: str) -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}" if prefix else key
        if isinstance(value, dict) and _is_group(value):
            out[key] = _unflatten(flat, value, f"{name}{SEPARATOR}")
        else:
            out[key] = flat[name]
    return out


def deliver(state: Any, restored: dict) -> None:
    """Hand a restore's result back: ``load_state_dict`` of every Stateful object in ``state`` (outermost first).

    A Stateful object gets the whole restored dict of its part (nested
    Stateful values inside its own state_dict are left to it); plain dicts are
    walked into.
    """
    if is_stateful(state):
        state.load_state_dict(restored)
    elif isinstance(state, dict):
        for key, value in state.items():
            if (is_stateful(value) or isinstance(value, dict)) and isinstance(restored.get(key), dict):
                deliver(value, restored[key])
