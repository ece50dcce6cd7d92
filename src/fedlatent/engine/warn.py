"""Warnings that point at the user's line: the first frame outside the fedlatent package.

A fixed ``stacklevel`` breaks whenever a frame is added between the user's call and the
warning (a multi-start, a selection); this finds the caller instead, as pandas'
``find_stack_level`` does. Standard library only: a Flower client process imports it cheaply.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

__all__ = ["SitesExcludedWarning", "user_stacklevel", "warn_user"]

class SitesExcludedWarning(UserWarning):
    """Sites were left out of a fit because they refused its setup by a disclosure rule or
    their own policy (``Federation(on_refusal="exclude")``, the default); the fit went on with
    the others."""


_PACKAGE = str(Path(__file__).resolve().parents[1])


def user_stacklevel() -> int:
    """The ``stacklevel`` of :func:`warnings.warn`, called by this function's caller, that
    names the first frame outside the fedlatent package (the user's code or a test)."""
    frame = sys._getframe(1)  # the caller of this function: stacklevel 1 for its warn
    level = 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(
            _PACKAGE):
        frame = frame.f_back
        level += 1
    return level


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the user's line."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
