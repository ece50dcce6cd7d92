"""Choosing FedGMM's sizes: ``n_input_components="auto"`` or ``n_learners="auto"``.

A candidate is fitted on 80% of every client's rows and scored on the other 20% by the held-out
log-likelihood of the joint model, ``mean log h_c(x, y)`` with each client's own mixture weights
``pi_c`` (eq. (1) of the paper; what EM maximizes, so the score of the model, not of one of its
uses). Higher is better; the chosen size is then fitted on every row. A held-out score, not BIC:
the client weights ``pi_c`` are parameters too (``C (M1 M2 - 1)`` of them), so BIC's count
grows with the number of clients, and the learners' Newton fit is penalized (``l2``).

The held-out rows stay with their client: each client scores its own rows with its ``pi_c``
(read on the client's side, as :meth:`FedGMM.personalize` does), and only the sums are added.
"""

from __future__ import annotations

import numpy as np

from ...engine.contract.selection import Selection, check_candidates
from ...engine.estimation.estimator import FederatedEstimator

__all__ = ["DEFAULT_CANDIDATES", "HOLDOUT", "auto_size", "fedgmm_selection", "heldout_loglik"]

#: sizes tried when no candidates are given
DEFAULT_CANDIDATES = range(1, 6)
#: fraction of each client's rows held out to score a candidate
HOLDOUT = 0.2

_SIZES = {"n_input_components": "n_input_components_candidates",
          "n_learners": "n_learners_candidates"}


def auto_size(est: FederatedEstimator) -> str | None:
    """The size parameter set to ``"auto"`` (None when both are numbers); both at once is an
    error."""
    auto = [p for p in _SIZES if getattr(est, p) == "auto"]
    if len(auto) == 2:
        raise ValueError("n_input_components and n_learners are both 'auto'; FedGMM chooses one "
                         "size at a time: give n_learners a number (e.g. 3), fit with "
                         "n_input_components='auto', then fix it and choose n_learners")
    for p in auto:
        check_candidates(getattr(est, _SIZES[p]), DEFAULT_CANDIDATES, p, _SIZES[p])
    return auto[0] if auto else None


def heldout_loglik(est: FederatedEstimator, held_out) -> dict[str, float]:
    """``heldout_loglik``: the mean over the held-out rows of ``log h_c(x, y)``, each client
    with its own ``pi_c``; ``n_heldout``: the number of rows."""
    tot, n = 0.0, 0
    for cid, cd in held_out.items():
        s = est.score_samples(cd.X, cd.y, client=cid)["log_pxy"].to_numpy()
        tot += float(s.sum())
        n += s.size
    return {"heldout_loglik": tot / max(n, 1), "n_heldout": float(n)}


def fedgmm_selection(est: FederatedEstimator) -> Selection | None:
    """The :class:`~fedlatent.engine.contract.selection.Selection` of an ``"auto"`` size, or
    None."""
    param = auto_size(est)
    if param is None:
        return None
    seed = est.random_state if isinstance(est.random_state, int | np.integer) else None

    def split(fd):
        return fd.train_test_split(HOLDOUT, random_state=seed)

    candidates = check_candidates(getattr(est, _SIZES[param]), DEFAULT_CANDIDATES, param,
                                  _SIZES[param])
    return Selection(param, candidates, "heldout_loglik", heldout_loglik,
                     lower_is_better=False, split=split)
