"""Latent class analysis against poLCA-style simulated data (issue 20, item 5).

Data as ``poLCA.simdata`` draws them (classes with their own category probabilities, the
variables independent given the class), split over clients of unequal sizes whose class shares
differ. Three fits from the same random-membership start: centralized EM on the pooled rows
(what poLCA computes), the federated fit with every client in every round (the same iterates),
and a federated fit with half the clients per round (stochastic approximation). The table gives,
per method, the largest error of the class shares and of the category probabilities against
the truth (classes matched to the true ones), the mean log-likelihood and the rounds; the
figure shows the true and fitted probabilities of each category, class by class.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ..engine.fedem.federation import Federation
from ..models.lca.estimator import LatentClassAnalysis
from ..models.lca.example import make_lca_data
from ..models.lca.math import lca_m_step, lca_statistics, one_hot, responsibilities
from ..plotting import figure

__all__ = ["lca"]

logger = logging.getLogger(__name__)


def centralized_em(X, params, n_categories, rounds: int):
    """poLCA's EM on the pooled rows ``X`` from ``params``: ``rounds`` E- and M-steps; returns
    the parameters and the mean log-likelihood at the last E-step's parameters."""
    Z = one_hot(X, n_categories)
    w, probs = params["weights"], params["probs"]
    ll = np.nan
    for _ in range(rounds):
        resp, norm = responsibilities(Z, w, probs)
        ll = float(norm.mean())
        w, probs = lca_m_step(lca_statistics(Z, resp), n_categories)
    return {"weights": w, "probs": probs}, ll


def _match(probs, truth) -> tuple[int, ...]:
    """The permutation of the fitted classes closest to the true ones (K is small)."""
    K = truth.shape[0]
    return min(itertools.permutations(range(K)),
               key=lambda p: float(np.abs(probs[list(p)] - truth).sum()))


def lca(quick: bool = True, out: str | Path | None = None, random_state: int = 0):
    """Latent class analysis: federated EM against centralized EM on poLCA-style data.

    Parameters
    ----------
    quick : bool
        12 clients of about 80 rows and 60 rounds; otherwise 40 clients of about 200 rows and
        300 rounds.
    out : path or None
        Where ``lca.png`` goes (None: no figure).
    random_state : int

    Returns
    -------
    DataFrame
        One row per method: ``method``, ``weights_error``, ``probabilities_error``,
        ``loglik`` (mean per row over every row, at the final parameters), ``rounds``;
        ``attrs["figure"]`` is the figure's path.
    """
    n_clients, size, rounds = (12, 80, 60) if quick else (40, 200, 300)
    cats = (3, 3, 3, 3)
    fd, _, (w_true, p_true) = make_lca_data(n_clients, size, 3, cats, random_state,
                                            return_truth=True)

    def est(participation):
        return LatentClassAnalysis(3, n_categories=list(cats), max_rounds=rounds, tol=0.0,
                                   random_state=random_state, federation=Federation(
                                       participation=participation, random_state=random_state))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full, half = est(1.0).fit(fd), est(0.5).fit(fd)
    p0 = est(1.0).initial_parameters(fd)
    X = np.vstack([cd.X for _, cd in fd.items()])
    cen, _ = centralized_em(X, p0, cats, rounds)
    fits = {"centralized EM (pooled rows)": (cen["weights"], cen["probs"], rounds),
            "federated, every client": (full.weights_, full.probabilities_, full.n_iter_),
            "federated, half the clients per round": (
                half.weights_, half.probabilities_, half.n_iter_)}
    Z = one_hot(X, cats)
    rows, matched = [], {}
    for method, (w, p, n) in fits.items():
        ll = float(responsibilities(Z, w, p)[1].mean())  # every row, at the final parameters
        perm = list(_match(p, p_true))
        matched[method] = p[perm]
        rows.append({"method": method,
                     "weights_error": float(np.abs(w[perm] - w_true).max()),
                     "probabilities_error": float(np.abs(p[perm] - p_true).max()),
                     "loglik": float(ll), "rounds": int(n)})
    table = pd.DataFrame(rows)
    table.attrs["figure"] = None
    if out is not None:
        path = Path(out) / "lca.png"
        _plot(path, p_true, matched, cats)
        table.attrs["figure"] = str(path)
        logger.info("lca: wrote %s", path)
    return table


def _plot(path: Path, truth, matched, cats) -> None:
    K = truth.shape[0]
    with figure(path, ncols=K, figsize=(4.2 * K, 4.6)) as (fig, axes):
        x = np.arange(truth.shape[1])
        width = 0.8 / (1 + len(matched))
        for k, ax in enumerate(np.atleast_1d(axes)):
            ax.bar(x, truth[k], width, label="truth", color="0.6")
            for i, (method, p) in enumerate(matched.items(), start=1):
                ax.bar(x + i * width, p[k], width, label=method)
            ticks = [f"v{j + 1}={r}" for j, R in enumerate(cats) for r in range(R)]
            ax.set_xticks(x + 0.4 - width / 2, ticks, rotation=90, fontsize=7)
            ax.set_title(f"class {k + 1}")
            ax.set_xlabel("variable = category")
            ax.set_ylabel(f"P(category | class {k + 1})")
            ax.set_ylim(0, 1)
        handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
        fig.suptitle("Latent class analysis: federated EM and centralized EM against the truth")
