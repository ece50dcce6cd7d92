"""What bench_gmm.py and bench_lcr.py share: their command line and the per-round time.

Imported by path (the scripts run as ``python benchmarks/bench_*.py``, which puts this folder
first on ``sys.path``).
"""

from __future__ import annotations

import argparse

import numpy as np
from threadpoolctl import threadpool_limits


def blas_limit(threads: int):
    """``threadpool_limits(threads)`` over every BLAS and OpenMP library a fit uses. SciPy's
    OpenBLAS and scikit-learn's OpenMP load on first use, after a limit taken before that
    (which sees only NumPy's): they kept their default threads, whose work a thread's CPU clock
    does not count (a secure round at 1,000 clients ran 0.1 s a round on scipy's helper
    thread). They are loaded here first."""
    import scipy.linalg  # noqa: F401 - loads SciPy's OpenBLAS
    import sklearn.cluster  # noqa: F401 - loads scikit-learn's OpenMP runtime

    return threadpool_limits(threads)


def run_scaled(doc: str, run, *, features: int) -> None:
    """Parse ``--samples --clients --features --components --rounds --threads`` and call
    ``run(args)`` under the BLAS thread limit (the same for ours and the reference)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=300)
    ap.add_argument("--features", type=int, default=features)
    ap.add_argument("--components", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads for both")
    a = ap.parse_args()
    with blas_limit(a.threads):
        run(a)


def median_round_seconds(history) -> float:
    """Median wall time of a fit's rounds, the first (warm-up, compilation) left out."""
    return float(np.median(np.array([r.seconds for r in history])[1:]))
