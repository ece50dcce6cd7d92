"""FedGMM tables beyond the paper's own: Table 2 on every synthetic generator beside the paper's
numbers, and label-skewed clients (many holding one class) against a two-class split.

- :func:`fedgmm_table2`: Table 2's synthetic row on the paper's text generator, on the authors'
  script with its write index corrected ("reference") and as published, with the Bayes-optimal
  accuracy of each.
- :func:`fedgmm_label_skew`: FedGMM, FedAvg and Local on Dirichlet(0.05) label skew (at least
  40% of the clients hold one class) and on a split of the same rows where every client holds
  both classes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..baselines import FedAvg, Local, client_accuracy
from ..data.dataset import ClientData, FederatedDataset
from ..data.fedgmm_data import label_skew_partition, make_fedgmm_synthetic, split_clients
from ..models.fedgmm import FedGMM
from .fedgmm import PAPER, PAPER_TABLE2_SYNTHETIC, _figure, _fit, fedgmm_synthetic

__all__ = ["fedgmm_table2", "fedgmm_label_skew"]

GENERATORS = ("paper", "reference", "reference-as-published")


def fedgmm_table2(quick: bool = False, out=None, random_state: int = 0) -> pd.DataFrame:
    """FedGMM Table 2 (synthetic) on the paper-text, reference and as-published generators.

    Each generator's table is :func:`fedlatent.experiments.fedgmm.fedgmm_synthetic`'s (same
    sizes, methods and rounds). The paper's numbers come from the as-published script; the
    corrected "reference" generator is the comparable one, and the Bayes-optimal accuracy says
    how far from the ceiling every method is.

    Returns
    -------
    DataFrame with ``generator``, ``method``, ``accuracy``, ``accuracy_std``, ``rounds``,
    ``seconds``, ``bayes_optimal``, ``gap_to_bayes`` (points), ``paper``.
    """
    tables = []
    for gen in GENERATORS:
        t = fedgmm_synthetic(quick, out, random_state, generator=gen)
        t.insert(0, "generator", gen)
        tables.append(t)
    table = pd.concat(tables, ignore_index=True)
    table["gap_to_bayes"] = table["bayes_optimal"] - table["accuracy"]
    if out is not None:
        wide = table.pivot(index="method", columns="generator", values="accuracy")
        wide = wide.reindex(columns=list(GENERATORS))
        wide["paper (Table 2)"] = wide.index.map(PAPER_TABLE2_SYNTHETIC)
        wide = wide.reindex(table["method"].drop_duplicates())
        with _figure(out, "fedgmm_table2.png", figsize=(11, 4.2)) as (fig, ax):
            wide.plot.bar(ax=ax, rot=15)
            bayes = table.groupby("generator")["bayes_optimal"].first()
            for i, gen in enumerate(GENERATORS):
                ax.axhline(bayes[gen], color=f"C{i}", ls="--", lw=1,
                           label=f"Bayes-optimal, {gen}")
            ax.set_ylabel("mean client test accuracy (%)")
            ax.set_xlabel("method")
            ax.set_title("FedGMM Table 2 (synthetic) on three generators and the paper")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return table


def _split_like(parts: list[np.ndarray], X, y, fractions, rng, prefix="client"):
    clients = {f"{prefix}{c:03d}": ClientData(X[idx], y[idx]) for c, idx in enumerate(parts)
               if idx.size}
    return split_clients(clients, fractions, rng)


def fedgmm_label_skew(quick: bool = False, out=None, random_state: int = 0,
                      alpha: float = 0.05) -> pd.DataFrame:
    """One-class clients: Dirichlet(alpha) label skew against a two-class split of the same rows.

    The rows of the synthetic federation (paper generator, M = 3) are pooled and dealt to the
    clients twice: by label skew (client ``c``'s class shares ``~ Dir(alpha)``; with
    ``alpha = 0.05`` most clients hold one class) and at random with the same client sizes
    (every client holds both classes). Each client keeps 80% of its rows for training and 20%
    for its test. Full size: 40 clients from 16,000 rows, d = 8; quick: 20 clients from 3,200
    rows, d = 4 (clients dealt fewer than 20 rows are left out of both splits).

    Returns
    -------
    DataFrame with ``split``, ``one_class_clients`` (fraction), ``method``,
    ``personal_accuracy`` (mean over clients of each one's test accuracy with its own
    prediction, %), ``global_accuracy`` (accuracy of the global prediction on the pooled test
    rows of both splits' clients, %; NaN for Local).
    """
    rng = np.random.default_rng(random_state)
    n_clients, n_rows, d = (20, 3200, 4) if quick else (40, 16000, 8)
    sp = make_fedgmm_synthetic(8, n_rows // 8, n_features=d, mean_scale=2.0,
                               fractions=(1.0, 0.0, 0.0), random_state=random_state)
    pooled = sp.train.pooled()
    X, y = pooled.X, pooled.y
    # clients of fewer than 20 rows are left out (too few for an 80/20 split)
    skew = [p for p in label_skew_partition(y, n_clients, alpha, rng) if p.size >= 20]
    sizes = np.cumsum([p.size for p in skew])[:-1]
    mixed = [np.sort(p) for p in np.split(rng.permutation(np.concatenate(skew)), sizes)]
    splits = {f"label skew Dir({alpha:g})": _split_like(skew, X, y, (0.8, 0.0, 0.2), rng),
              "two classes per client": _split_like(mixed, X, y, (0.8, 0.0, 0.2), rng)}
    test_pool = FederatedDataset.from_arrays({"all": (
        np.vstack([cd.X for s in splits.values() for _, cd in s.test.items()]),
        np.concatenate([cd.y for s in splits.values() for _, cd in s.test.items()]))})["all"]
    kw = dict(federation=PAPER, max_rounds=20 if quick else 60, random_state=random_state,
              verbose=False)
    rows = []
    for split, s in splits.items():
        one = np.mean([np.unique(cd.y).size == 1 for _, cd in s.train.items()])
        for name, make in (("FedGMM", lambda: FedGMM(3, 3, **kw)),
                           ("FedAvg", lambda: FedAvg(**kw)), ("Local", Local)):
            est, _ = _fit(make, s.train)
            glob = (np.nan if name == "Local"
                    else 100 * np.mean(est.predict(test_pool.X) == test_pool.y))
            rows.append({"split": split, "one_class_clients": one, "method": name,
                         "personal_accuracy": 100 * client_accuracy(est, s.test).mean(),
                         "global_accuracy": glob})
    table = pd.DataFrame(rows)
    if out is not None:
        wide = table.pivot(index="method", columns="split", values="personal_accuracy")
        with _figure(out, "fedgmm_label_skew.png", figsize=(9, 3.6)) as (_, ax):
            wide.plot.bar(ax=ax, rot=0)
            ax.set_ylabel("mean client test accuracy (%)")
            ax.set_xlabel("method")
            ax.set_title("One-class clients: label skew against a two-class split")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return table
