"""Where the whole default fit's time goes at 100,000 clients of 10 rows, against scikit-learn's
whole default fit on the pooled rows, in the same process (issue 40: at most 1.5x).

The fit of ``bench_clients.py --whole`` (GMM d = 8, K = 4, full covariances, every disclosure
rule at its default but saturation) is timed part by part: the setup, the start (the pooled
moments, each hard-assignment exchange, the server's k-means), each round's client E-step,
reply screen (its compiled PSD certificates apart, which also take the weighted sum and the
size test as they read the replies), weighted sum (when taken apart: a round with a refused
reply, or the NumPy screen), control-variate mirror and M-step, and what is left;
scikit-learn's fit likewise (its k-means start, E-steps, M-steps). The parts are CPU seconds
of the functions named, wrapped by timers in this process (nested parts are inside their
parent's figure). Two fits of each side run: the table is of the second (warm), the first
fit's totals are printed above it. One BLAS thread.

    python benchmarks/bench_whole_account.py                 # 100,000 clients
    python benchmarks/bench_whole_account.py --clients 10000
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import os
import sys
import time
import warnings
from collections import defaultdict

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_k, "1")


import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_clients import K, make_data  # noqa: E402

SECONDS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)

#: (module, function or Class.method, label): ours
OURS = (
    ("fedlatent.engine.estimation.estimator", "FederatedEstimator._start", "setup"),
    ("fedlatent.models.gmm.init", "initialize_gaussians", "start"),
    ("fedlatent.models.gmm.init", "_pooled_moments", "start: pooled moments"),
    ("fedlatent.models.gmm.init", "_hard_sums", "start: hard-assignment exchanges"),
    ("fedlatent.models.gmm.init", "kmeans", "start: server k-means"),
    ("fedlatent.engine.rounds.loop", "run_rounds", "rounds"),
    ("fedlatent.engine.node.batched", "BatchedClients.estep", "round: client E-step"),
    ("fedlatent.engine.rounds.screen", "Screen.screen", "round: reply screen"),
    ("fedlatent.engine.protocol.psd_kernel", "reply_bordered_kernel",
     "round: reply screen's PSD certificates (and the weighted sum, read with them)"),
    ("fedlatent.engine.rounds.collectors", "weighted_rows", "round: weighted sum, apart"),
    ("fedlatent.engine.rounds.screen", "Mirror.follow", "round: control-variate mirror"),
    ("fedlatent.models.gmm.model", "GMMModel.server_step", "round: M-step"),
)
#: scikit-learn's parts
THEIRS = (
    ("sklearn.mixture._gaussian_mixture", "GaussianMixture._initialize_parameters",
     "k-means start"),
    ("sklearn.mixture._gaussian_mixture", "GaussianMixture._e_step", "E-steps"),
    ("sklearn.mixture._gaussian_mixture", "GaussianMixture._m_step", "M-steps"),
)


def _timed(label: str, f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        t0 = time.process_time()
        try:
            return f(*args, **kwargs)
        finally:
            dt = time.process_time() - t0
            for key in (label, _exchange(label, args, kwargs)):
                if key:
                    SECONDS[key] += dt
                    CALLS[key] += 1
    return wrapper


def _exchange(label: str, args, kwargs) -> str | None:
    """The row of one hard-assignment exchange of the start (``_hard_sums(ctx, centers,
    ...)``): its number of centres and whether second moments were asked."""
    if label != "start: hard-assignment exchanges":
        return None
    second = "with" if kwargs.get("second", True) else "without"
    return f"start: ... to {np.shape(args[1])[0]} centres, {second} second moments"


def _wrap(module: str, name: str, label: str) -> None:
    """Replace ``module.name`` (a function, or ``Class.method``) by a timed wrapper, also
    where another loaded module imported the function by name."""
    mod = importlib.import_module(module)
    owner, attr = (mod, name) if "." not in name else (getattr(mod, name.split(".")[0]),
                                                       name.split(".")[1])
    f = getattr(owner, attr)
    g = _timed(label, f)
    setattr(owner, attr, g)
    if owner is mod:
        for other in list(sys.modules.values()):
            names = getattr(other, "__dict__", {})
            if other is not mod and str(getattr(other, "__name__", "")).startswith(
                    ("fedlatent", "sklearn")) and names.get(attr) is f:
                setattr(other, attr, g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100_000)
    a = ap.parse_args()
    from sklearn.mixture import GaussianMixture

    import fedlatent as fl
    import fedlatent.engine.rounds.collectors  # noqa: F401  (loaded before wrapping)
    import fedlatent.models.gmm.estimator  # noqa: F401

    for module, name, label in OURS + THEIRS:
        _wrap(module, name, label)
    X = make_data(a.clients, 10)
    width = len(str(a.clients - 1))
    fd = fl.FederatedDataset.from_arrays(
        {f"c{c:0{width}d}": X[c * 10:(c + 1) * 10] for c in range(a.clients)})
    fed = fl.Federation(disclosure=fl.DisclosurePolicy(max_parameters_per_record=math.inf))
    warnings.simplefilter("ignore")
    totals = []
    for _ in range(2):
        SECONDS.clear()
        CALLS.clear()
        t0 = time.process_time()
        sk = GaussianMixture(K, random_state=0).fit(X)
        t1 = time.process_time()
        gm = fl.FederatedGaussianMixture(K, random_state=0, federation=fed).fit(fd)
        totals.append((t1 - t0, time.process_time() - t1))
    (sk_first, ours_first), (sk_warm, ours_warm) = totals
    rounds = int(gm.n_iter_)
    print(f"whole default fit, GMM d=8, K={K}, {a.clients:,} clients of 10 rows, one BLAS "
          f"thread, CPU seconds: first fit in the process ours {ours_first:.2f} / scikit-learn "
          f"{sk_first:.2f} = {ours_first / sk_first:.2f}x; warm {ours_warm:.2f} / "
          f"{sk_warm:.2f} = {ours_warm / sk_warm:.2f}x; {rounds} rounds, scikit-learn "
          f"{sk.n_iter_} iterations; log-likelihood a row ours {gm.score(X):.6f}, "
          f"scikit-learn {sk.score(X):.6f}")
    print("| part (the warm fit) | CPU s | calls | per round |")
    print("|---|---|---|---|")
    rest = ours_warm - SECONDS["setup"] - SECONDS["start"] - SECONDS["rounds"]
    labels = [label for _, _, label in OURS]
    at = labels.index("start: hard-assignment exchanges") + 1
    labels[at:at] = sorted(k for k in SECONDS if k.startswith("start: ... to"))
    for label in labels:
        per = f"{SECONDS[label] / rounds:.3f}" if label.startswith("round") else ""
        print(f"| {label} | {SECONDS[label]:.3f} | {CALLS[label]} | {per} |")
    print(f"| the rest (outside setup, start and rounds) | {rest:.3f} | | |")
    print(f"| **ours, whole fit** | **{ours_warm:.3f}** | | |")
    for _, _, label in THEIRS:
        print(f"| scikit-learn: {label} | {SECONDS[label]:.3f} | {CALLS[label]} | |")
    print(f"| **scikit-learn, whole fit** | **{sk_warm:.3f}** | | |")


if __name__ == "__main__":
    main()
