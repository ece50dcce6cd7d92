"""SEC's ``summary()``: the chosen model of every learner and its cluster.

SEC is not a likelihood model: each learner selects a regressor by a held-out split and the
server clusters the learners on their exchanged losses, so there is no parameter with a
standard error to report. The table describes what was chosen.
"""

from __future__ import annotations

import numpy as np

from ...engine.estimation.estimator import check_is_fitted
from ...engine.estimation.inference import Summary, sites_info

__all__ = ["SUMMARY_COLUMNS", "SECSummary", "sec_table"]

#: the columns of SEC's summary table
SUMMARY_COLUMNS = ["cluster", "selected", "n_samples", "train mse"]


def sec_table(learner_ids, labels, selected, n_samples, errors):
    """One row per learner (index ``learner``): its cluster, the candidate it selected, its
    rows and the in-sample MSE of its selected model (columns :data:`SUMMARY_COLUMNS`)."""
    import pandas as pd

    table = pd.DataFrame({"cluster": np.asarray(labels, dtype=np.int64),
                          "selected": [str(s) for s in selected],
                          "n_samples": np.asarray(n_samples, dtype=np.int64),
                          "train mse": np.asarray(errors, dtype=np.float64)},
                         index=pd.Index([str(c) for c in learner_ids], name="learner"))
    return table[SUMMARY_COLUMNS]


def collaboration_note(sec) -> str:
    """Who predicts with its cluster, and why (``collaboration``, ``collaborates_``)."""
    flags = np.asarray(getattr(sec, "collaborates_", np.ones(len(sec.learner_ids_), bool)))
    val = np.asarray(getattr(sec, "validation_mse_", np.full((flags.size, 2), np.nan)))
    if getattr(sec, "collaboration", "always") != "validated" or not np.isfinite(val).any():
        return "every learner predicts with its cluster (eq. 4)"
    compared = np.isfinite(val).all(axis=1)
    alone = int((~flags).sum())
    if alone == int(compared.sum()):
        return (f"did not help: every learner compared ({alone}) keeps its own model (its "
                "cluster did not predict its validation rows better by a standard error)")
    return (f"{int(flags[compared].sum())} of {int(compared.sum())} learners compared predict "
            f"with their cluster; {alone} keep their own model (their cluster did not predict "
            "their validation rows better by a standard error)")


class SECSummary:
    """``summary()`` for :class:`~fedlatent.models.sec.SEC` (a mixin)."""

    def summary(self) -> Summary:
        """The chosen model: per learner its cluster, selected candidate, rows and in-sample
        MSE; in the header the number of clusters, how it was chosen and the candidates'
        counts. No standard errors (SEC is not a likelihood model).

        Returns
        -------
        Summary
            ``.table`` indexed by learner, columns ``cluster``, ``selected``, ``n_samples``,
            ``train mse``.
        """
        check_is_fitted(self)
        table = sec_table(self.learner_ids_, self.labels_, self.selected_, self.n_samples_,
                          self.errors_)
        how = "given" if self.n_clusters is not None else f"chosen by {self.k_selection}"
        counts = table["selected"].value_counts()
        info = {"Model": type(self).__name__, "Learners": str(len(table)),
                "Clusters": f"{int(self.n_clusters_)} ({how})",
                "Cluster sizes": ", ".join(str(int(v)) for v in
                                           np.bincount(table["cluster"].to_numpy())),
                "Selected candidates": ", ".join(f"{k} x{int(v)}" for k, v in counts.items()),
                "Standardized": str(bool(self.standardize)),
                "Collaboration": collaboration_note(self),
                "Standard errors": "none (not a likelihood model)", **sites_info(self)}
        return Summary(f"{type(self).__name__} results", info, table)
