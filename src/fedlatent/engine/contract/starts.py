"""Multi-start (scikit-learn's ``n_init``, flexmix's ``nrep``): an estimator that declares
``_multi_start = True`` and has ``n_init > 1`` runs its whole fit (initialization exchanges
and rounds) once per start, each from its own seed, and keeps the start of highest final mean
log-likelihood (FederatedGaussianMixture, LatentClassRegression, FedGMM; SEC's ``n_init`` is
its k-means restarts).

The seeds: start 0 uses the fit's seed (``random_state``, or the federation's), so ``n_init=1``
is the single fit; start ``i > 0`` a child of it (:func:`start_seeds`). A fit with ``n_init=n``
equals the best of the ``n`` single fits with ``random_state=start_seeds(seed, n)[i]``.

The score is the mean per-unit log-likelihood over every client: with full participation and
full passes, the last round's objective (at the parameters broadcast in that round, summed over
every client, securely under secure aggregation); otherwise (a round's objective covers only
its participants or its batch) one ``loglik`` query at the final parameters, checked per client
(refused for a model without that query, and under secure aggregation). Refused under
differential privacy (every start would spend the budget again: plan one start) and with
checkpoints (a checkpoint is of one run). ``init_scores_`` has one line per start (``start``,
``seed``, ``score``, ``n_iter``, ``converged``); ``best_start_`` is the kept one. A start's
ConvergenceWarning is raised only if it is the start kept.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

__all__ = ["fit_starts", "n_starts", "start_seeds"]


def start_seeds(seed: int, n: int) -> list[int]:
    """The seeds of ``n`` starts: ``seed`` itself, then ``n - 1`` children of it."""
    children = np.random.SeedSequence(int(seed)).spawn(max(0, int(n) - 1))
    return [int(seed)] + [int(c.generate_state(1, np.uint64)[0] >> np.uint64(1))
                          for c in children]


def _comparable(fed) -> bool:
    """Whether a round's objective covers every row (full participation, full passes)."""
    return fed.participation == 1.0 and fed.batch_size is None and fed.variance_reduction is None


def _refuse(est, fed, run: dict[str, Any], n: int | None = None) -> None:
    name, n = type(est).__name__, int(n if n is not None else est.n_init)
    if fed.privacy is not None:
        raise ValueError(f"{name}(n_init={n}) under differential privacy: every start would "
                         "spend the privacy budget again; use n_init=1")
    if run.get("checkpoint") is not None or run.get("resume"):
        raise ValueError(f"{name}(n_init={n}) with a checkpoint: a checkpoint is of one run; "
                         "use n_init=1 to checkpoint, or fit without checkpoint=")
    if _comparable(fed):
        return
    # overridden below the base estimator (which this module does not import: no circle)
    scorable = type(est)._fitted_params.__qualname__ != "FederatedEstimator._fitted_params"
    if fed.secure_aggregation or not scorable:
        raise ValueError(f"{name}(n_init={n}): the starts are compared by the log-likelihood "
                         "over every client, which under partial participation or mini-batches "
                         f"needs a clear per-client loglik query ({name} "
                         f"{'runs under secure aggregation' if scorable else 'has none'}); use "
                         "n_init=1, or participation=1 without batch_size or variance_reduction")


def _score(ctx, result, comparable: bool) -> float:
    """The start's mean log-likelihood over every client (see the module docstring)."""
    if comparable:
        return float(result.history[-1].objective) if len(result.history) else float("nan")
    from fedlatent.engine.protocol.exchange import number

    rep = ctx.ask("loglik", {f"params/{k}": v for k, v in result.params.items()},
                  expect={"n": number(low=0), "loglik": number()}, what="scoring a start")
    n = sum(float(r["n"]) for r in rep.values())
    return sum(float(r["loglik"]) for r in rep.values()) / n if n else float("nan")


def n_starts(est, run: dict[str, Any]) -> int:
    """The number of starts of ``est``'s fit: its ``n_init`` (checked: a setting that cannot
    compare starts is refused); ``n_init=None`` is the estimator's ``_default_n_init`` where
    a round's objective scores a start for free, one start otherwise (partial participation,
    mini-batches, differential privacy, a checkpoint, a complete explicit start)."""
    if not est._multi_start:  # n_init means something else there (SEC)
        return 1
    n = getattr(est, "n_init", 1)
    if n is not None:
        if int(n) > 1:
            _refuse(est, est._federation(), run)
        return int(n)
    default = int(est._default_n_init)
    fed = est._federation()
    if default <= 1 or est._explicit_init() or not _comparable(fed):
        return 1
    try:
        _refuse(est, fed, run, default)
    except ValueError:
        return 1
    return default


def fit_starts(est, fd, runtime, run: dict[str, Any]):
    """``(ctx, result)`` of the best of ``est.n_init`` starts (see the module docstring);
    sets ``est.init_scores_`` and ``est.best_start_``."""
    import pandas as pd

    from fedlatent.engine.fedem.seeds import resolve_seed

    fed = est._federation()
    base = resolve_seed(fed.random_state if fed.random_state is not None
                        else getattr(est, "random_state", None))
    rows, best, best_score, kept = [], None, -np.inf, []
    for i, seed in enumerate(start_seeds(base, n_starts(est, run))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ctx, result = est._fit_one_start(fd, runtime, seed, run)
            score = _score(ctx, result, _comparable(fed))
        rows.append({"start": i, "seed": seed, "score": score,
                     "n_iter": int(result.n_rounds), "converged": bool(result.converged)})
        if best is None or score > best_score or (np.isnan(best_score) and score == score):
            best, best_score, kept = (ctx, result, i), score, list(caught)
    for w in kept:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    est.init_scores_ = pd.DataFrame(rows).set_index("start")
    est.best_start_ = best[2]
    return best[0], best[1]
