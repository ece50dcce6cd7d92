"""BLAS threads on a deployed site: one, for the process that answers its messages.

A site's linear algebra is on small matrices (the features' d x d: a component's
covariance factorization, a replayed M-step), where a BLAS thread pool only adds start-up and
contention. Measured on a shared two-core machine (load 3.7-4.4), GMM d = 4, K = 3, OpenBLAS
with two threads against one, alternated processes: three 4 x 4 precision factors 95-340 us of
CPU against 11 us; the server's M-step a verifying site replays 384-12,079 us against
70-75 us; in a fresh process (a deployed ClientApp starts one per message) a message's linear
algebra (that M-step, the lean replay, three factorizations) 45-106 ms against 1.3-1.5 ms
(one run in a quieter minute: 2.3 ms both ways; the pools' contention is what costs). The cost
is SciPy's OpenBLAS (NumPy's on these sizes: no difference measured), which a site loads only
when it needs it (a verifying site's replay).

So a deployed site's ClientApp, at its first message (:func:`pin_blas`), sets
``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS`` for the BLAS libraries its
process loads from then on (unless the site set them: its own values stand), at ~40 us and
without importing anything (the lean client path imports no SciPy); in a process that loaded
SciPy's before, every loaded BLAS is limited where it is, with threadpoolctl (~4 ms: it scans
the loaded libraries). OpenMP pools (numba's kernels) keep their threads. Limiting around
each message in a long-lived process would cost more than it saves (``threadpool_limits``
scans at every call, ~0.5 ms; setting OpenBLAS back to two threads costs ~0.2 ms at its next
call). The node
config's ``blas-threads`` sets the number (default 1; 0 leaves the libraries' own). A
simulation's nodes share the server's process and are left alone.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

__all__ = ["BLAS_THREADS", "blas_threads", "pin_blas"]

logger = logging.getLogger(__name__)

#: the node config key, and its default: one thread
BLAS_THREADS = "blas-threads"
_KEPT: list = []  # set once: the limit of libraries loaded before (None: none), kept alive
#: the variables BLAS libraries read when they load (not OpenMP's: numba's kernels keep theirs)
_ENV = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: modules whose BLAS, loaded before the first message, is limited where it is
_LOADED = ("scipy.linalg", "sklearn", "torch")


def blas_threads(node_config: dict[str, Any]) -> int:
    """The BLAS threads a deployed node's config asks for (``blas-threads``, default 1; 0:
    the libraries' own). ValueError naming the key for anything but a whole number >= 0."""
    raw = node_config.get(BLAS_THREADS, 1)
    try:
        n = int(raw)
        ok = n >= 0 and float(raw) == n
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"node config {BLAS_THREADS}={raw!r}: expected a whole number >= 0 "
                         "(1, the default: one BLAS thread; 0: leave the libraries' own)")
    return n


def pin_blas(node_config: dict[str, Any]) -> bool:
    """Limit this process's BLAS pools to :func:`blas_threads` threads, once per
    process (later calls change nothing): the environment of the libraries loaded from now
    on, and those loaded already beyond NumPy's; whether this call set the limit."""
    threads = blas_threads(node_config)
    if _KEPT or threads == 0:
        return False
    limit = None
    for key in _ENV:  # (read by a library when it loads; a site's own setting stands)
        os.environ.setdefault(key, str(threads))
    if any(m in sys.modules for m in _LOADED):  # a BLAS loaded already: limit it there
        from threadpoolctl import ThreadpoolController

        limit = ThreadpoolController().limit(limits=threads, user_api="blas")
    _KEPT.append(limit)  # (once per process)
    logger.info("BLAS pools limited to %d thread(s) for this site process", threads)
    return True
