"""hpcckpt's warnings name the application's line: the innermost frame outside the hpcckpt package."""

from __future__ import annotations

import os
import sys
import threading
import warnings

import pytest

from hpcckpt.core.warn import warn
from hpcckpt.mpi.collective import best_effort, on_root, resolve_comm


def _fail():
    raise OSError("disk full")


def test_a_warning_several_hpcckpt_frames_deep_names_the_callers_line():
    comm = resolve_comm(None)
    with pytest.warns(RuntimeWarning, match="bookkeeping failed") as caught:
        on_root(comm, lambda: best_effort("bookkeeping", _fail)); line = _line()
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]


def test_a_warning_from_a_direct_call_names_the_callers_line():
    with pytest.warns(UserWarning, match="direct") as caught:
        warn("hpcckpt: direct"); line = _line()
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]


def test_a_warning_on_a_thread_of_hpcckpt_names_the_first_frame_outside_the_package():
    thread = threading.Thread(target=best_effort, args=("bookkeeping", _fail))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread.start()
        thread.join()
    assert [os.path.basename(w.filename) for w in caught] == ["threading.py"]


def _line() -> int:
    """The line number of the caller's line."""
    return sys._getframe(1).f_lineno
