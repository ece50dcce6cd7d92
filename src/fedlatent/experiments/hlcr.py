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
               federation=federation, random_state=seed, n_chains=1,  # one chain, as the paper
               random_intercept=False)  # the paper's model: no entity intercept
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
    z = _fig3_sizes(quick)
    rows = _fig3a(z, random_state)
    sigma_b = 1.0
    fd = make_synthhlcr(z["A"], z["E"], z["b_size"][0], z["b_size"][1], z["K"], z["F"],
                        sigma=sigma_b, delta=1.0, random_state=random_state)
    tr, te = next(split_events(fd, 5, random_state=random_state))
    rows += _fig3b(z, tr, te, sigma_b, random_state)
    rows += _fig3c(z, tr, te, sigma_b, random_state)
    df = pd.DataFrame(rows)
    if out is not None:
        _write(df, Path(out))
    return df


def _fig3_sizes(quick: bool) -> dict:
    """Sizes and grids of Fig. 3: the paper's, or small ones that run in seconds."""
    if quick:
        return dict(A=16, E=16, K=4, F=4, grid_a=[(4, 5), (4, 20)], sigmas=[0.3, 1.0], folds=2,
                    b_size=(4, 20), b_iter=25, b_gammas=[0.1, 0.2, 0.5, 0.75],
                    c_fracs=[0.15, 1.0], c_gammas=[0.1, 0.5, 1.0], c_iter=15, c_seeds=1)
    return dict(A=128, E=128, K=16, F=10, grid_a=[(4, 5), (4, 20), (16, 5), (16, 20)],
                sigmas=[0.1, 0.3, 1.0, 3.0], folds=5, b_size=(16, 20), b_iter=40,
                b_gammas=[0.1, 0.2, 0.5, 0.75], c_fracs=[0.05, 0.15, 0.3, 0.5, 1.0],
                c_gammas=[0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0], c_iter=30, c_seeds=2)


def _fig3a(z: dict, random_state: int) -> list[dict]:
    """Panel (a): data size and noise, cross-validated."""
    rows = []
    for n_star, n_2star in z["grid_a"]:
        for sigma in z["sigmas"]:
            fd = make_synthhlcr(z["A"], z["E"], n_star, n_2star, z["K"], z["F"], sigma=sigma,
                                delta=1.0, random_state=random_state)
            mse, iters, within = _fig3a_cell(fd, z, sigma, random_state)
            rows.append({"panel": "a", "n_star": n_star, "n_2star": n_2star, "sigma": sigma,
                         "mse": mse, "mse_over_sigma2": mse / sigma**2,
                         "iterations": iters, "iter_within_2pct": within})
            logger.info("fig3a N*=%s N**=%s sigma=%s: mse/sigma2=%.3f", n_star, n_2star,
                        sigma, mse / sigma**2)
    return rows


def _fig3a_cell(fd, z: dict, sigma: float, random_state: int) -> tuple[float, float, int]:
    """(pooled test MSE, mean iterations run, first iteration within 2% of the final MSE)."""
    a_iter = 20
    err = cnt = 0.0
    iters = []
    curve = np.zeros(a_iter)  # summed squared test error after each iteration
    for f, (tr, te) in enumerate(split_events(fd, z["folds"], random_state=random_state)):
        est = _fit(tr, z["K"], sigma, a_iter, random_state + f)
        y = _targets(te)
        err += float(((est.predict_dataset(te) - y) ** 2).sum())
        cnt += len(y)
        iters.append(est.n_rounds_)
        staged = [float(((p - y) ** 2).sum()) for p in est.staged_predict(te)]
        curve += np.array(staged + [staged[-1]] * (a_iter - len(staged)))
    curve /= cnt
    # iterations until the cross-validated test MSE is within 2% of its final value
    within = int(np.flatnonzero(curve <= 1.02 * curve[-1])[0]) + 1
    return err / cnt, float(np.mean(iters)), within


def _fig3b(z: dict, tr, te, sigma_b: float, random_state: int) -> list[dict]:
    """Panel (b): 15% of agents per iteration, several gamma, with and without control variates
    and quantization: the test MSE after each iteration."""
    y = _targets(te)
    variants = [("paper", g, Federation(participation=0.15, step_size=g,
                                        control_variates=False)) for g in z["b_gammas"]]
    variants += [
        ("control variates", 0.2, Federation(participation=0.15, step_size=0.2,
                                             control_variates=True)),
        ("quantized s=16", 0.2, Federation(participation=0.15, step_size=0.2,
                                           quantizer=Quantizer(16), control_variates=False)),
        ("quantized s=16 + control variates", 0.2,
         Federation(participation=0.15, step_size=0.2, quantizer=Quantizer(16),
                    control_variates=True)),
    ]
    rows = []
    for name, g, fed in variants:
        est = _fit(tr, z["K"], sigma_b, z["b_iter"], random_state, federation=fed, tol=0.0)
        for t, pred in enumerate(est.staged_predict(te), start=1):
            mse = float(np.mean((pred - y) ** 2))
            rows.append({"panel": "b", "variant": name, "gamma": g, "fraction": 0.15,
                         "iteration": t, "mse": mse, "mse_over_sigma2": mse / sigma_b**2})
    return rows


def _fig3c(z: dict, tr, te, sigma_b: float, random_state: int) -> list[dict]:
    """Panel (c): the final test MSE against gamma for several fractions (mean of seeds)."""
    y = _targets(te)
    rows = []
    for frac in z["c_fracs"]:
        for g in z["c_gammas"]:
            vals = []
            for s in range(z["c_seeds"]):
                fed = Federation(participation=frac, step_size=g, control_variates=False)
                est = _fit(tr, z["K"], sigma_b, z["c_iter"], random_state + s, federation=fed,
                           tol=0.0)
                vals.append(float(np.mean((est.predict_dataset(te) - y) ** 2)))
            mse = float(np.mean(vals))
            rows.append({"panel": "c", "fraction": frac, "gamma": g, "mse": mse,
                         "mse_over_sigma2": mse / sigma_b**2})
    return rows


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
