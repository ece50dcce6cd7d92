"""The toy example of the FedEM slides: a 2-component Gaussian mixture in R^2 over n clients.

Reproduces the three comparisons of Dieuleveut, Fort, Moulines, Robin (NeurIPS 2021, slides
"Toy example"): robustness to partial participation and to heterogeneity, FedEM (control variates)
against naive FedEM under quantization, and VR-FedEM (SPIDER) against mini-batch FedEM. The
criterion is ``E||h(S_k)||^2`` with ``h(s) = sum_c w_c s_c(T(s)) - s`` (the mean field of EM in the
space of sufficient statistics), estimated by Monte Carlo over seeds, and the estimate of a mixture
weight per round ("epoch": one round of the federation).
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.dataset import ClientData, FederatedDataset
from ..engine.fedem.federation import Federation, Quantizer, Spider
from ..engine.privacy.disclosure import DisclosurePolicy
from ..models.gmm import FederatedGaussianMixture
from ..plotting import figure

__all__ = ["fedem_toy", "make_toy_federation", "summarize_toy", "toy_settings"]

logger = logging.getLogger(__name__)

TRUE_WEIGHTS = np.array([0.3, 0.7])
TRUE_MEANS = np.array([[-2.0, 0.0], [2.0, 0.0]])


def make_toy_federation(
    n_clients: int,
    n_per_client: int,
    heterogeneous: bool,
    random_state: int | np.random.Generator | None = None,
    dominance: float = 0.95,
) -> FederatedDataset:
    """Clients of a 2-component mixture in R^2 (identity covariances, weights 0.3 / 0.7).

    Homogeneous: every client draws from the global mixture. Strongly heterogeneous: client c draws
    from component ``c mod 2`` with probability ``dominance`` (the clients' shares of the two
    components are chosen so the pooled weights stay 0.3 / 0.7).

    Returns
    -------
    FederatedDataset with clients ``c000``...
    """
    rng = np.random.default_rng(random_state)
    clients = {}
    # client c is dominated by component dom[c]; the fraction dominated by component 0 is 0.3
    n0 = int(round(TRUE_WEIGHTS[0] * n_clients))
    dom = np.array([0] * n0 + [1] * (n_clients - n0))
    rng.shuffle(dom)
    for c in range(n_clients):
        if heterogeneous:
            p0 = dominance if dom[c] == 0 else 1.0 - dominance
            # rescale so that the pooled weights are exactly the true ones in expectation
            probs = np.array([p0, 1.0 - p0])
        else:
            probs = TRUE_WEIGHTS
        z = rng.choice(2, size=n_per_client, p=probs)
        X = TRUE_MEANS[z] + rng.standard_normal((n_per_client, 2))
        clients[f"c{c:03d}"] = ClientData(X)
    return FederatedDataset(clients, ["x0", "x1"])


def toy_settings(levels: int = 2, gamma: float = 0.3, batch_size: int = 10,
                 inner_rounds: int = 10) -> dict[str, Federation]:
    """The compared federations, by name."""
    q = Quantizer(levels)
    # the paper's mini-batches of 10 rows carry 12 numbers about 20 values, more than the
    # saturation rule lets a real site send (issue 22); this is a simulation of the paper
    sim = DisclosurePolicy(max_parameters_per_record=math.inf)
    return {
        "EM (p=1)": Federation(),
        "FedEM p=1": Federation(step_size=gamma, quantizer=q),
        "FedEM p=0.5": Federation(participation=0.5, step_size=gamma, quantizer=q),
        "FedEM p=0.1": Federation(participation=0.1, step_size=gamma, quantizer=q),
        "naive FedEM p=1": Federation(step_size=gamma, quantizer=q, control_variates=False),
        "mini-batch FedEM": Federation(step_size=gamma, batch_size=batch_size, disclosure=sim),
        "VR-FedEM": Federation(
            step_size=gamma, variance_reduction=Spider(inner_rounds, batch_size), disclosure=sim
        ),
    }


def _run_one(fd, fed, seed, rounds, weights_trace=None):
    init_rng = np.random.default_rng(10_000 + seed)
    means0 = TRUE_MEANS + init_rng.normal(scale=0.5, size=TRUE_MEANS.shape)
    gm = FederatedGaussianMixture(
        2,
        covariance_type="full",
        max_rounds=rounds,
        tol=0.0,
        weights_init=np.array([0.5, 0.5]),
        means_init=means0,
        precisions_init=np.repeat(np.eye(2)[None], 2, 0),
        federation=replace(fed, track_h=True, random_state=seed),
        random_state=seed,
        verbose=False,
    )
    def record(k, params, S_hat, rec):
        if weights_trace is not None:
            weights_trace.append(float(params["weights"][np.argmin(params["means"][:, 0])]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(fd, callbacks=[record])
    return gm


def fedem_toy(
    quick: bool = False,
    out: str | Path | None = None,
    random_state: int = 0,
    *,
    n_clients: int | None = None,
    n_per_client: int | None = None,
    rounds: int | None = None,
    n_seeds: int | None = None,
    levels: int = 2,
    gamma: float = 0.3,
    batch_size: int = 10,
    inner_rounds: int = 10,
    settings: list[str] | None = None,
    cases: tuple[str, ...] = ("homogeneous", "heterogeneous"),
) -> pd.DataFrame:
    """Run the FedEM toy comparisons; return per-round Monte Carlo means and write plots.

    Parameters
    ----------
    quick : bool
        Small size for tests (20 clients of 50 samples, 40 rounds, 4 seeds); otherwise 100 clients
        of 100 samples, 100 rounds, 10 seeds.
    out : path or None
        Directory for ``fedem_toy_h.png`` and ``fedem_toy_weight.png``.
    levels, gamma, batch_size, inner_rounds : quantizer levels, step size, mini-batch size and
        SPIDER refresh period shared by the stochastic settings.
    settings : list of str or None
        Subset of :func:`toy_settings` names to run (default: all).
    cases : tuple of str
        Which of "homogeneous" and "heterogeneous" to run.

    Returns
    -------
    DataFrame with columns case ("homogeneous"/"heterogeneous"), method, round, h2_mean
    (E||h(S_k)||^2 over seeds), h2_se, weight_mean (estimate of the weight of the component at
    (-2, 0), true 0.3), bytes_up_mean.
    """
    n_clients = n_clients or (20 if quick else 100)
    n_per_client = n_per_client or (50 if quick else 100)
    rounds = rounds or (40 if quick else 100)
    n_seeds = n_seeds or (4 if quick else 10)
    feds = toy_settings(levels, gamma, batch_size, inner_rounds)
    if settings is not None:
        feds = {k: feds[k] for k in settings}
    rows = []
    step, steps = 0, len(cases) * n_seeds * len(feds)
    for case in cases:
        for s in range(n_seeds):
            seed = random_state * 1000 + s
            fd = make_toy_federation(n_clients, n_per_client, case == "heterogeneous", seed)
            for name, fed in feds.items():
                trace: list[float] = []
                gm = _run_one(fd, fed, seed, rounds, trace)
                step += 1
                logger.info("fedem_toy %d/%d: %s clients, seed %d, %s (%d rounds)", step,
                            steps, case, seed, name, rounds)
                rows.extend(
                    {
                        "case": case,
                        "method": name,
                        "seed": seed,
                        "round": r.round,
                        "h2": r.h_norm2,
                        "weight": w,
                        "bytes_up": r.bytes_up,
                    }
                    for r, w in zip(gm.history_, trace)
                )
    raw = pd.DataFrame(rows)
    g = raw.groupby(["case", "method", "round"], sort=False)
    table = g.agg(
        h2_mean=("h2", "mean"),
        h2_se=("h2", lambda v: float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0),
        weight_mean=("weight", "mean"),
        bytes_up_mean=("bytes_up", "mean"),
    ).reset_index()
    if out is not None:
        _plot(table, Path(out))
    return table


def summarize_toy(table: pd.DataFrame) -> pd.DataFrame:
    """Final-round E||h||^2 and weight estimate per case and method (one row each)."""
    last = table[table["round"] == table["round"].max()]
    return last[["case", "method", "h2_mean", "h2_se", "weight_mean"]].reset_index(drop=True)


#: a marker and a line style per method (with its colour), so that lines which coincide (EM
#: and FedEM p=1 at the start, the participation levels) stay visible
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")


def _draw(ax, sub: pd.DataFrame, what: str, methods: list[str]) -> None:
    """One line per method of ``sub``, each with its own colour, marker and line style (markers
    staggered between methods, so that coinciding lines show each other's markers)."""
    n_rounds = max(int(sub["round"].nunique()), 1)
    every = max(1, n_rounds // 8)
    for method, m in sub.groupby("method", sort=False):
        i = methods.index(method)
        ax.plot(m["round"], m[what], label=method, color=f"C{i}", lw=1.3, ms=4,
                ls=_LINESTYLES[i % len(_LINESTYLES)], marker=_MARKERS[i % len(_MARKERS)],
                markevery=(i * every // len(methods), every))


def _flattening(sub: pd.DataFrame, what: str) -> list[str]:
    """The methods whose curve reaches further outside the others' range than that range is
    wide: drawn with the others, they would squeeze every other line of the panel flat."""
    out = []
    for method in dict.fromkeys(sub["method"]):
        mine = sub.loc[sub["method"] == method, what]
        others = sub.loc[sub["method"] != method, what]
        if others.empty or sub["method"].nunique() < 3:
            continue
        span = max(float(others.max() - others.min()), 1e-12)
        if mine.max() > others.max() + span or mine.min() < others.min() - span:
            out.append(method)
    return out


def _plot(table: pd.DataFrame, out: Path) -> None:
    """One figure per criterion, a panel per case (constrained layout, every panel titled and
    labelled, the methods' legend outside the panels). Each method has its own colour, marker
    and line style; E||h||^2 is on a log scale, and a method whose weight estimate would flatten
    the others (naive FedEM's excursion) gets a second row of panels on its own scale."""
    cases = list(dict.fromkeys(table["case"]))
    methods = list(dict.fromkeys(table["method"]))
    outliers = _flattening(table, "weight_mean")
    for what, ylabel, fname, logy, title in (
        ("h2_mean", "E ||h(S_k)||^2  (Monte Carlo mean)", "fedem_toy_h.png", True,
         "FedEM toy: distance to an EM fixed point"),
        ("weight_mean", "weight of component (-2, 0)", "fedem_toy_weight.png", False,
         "FedEM toy: estimated mixture weight (true 0.3)"),
    ):
        logger.info("fedem_toy: drawing %s", out / fname)
        rows = [[m for m in methods if logy or m not in outliers]]
        if not logy and outliers:
            rows.append(outliers)
        with figure(out / fname, nrows=len(rows), ncols=len(cases),
                    figsize=(5.5 * len(cases) + 2.2, 4.2 * len(rows)),
                    squeeze=False, tight=False, layout="constrained") as (fig, axes):
            for r, shown in enumerate(rows):
                for ax, case in zip(axes[r], cases):
                    sub = table[(table["case"] == case) & table["method"].isin(shown)]
                    _draw(ax, sub, what, methods)
                    if logy:
                        ax.set_yscale("log")
                    else:
                        ax.axhline(0.3, color="k", lw=0.8, ls=":", label="true weight 0.3")
                    ax.set_title(f"{case} clients" if r == 0 else
                                 f"{case} clients: {', '.join(shown)} (own scale)")
                    ax.set_xlabel("round (epoch)")
                    ax.set_ylabel(ylabel)
            fig.suptitle(title)
            handles, labels = {}, []
            for ax in axes.ravel():
                for h, lab in zip(*ax.get_legend_handles_labels()):
                    if lab not in handles:
                        handles[lab] = h
                        labels.append(lab)
            fig.legend([handles[lab] for lab in labels], labels, loc="outside right upper",
                       fontsize=8)
        logger.info("fedem_toy: wrote %s", out / fname)
