"""Where fedlatent's numba kernels run, and the one line a process prints when it compiles them.

numba's set-up costs a process about half a CPU second (its import, its type registries and the
cached kernel's loading), more than a small fit spends in the arithmetic a kernel speeds up; a
kernel missing from numba's on-disk cache compiles in one to a few seconds, once per machine.
So a kernel runs only where it pays: when the work is large (:func:`worth`), or when numba is
already set up in the process (:func:`ready`: one more cached kernel costs milliseconds). Small
problems stay on NumPy and a process that meets only small problems never imports numba.

A kernel module is imported through :func:`kernels`, which says, once per process and only when
numba will compile (no cache of a kernel of that module on disk), what it is doing::

    fedlatent: compiling its numba kernels for fedlatent.models.gmm.hardsums, once for this
    machine (a few seconds; cached for every later run)

(a ``logging`` warning: shown without any logging set-up; silence it with
``logging.getLogger("fedlatent").setLevel(logging.ERROR)``).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import logging
import sys
from contextlib import contextmanager
from pathlib import Path

__all__ = ["MIN_WORK", "at_scale", "kernels", "ready", "worth"]

logger = logging.getLogger(__name__)

#: work (matrices screened, rows labelled...) from which a call's kernel is worth numba's set-up
MIN_WORK = 50_000
_ANNOUNCED: set[str] = set()
#: the work of the whole call a kernel's caller is a part of (:func:`at_scale`)
_SCALE: contextvars.ContextVar[int] = contextvars.ContextVar("fedlatent_work", default=0)


def ready() -> bool:
    """Whether numba's compiler is already set up in this process (a compiled call ran: its
    type registries are loaded), when one more cached kernel costs milliseconds. Imports
    nothing; False whenever numba's internals do not say."""
    registry = sys.modules.get("numba.core.registry")
    typing = vars(getattr(registry, "cpu_target", None) or object).get(
        "_toplevel_typing_context")
    return bool(getattr(typing, "_registries", None))  # filled by the first compiled call


def worth(work: int, minimum: int | None = None) -> bool:
    """Whether a kernel should do ``work`` units (matrices, rows...): numba is set up already,
    or the work, or that of the whole call it is a part of (:func:`at_scale`), is at least
    ``minimum`` (default :data:`MIN_WORK`)."""
    return ready() or max(int(work), _SCALE.get()) >= int(
        MIN_WORK if minimum is None else minimum)


@contextmanager
def at_scale(work: int):
    """Within it, :func:`worth` judges by ``work`` at least: the caller cuts a large call
    (a batched query of every client's rows) into chunks, each small alone."""
    token = _SCALE.set(max(int(work), _SCALE.get()))
    try:
        yield
    finally:
        _SCALE.reset(token)


@functools.cache
def kernels(module: str):
    """The kernel module ``module`` (imported), after the one line saying that numba compiles
    its kernels when none of them is in numba's on-disk cache (once per process and module);
    kept, so that a caller of every round calls it as it is."""
    mod = importlib.import_module(module)
    if module not in _ANNOUNCED:
        _ANNOUNCED.add(module)
        if _uncached(mod):
            logger.warning("fedlatent: compiling its numba kernels for %s, once for this "
                           "machine (a few seconds; cached for every later run)", module)
    return mod


def _uncached(mod) -> bool:
    """Whether no compiled function of ``mod`` has an index in numba's on-disk cache (nor is
    compiled in this process): its first call compiles. False when numba does not say."""
    found = False
    for fn in vars(mod).values():
        stats = getattr(fn, "stats", None)
        if stats is None or not hasattr(fn, "py_func") or fn.__module__ != mod.__name__:
            continue
        found = True
        if getattr(fn, "signatures", None):
            return False
        try:
            where = Path(stats.cache_path)
            stem = Path(mod.__file__).stem
            if any(where.glob(f"{stem}.{fn.py_func.__qualname__}-*.nbi")):
                return False
        except (AttributeError, TypeError, OSError):
            return False
    return found
