"""FedGMM's ``summary()``: the fitted input components and learners, point estimates only.

FedGMM's clients send no observed information yet: the learners are fitted by (damped) Newton
steps on a penalized likelihood and the personalized weights ``pi_c`` are per client, so the
Louis information of :mod:`fedlatent.engine.estimation.inference` is not defined for them as it is
for the Gaussian mixture. The table says so in its ``note`` column rather than printing standard
errors that would be wrong.
"""

from __future__ import annotations

import numpy as np

from ...engine.estimation.estimator import check_is_fitted
from ...engine.estimation.inference import Summary, sites_info

__all__ = ["NO_SE_NOTE", "NO_SE_REASON", "SUMMARY_COLUMNS", "FedGMMSummary", "fedgmm_table"]

#: the columns of FedGMM's summary table
SUMMARY_COLUMNS = ["coef", "std err", "note"]

#: the ``note`` of every row, and the header's longer reason
NO_SE_NOTE = "no SE: no observed information"
NO_SE_REASON = ("none: FedGMM's clients send no observed information (penalized Newton "
                "learners, per-client weights)")


def fedgmm_table(weights_x, means, weights_y, coef, classes, names: list[str]):
    """The summary table: per input component (``x0``, ``x1``...) its federated weight and
    mean per feature; per learner (``learner 0``...) its weight and, per non-reference class,
    its coefficients and intercept (``<class>: <feature>``). Indexed by (component,
    parameter); columns :data:`SUMMARY_COLUMNS` (``std err`` NaN, ``note`` why)."""
    import pandas as pd

    index, est = [], []
    means = np.asarray(means, dtype=np.float64)
    for k in range(means.shape[0]):
        index.append((f"x{k}", "weight"))
        est.append(float(weights_x[k]))
        index += [(f"x{k}", f"mean {f}") for f in names]
        est += [float(v) for v in means[k]]
    coef = np.asarray(coef, dtype=np.float64)
    for m in range(coef.shape[0]):
        index.append((f"learner {m}", "weight"))
        est.append(float(weights_y[m]))
        for j, cls in enumerate(classes[1:]):
            index += [(f"learner {m}", f"{cls}: {f}") for f in [*names, "intercept"]]
            est += [float(v) for v in coef[m, j]]
    idx = pd.MultiIndex.from_tuples(index, names=["component", "parameter"])
    return pd.DataFrame({"coef": est, "std err": np.full(len(est), np.nan),
                         "note": NO_SE_NOTE}, index=idx)


class FedGMMSummary:
    """``summary()`` for :class:`~fedlatent.models.fedgmm.FedGMM` (a mixin)."""

    def summary(self) -> Summary:
        """A statsmodels-style table of the fitted input components (weight, means) and
        learners (weight, coefficients per non-reference class; class ``classes_[0]`` is the
        reference), point estimates with the reason why there are no standard errors.

        Returns
        -------
        Summary
            ``.table`` indexed by (component, parameter), columns ``coef``, ``std err``,
            ``note``; ``.info`` the model, sizes, classes and final objective.
        """
        check_is_fitted(self)
        names = [str(f) for f in self.feature_names_in_]
        classes = [str(c) for c in self.classes_]
        table = fedgmm_table(self.weights_x_, self.means_, self.weights_y_, self.coef_,
                             classes, names)
        info = {"Model": type(self).__name__,
                "Input components": str(self.n_input_components_),
                "Learners": str(self.n_learners_),
                "Classes": f"{', '.join(classes)} (reference {classes[0]})",
                "Mean log h_c(x, y)": f"{float(self.lower_bound_):.6g}",
                "Converged": str(bool(self.converged_)),
                "Standard errors": NO_SE_REASON, **sites_info(self)}
        return Summary(f"{type(self).__name__} results", info, table)
