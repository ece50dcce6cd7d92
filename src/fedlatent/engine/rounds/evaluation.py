"""``||h(S_hat)||^2``: the distance of the server statistic to a fixed point of EM, from one
evaluation pass of any collector."""

from __future__ import annotations

import numpy as np

from fedlatent.engine.protocol.messages import pack
from fedlatent.engine.rounds.batched_round import weighted_rows
from fedlatent.engine.rounds.collectors import refusals
from fedlatent.engine.stats import Stats

__all__ = ["h_norm2"]


def _prefixed(old: dict[str, str], c: str, why: str) -> str:
    return "; ".join(filter(None, (old.get(c), f"evaluate: {why}")))


def h_norm2(rd, k: int, params, S_hat: Stats, missing, rejected, errors):
    """``||h(S_hat)||^2 = ||mean_c S_c(params) - S_hat||^2`` (one evaluation pass at the
    round's new ``params = T(S_hat)``), and the round's ``missing``, ``rejected``, ``errors``
    with the evaluation's faults added.

    Each reply is checked as an initialization reply (the client's own statistic at the new
    parameters: the model's invariants, the units it set up); a client that raised, did not
    answer, or whose reply is refused is left out of the mean (the weights of the others
    renormalized; NaN when none is left) and recorded, its reason prefixed with
    ``evaluate:``; with ``on_invalid="raise"`` a refused reply stops the run."""
    msg = {"seed": int(rd.opt.seed), "round": k, **pack("params", params)}
    st = rd.collector.evaluate(msg)
    missing, rejected, errors = list(missing), dict(rejected), dict(errors)
    for c in st.missing:
        if c in st.errors:
            errors[c] = _prefixed(errors, c, st.errors[c])
        if c not in missing:
            missing.append(c)
    rows = st.rows
    accepted, reasons = (np.zeros(0, dtype=bool), {}) if rows is None else \
        rd.screen.screen(rows, "full", None, None)
    refused = refusals(rd, k, st, reasons, "an evaluation that cannot be true")
    for c, why in refused.items():
        rejected[c] = _prefixed(rejected, c, why)
    if rows is None or not accepted.any():
        return float("nan"), missing, rejected, errors
    w = rd.w[rows.clients]
    mean = rows.template.unflatten(weighted_rows(rows.Q, w, accepted)[0])
    if st.missing or refused:  # the weights of the others, added in client order
        mean = mean * (1.0 / float(np.cumsum(w[accepted])[-1]))
    return (mean - S_hat).squared_norm(), missing, rejected, errors
