"""Compression of checkpoint chunks: lossless (numcodecs: blosc, zstd, lz4) and error-bounded lossy.

Spellings accepted wherever a ``codec=`` keyword is (``Block``, ``Ragged``,
``save``, ``Checkpointer``): a name (``"none"``, ``"auto"``, ``"lz4"``,
``"zstd"``, ``"lz4hc"``, ``"shuffle+lz4"``, ``"shuffle+zstd"``, ``"blosc2"``,
``"blosc2-zstd"``, ``"blosc2-lz4"``, ``"blosc2-lz4hc"``, ``"blosc2-blosclz"``), a
:class:`Lossy` (``Lossy(abs=...)`` or ``Lossy(rel=...)``), a :class:`Blosc2`
(C-Blosc2, needs the ``blosc2`` package), :class:`SZ3`
(``SZ3(abs=|rel=|pw_rel=...)``), :class:`ZFP` (``ZFP(accuracy=|precision=|rate=|reversible=...)``), :class:`AutoLossy`
(``AutoLossy(abs=|rel=...)``: one of Lossy, SZ3, ZFP per variable, picked at save time), a numcodecs codec
object of a whitelisted kind, or its config dict.  See docs/compression.md.
"""

from hpcckpt.codecs.core import AUTO, NAMES, Codec, from_config, resolve, spec_to_json
from hpcckpt.codecs.blosc2_codec import Blosc2
from hpcckpt.codecs.lossy import Lossy
from hpcckpt.codecs.sz3 import SZ3  # SZ3 and ZFP families: pysz / zfpy are imported when used
from hpcckpt.codecs.zfp import ZFP
from hpcckpt.codecs.auto_lossy import AutoLossy  # the lossy codec per variable, picked at save time at the user's bound

__all__ = ["Lossy", "AutoLossy", "Blosc2", "SZ3", "ZFP", "Codec", "NAMES", "AUTO", "resolve", "from_config", "spec_to_json"]
