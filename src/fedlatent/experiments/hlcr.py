"""Fig. 3 of Yang et al. (FedHLCR on SYNTHHLCR).

(a) test MSE against data size (N*, N**) and noise sigma, 5-fold cross-validation over the events
    of every agent-entity pair, FedHLCR with all agents and gamma = 1;
(b) test MSE per iteration with 15% of the agents sampled per iteration, for several gamma (and,
    beyond the paper, with the engine's control variates and compression);
(c) test MSE after a fixed number of iterations against gamma, for several sampling fractions.

References
----------
Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data", 2022,
section 6 and Figure 3.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.hlcr_data import make_synthhlcr, split_events
from ..engine.fedem.federation import Federation, Quantizer
from ..engine.privacy.disclosure import DisclosurePolicy
from ..models.hlcr import HLCR
from ..plotting import figure

__all__ = ["hlcr_figure3"]

logger = logging.getLogger(__name__)


def _targets(fd) -> np.ndarray:
    """The targets in the order of ``predict_dataset`` (the source's row order)."""
    return fd.target_series().to_numpy(dtype=np.float64)


def _fit(train, K, sigma, max_rounds, seed, federation=None, tol=1e-6):
    # SYNTHHLCR's agents hold as few as one event: the paper's figure is reproduced without
    # disclosure control, as the paper ran it (the default policy would refuse those agents)
    federation = replace(federation or Federation(), disclosure=DisclosurePolicy.off())
    est = HLCR(K, alpha=1.0, beta=1.0, delta=1.0, sigma=sigma, max_rounds=max_rounds, tol=tol,
               federation=federation, random_state=seed, n_chains=1)  # one chain, as the paper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(train)


def hlcr_figure3(quick: bool = False, out=None, random_state: int = 0) -> pd.DataFrame:
    """Reproduce Fig. 3 (a, b, c) of the FedHLCR paper on SYNTHHLCR.

    Parameters
    ----------
    quick : bool
        Small sizes (16 agents x 16 entities, K = 4, F = 4, few settings) that run in seconds.
        Full size: 128 agents x 128 entities, K = 16, F = 10, the paper's grid.
    out : path or None
        Directory for ``fig3a.png``, ``fig3b.png``, ``fig3c.png`` and ``fig3{a,b,c}.csv``.
    random_state : int

    Returns
    -------
    DataFrame
        One row per measurement with a ``panel`` column ("a", "b", "c"):
        (a) ``n_star, n_2star, sigma, mse, mse_over_sigma2`` (pooled over the folds),
        ``iterations`` (mean number run: the fit stops when no label moves, at most 20) and
        ``iter_within_2pct`` (first iteration whose cross-validated test MSE is within 2% of
        the final one);
        (b) ``variant, gamma, fraction, iteration, mse, mse_over_sigma2``;
        (c) ``fraction, gamma, mse, mse_over_sigma2`` (at the last iteration, mean of seeds).
    """
    if quick:
        A, E, K, F = 16, 16, 4, 4
        grid_a = [(4, 5), (4, 20)]
        sigmas = [0.3, 1.0]
        folds = 2
        b_size, b_iter = (4, 20), 25
        b_gammas = [0.1, 0.2, 0.5, 0.75]
        c_fracs, c_gammas, c_iter, c_seeds = [0.15, 1.0], [0.1, 0.5, 1.0], 15, 1
    else:
        A, E, K, F = 128, 128, 16, 10
        grid_a = [(4, 5), (4, 20), (16, 5), (16, 20)]
        sigmas = [0.1, 0.3, 1.0, 3.0]
        folds = 5
        b_size, b_iter = (16, 20), 40
        b_gammas = [0.1, 0.2, 0.5, 0.75]
        c_fracs = [0.05, 0.15, 0.3, 0.5, 1.0]
        c_gammas = [0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0]
        c_iter, c_seeds = 30, 2
    rows = []

    # ---- (a) data size and noise ----------------------------------------------------------
    for n_star, n_2star in grid_a:
        for sigma in sigmas:
            fd = make_synthhlcr(A, E, n_star, n_2star, K, F, sigma=sigma, delta=1.0,
                                random_state=random_state)
            a_iter = 20
            err = cnt = 0.0
            iters = []
            curve = np.zeros(a_iter)  # summed squared test error after each iteration
            for f, (tr, te) in enumerate(split_events(fd, folds, random_state=random_state)):
                est = _fit(tr, K, sigma, a_iter, random_state + f)
                y = _targets(te)
                err += float(((est.predict_dataset(te) - y) ** 2).sum())
                cnt += len(y)
                iters.append(est.n_rounds_)
                staged = [float(((p - y) ** 2).sum()) for p in est.staged_predict(te)]
                curve += np.array(staged + [staged[-1]] * (a_iter - len(staged)))
            mse = err / cnt
            curve /= cnt
            # iterations until the cross-validated test MSE is within 2% of its final value
            within = int(np.flatnonzero(curve <= 1.02 * curve[-1])[0]) + 1
            rows.append({"panel": "a", "n_star": n_star, "n_2star": n_2star, "sigma": sigma,
                         "mse": mse, "mse_over_sigma2": mse / sigma**2,
                         "iterations": float(np.mean(iters)), "iter_within_2pct": within})
            logger.info("fig3a N*=%s N**=%s sigma=%s: mse/sigma2=%.3f", n_star, n_2star,
                        sigma, mse / sigma**2)

    # ---- (b) 15% of agents per iteration, several gamma -----------------------------------
    sigma_b = 1.0
    fd = make_synthhlcr(A, E, b_size[0], b_size[1], K, F, sigma=sigma_b, delta=1.0,
                        random_state=random_state)
    tr, te = next(split_events(fd, 5, random_state=random_state))
    y = _targets(te)
    variants = [("paper", g, Federation(participation=0.15, step_size=g,
                                        control_variates=False)) for g in b_gammas]
    variants += [
        ("control variates", 0.2, Federation(participation=0.15, step_size=0.2,
                                             control_variates=True)),
        ("quantized s=16", 0.2, Federation(participation=0.15, step_size=0.2,
                                           quantizer=Quantizer(16), control_variates=False)),
        ("quantized s=16 + control variates", 0.2,
         Federation(participation=0.15, step_size=0.2, quantizer=Quantizer(16),
                    control_variates=True)),
    ]
    for name, g, fed in variants:
        est = _fit(tr, K, sigma_b, b_iter, random_state, federation=fed, tol=0.0)
        for t, pred in enumerate(est.staged_predict(te), start=1):
            mse = float(np.mean((pred - y) ** 2))
            rows.append({"panel": "b", "variant": name, "gamma": g, "fraction": 0.15,
                         "iteration": t, "mse": mse, "mse_over_sigma2": mse / sigma_b**2})

    # ---- (c) final MSE against gamma for several fractions --------------------------------
    for frac in c_fracs:
        for g in c_gammas:
            vals = []
            for s in range(c_seeds):
                fed = Federation(participation=frac, step_size=g, control_variates=False)
                est = _fit(tr, K, sigma_b, c_iter, random_state + s, federation=fed, tol=0.0)
                vals.append(float(np.mean((est.predict_dataset(te) - y) ** 2)))
            mse = float(np.mean(vals))
            rows.append({"panel": "c", "fraction": frac, "gamma": g, "mse": mse,
                         "mse_over_sigma2": mse / sigma_b**2})

    df = pd.DataFrame(rows)
    if out is not None:
        _write(df, Path(out))
    return df


def _write(df: pd.DataFrame, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for p in "abc":
        df[df.panel == p].dropna(axis=1, how="all").to_csv(out / f"fig3{p}.csv", index=False)

    with _panel(out, "a") as ax:
        a = df[df.panel == "a"]
        for (ns, n2), g in a.groupby(["n_star", "n_2star"]):
            ax.plot(g.sigma, g.mse, marker="o", label=f"N*={ns}, N**={n2}")
        s = np.sort(a.sigma.unique())
        ax.plot(s, s**2, "k--", label="sigma^2 (optimal)")
        ax.set(xscale="log", yscale="log", xlabel="noise sigma", ylabel="test MSE (5-fold CV)",
               title="(a) data size and noise")

    with _panel(out, "b") as ax:
        for (name, g), d in df[df.panel == "b"].groupby(["variant", "gamma"], sort=False):
            label = f"gamma={g}" if name == "paper" else f"gamma={g}, {name}"
            ax.plot(d.iteration, d.mse, label=label, ls="-" if name == "paper" else ":")
        ax.set(yscale="log", xlabel="iteration", ylabel="test MSE",
               title="(b) 15% of agents per iteration")

    with _panel(out, "c") as ax:
        for frac, d in df[df.panel == "c"].groupby("fraction"):
            ax.plot(d.gamma, d.mse, marker="o", label=f"{int(round(frac * 100))}% agents")
        ax.set(yscale="log", xlabel="gamma", ylabel="final test MSE", title="(c) MSE against gamma")


@contextmanager
def _panel(out: Path, p: str):
    """The axes of panel ``p``, written to ``out / fig3{p}.png`` with a small legend."""
    with figure(out / f"fig3{p}.png", figsize=(5, 3.6)) as (_, ax):
        yield ax
        ax.legend(fontsize=7)
