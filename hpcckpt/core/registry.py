"""One generic registry for a plug-in family: a name -> class mapping that plug-ins register into.

A family (the redundancy levels, say) keeps one :class:`Registry`; each
plug-in registers its class under its name, built-in ones by the module
that lists them, others from any code before use.  Whatever the family
looks up by name (an option's value, a key in a version's metadata) goes
through :meth:`Registry.get`, so a plug-in arrives without editing a central
list, and an unknown name is one CheckpointError naming the known ones.
Insertion order is kept: it is the order the family runs its members in.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from hpcckpt.errors import CheckpointError

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """``name -> class`` of one plug-in family; ``family`` names it in error messages ("level")."""

    def __init__(self, family: str):
        super().__init__()
        self.family = family

    def register(self, cls: type[T], name: str | None = None) -> type[T]:
        """Register ``cls`` under ``name`` (default: its ``key`` attribute); returns ``cls`` (a class decorator).

        Registering a name again replaces the class and keeps its place in the order.
        """
        name = getattr(cls, "key", None) if name is None else name
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"a {self.family} needs a non-empty name to be registered, got {name!r}")
        self[name] = cls
        return cls

    def get(self, name: str) -> type[T]:  # type: ignore[override]
        """The class registered as ``name``; a CheckpointError naming the registered ones otherwise."""
        try:
            return self[name]
        except (KeyError, TypeError):
            raise CheckpointError(f"unknown {self.family} {name!r}; registered: {', '.join(self) or 'none'}") \
                from None


__all__ = ["Registry"]
