"""How hpcckpt writes durations, times, sizes and tables for people: one style for the CLI and the library's text.

* durations: three significant digits and one unit glued on: ``850us``,
  ``1.4ms``, ``45s``, ``113m``, ``3.05h``, ``2.37d``; below a second us or
  ms, then seconds up to 2 minutes, minutes up to 2 hours, hours up to 2
  days, then days (``113m`` rather than ``1.88h``). From one second up the
  text is a valid DURATION argument of the ``hpcckpt`` command
  (``--cost 30.5m``).
* times: UTC, ``2026-12-01 14:03:05Z``: the commit time a version records is
  UTC (docs/format.md), and the nodes of a job and its users may sit in
  different time zones.
* sizes: ``132 B``, ``1.5 KiB``, ``16.1 MiB`` (binary units, one decimal).
* tables: aligned columns under an upper-case header row, two spaces apart,
  numbers right-aligned (:func:`table_lines`).

Pure functions, no I/O.
"""

from __future__ import annotations

import datetime as _dt
import math

__all__ = ["format_duration", "format_time", "human_bytes", "table_lines"]

_DURATION_UNITS = ((1e-3, 1e-6, "us"), (1.0, 1e-3, "ms"), (120.0, 1.0, "s"), (2 * 3600.0, 60.0, "m"),
                   (2 * 86400.0, 3600.0, "h"))


def format_duration(seconds) -> str:
    """``0.0014`` -> ``"1.4ms"``, ``6780`` -> ``"113m"``, ``None`` -> ``"?"`` (see the module docstring)."""
    if seconds is None:
        return "?"
    s = float(seconds)
    if not math.isfinite(s):
        return str(s)
    a = abs(s)
    if a == 0:
        return "0s"
    for limit, scale, unit in _DURATION_UNITS:
        if float(f"{a / scale:.3g}") * scale < limit:  # 0.9996 s is "1s", not "1e+03ms"
            return f"{s / scale:.3g}{unit}"
    days = s / 86400
    return f"{days:.3g}d" if abs(days) < 999.5 else f"{days:.0f}d"  # never "1e+03d"


def format_time(when) -> str:
    """``2026-12-01 14:03:05Z`` (UTC) of an ISO 8601 string (as metadata stores it) or a POSIX timestamp.

    ``None`` is ``-``; a string that is not ISO 8601 is returned as it is (a
    listing shows what it found rather than failing); an ISO time without a
    zone is taken as UTC, as docs/format.md writes the commit time.
    """
    if when is None:
        return "-"
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        try:
            moment = _dt.datetime.fromtimestamp(when, _dt.timezone.utc)
        except (OverflowError, OSError, ValueError):
            return str(when)
    else:
        try:
            moment = _dt.datetime.fromisoformat(str(when))
        except ValueError:
            return str(when)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=_dt.timezone.utc)
    return moment.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def human_bytes(n) -> str:
    """``132`` -> ``"132 B"``, ``1536`` -> ``"1.5 KiB"``."""
    n = int(n)
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024.0
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    return f"{n} B"  # pragma: no cover


def table_lines(rows, right=frozenset(), indent: str = "") -> list[str]:
    """``rows`` (the first one the upper-case header, every cell a string) as aligned lines; the columns whose
    index is in ``right`` (numbers) right-aligned, each line prefixed by ``indent``, no trailing blanks."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                                for i, (cell, w) in enumerate(zip(row, widths)))).rstrip() for row in rows]
