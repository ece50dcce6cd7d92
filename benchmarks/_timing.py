"""Part timers the benchmarks share: a function's calls timed on the thread's CPU clock.

Imported by path (the scripts run as ``python benchmarks/bench_*.py``, which puts this folder
first on ``sys.path``). A part is ``(owner, attribute, label)``: the function ``owner.attribute``
is replaced, while :func:`timed` holds, by one that adds the CPU seconds of each call into
``acc[label]`` (about a microsecond a call); a part nested in another is counted in both.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import time
from collections.abc import Callable, Iterable


def clocked(f, label: str, acc: collections.Counter, gate: Callable[[], bool] | None = None):
    """``f`` adding the thread's CPU seconds of each call into ``acc[label]`` (only the calls
    made while ``gate()`` is true, when a gate is given)."""

    @functools.wraps(f)
    def g(*a, **kw):
        if gate is not None and not gate():
            return f(*a, **kw)
        t0 = time.thread_time()
        try:
            return f(*a, **kw)
        finally:
            acc[label] += time.thread_time() - t0

    return g


@contextlib.contextmanager
def timed(parts: Iterable[tuple], acc: collections.Counter,
          gate: Callable[[], bool] | None = None):
    """Every part ``(owner, attribute, label)`` wrapped by :func:`clocked` into ``acc`` while
    the block runs (put back after it, also on an error)."""
    parts = list(parts)
    undo = [(owner, name, getattr(owner, name)) for owner, name, _ in parts]
    for (owner, name, f), (_, _, label) in zip(undo, parts):
        setattr(owner, name, clocked(f, label, acc, gate))
    try:
        yield acc
    finally:
        for owner, name, f in undo:
            setattr(owner, name, f)
