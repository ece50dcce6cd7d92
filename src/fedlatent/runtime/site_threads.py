"""BLAS threads on a deployed site: one, for the process that answers its messages.

A site's linear algebra is on small matrices (the features' d x d: a component's
covariance factorization, a replayed M-step), where a BLAS thread pool only adds start-up and
contention. Measured on a shared two-core machine (load 3.7-4.4), GMM d = 4, K = 3, OpenBLAS
with two threads against one, one process each, alternated: three 4 x 4 precision factors
95-340 us of CPU against 11 us; the server's M-step a verifying site replays 384-12,079 us
against 70-75 us; in a fresh process (a deployed ClientApp starts one per message) a message's
linear algebra (that M-step, the lean replay, three factorizations) 92-96 ms of CPU against
11 ms with the limit's own cost included (4.4 ms: importing threadpoolctl, scanning the
loaded libraries). Limiting the pools around each message in a long-lived process costs more
than it saves there (``threadpool_limits`` scans the libraries at every call, ~0.5 ms; setting
OpenBLAS back to two threads costs ~0.2 ms at its next call), so a deployed site's ClientApp
limits them once, at its first message, for the rest of its process (:func:`pin_blas`): the
node config's ``blas-threads`` (default 1; 0 leaves the libraries' own). Libraries loaded
later (a PyTorch learner's) are not limited. A simulation's nodes share the server's process
and are left alone.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["BLAS_THREADS", "blas_threads", "pin_blas"]

logger = logging.getLogger(__name__)

#: the node config key, and its default: one thread
BLAS_THREADS = "blas-threads"
_KEPT: list = []  # the process's limit, once set (kept alive for the process)


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
    """Limit this process's BLAS and OpenMP pools to :func:`blas_threads` threads, once per
    process (later calls change nothing); whether this call set the limit."""
    threads = blas_threads(node_config)
    if _KEPT or threads == 0:
        return False
    import scipy.linalg  # noqa: F401  (its BLAS loaded, so that it is limited too)
    from threadpoolctl import ThreadpoolController

    _KEPT.append(ThreadpoolController().limit(limits=threads))
    logger.info("BLAS and OpenMP pools limited to %d thread(s) for this site process", threads)
    return True
