"""Warnings attributed to the application's call, never to a line of hpcckpt's own.

A warning raised deep inside a save (the writer lock taken over after a crash,
a bookkeeping file that cannot be written) is printed by Python with the file,
line and source text of the frame its ``stacklevel`` names.  A fixed
``stacklevel`` names whichever hpcckpt helper happens to sit at that depth,
which reads like a bug in hpcckpt; :func:`warn` names the innermost frame
outside the hpcckpt package instead: the application's ``ck.save(...)``.
"""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the innermost caller outside the hpcckpt package.

    On a thread that hpcckpt started, that is a frame of Python's ``threading``;
    where no frame outside the package exists, the outermost frame is named.
    """
    warnings.warn(message, category, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in :func:`warn` name the first frame outside hpcckpt.

    Frames are counted as ``warnings.warn`` counts them: importlib's bootstrap
    frames are stepped over without being counted.
    """
    frame, level = _next_external(sys._getframe(1)), 2  # the caller of warn()
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        outer = _next_external(frame)
        if outer is None:
            break
        frame, level = outer, level + 1
    return level


def _next_external(frame):
    """The next frame outwards that is not one of importlib's bootstrap frames (as ``warnings`` skips them)."""
    frame = frame.f_back
    while frame is not None and "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename:
        frame = frame.f_back
    return frame
