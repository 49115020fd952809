"""hpcckpt.core.humanize: the one style of durations, times and sizes that every command and message uses."""

from __future__ import annotations

import datetime as dt
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcckpt.cli.common import parse_duration
from hpcckpt.core.humanize import format_duration, format_time, human_bytes, table_lines

UNIT_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (6.3e-6, "6.3us"), (0.0014, "1.4ms"), (0.07, "70ms"),
                                          (0.9996, "1s"), (45, "45s"), (95.3, "95.3s"), (1832, "30.5m"),
                                          (6780, "113m"), (3 * 3600, "3h"), (204768, "2.37d"), (-5, "-5s"),
                                          (None, "?"), (math.inf, "inf")])
def test_durations(seconds, text):
    assert format_duration(seconds) == text


@given(st.floats(min_value=1e-7, max_value=1e9, allow_nan=False))
def test_a_duration_is_three_digits_and_one_unit_within_half_a_percent(seconds):
    text = format_duration(seconds)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms|s|m|h|d)", text)
    assert m, text
    number, unit = float(m.group(1)), m.group(2)
    assert number < 1000 or unit == "d", text
    assert unit == "us" or number >= 1 or text == "0s", text  # never 0.5m: the smaller unit is used
    assert math.isclose(number * UNIT_SECONDS[unit], seconds, rel_tol=5e-3), (seconds, text)
    if seconds >= 1 and unit not in ("us", "ms"):  # from one second up, a valid DURATION argument
        assert math.isclose(parse_duration(text), seconds, rel_tol=5e-3)


def test_times_are_utc_with_a_z():
    assert format_time("2026-11-29T20:50:58+00:00") == "2026-11-29 20:50:58Z"
    assert format_time("2026-11-29T21:50:58+01:00") == "2026-11-29 20:50:58Z"
    assert format_time("2026-11-29T20:50:58") == "2026-11-29 20:50:58Z"  # no zone: UTC, as format.md writes it
    assert format_time(0) == "1970-01-01 00:00:00Z"
    assert format_time(None) == "-" and format_time("not a time") == "not a time"
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    assert format_time(now.timestamp()) == format_time(now.isoformat()) == now.strftime("%Y-%m-%d %H:%M:%SZ")


@pytest.mark.parametrize("n,text", [(0, "0 B"), (132, "132 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                    (16_883_712, "16.1 MiB"), (3 << 40, "3.0 TiB")])
def test_sizes(n, text):
    assert human_bytes(n) == text


def test_tables_align_under_the_header_and_right_align_numbers():
    rows = [("NAME", "SIZE", "NOTE"), ("u", "16.1 MiB", ""), ("particles", "132 B", "ragged")]
    assert table_lines(rows, right={1}, indent="  ") == [
        "  NAME           SIZE  NOTE",
        "  u          16.1 MiB",
        "  particles     132 B  ragged"]
