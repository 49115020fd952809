"""The registry of redundancy levels: ``LEVELS``, key -> Level class, in the order the commit runs them.

The built-in levels are registered here; another one registers itself from
its own module (``LEVELS.register(MyLevel)``) before a Checkpointer is made:
its options become Checkpointer keywords (levels.LevelOptions.from_kwargs),
its save half runs at the commit and its restore half at a restore
(levels/base.py has the call order), and nothing else needs editing.
"""

from __future__ import annotations

from hpcckpt.core.registry import Registry
from hpcckpt.levels.base import Level
from hpcckpt.levels.parity import ParityLevel
from hpcckpt.levels.partner import PartnerLevel
from hpcckpt.levels.pmem import PmemLevel
from hpcckpt.levels.rs import ReedSolomonLevel

LEVELS: Registry[Level] = Registry("level")
for _level in (PartnerLevel, ParityLevel, ReedSolomonLevel, PmemLevel):
    LEVELS.register(_level)

__all__ = ["LEVELS"]
