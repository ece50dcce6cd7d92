"""A site's replay of the server (issue 38): from a verified aggregate, the FedEM update and the
model's M-step recomputed where the data are, and any other parameters refused.

Every step of the server between two rounds is a public, deterministic function of the
round's aggregate ``total = sum_c w_c Q_c`` and of what the site was sent before:
``S_hat`` and ``V`` advance by :meth:`~fedlatent.engine.fedem.update.FedEMState.advance`, and
the parameters are ``T(S_hat)``, the model's ``server_step``. :func:`replay` recomputes both
(the M-step by the model's ``replay_step``: ``server_step`` itself, or a leaner path equal to
it); :func:`params_refusal` compares the parameters a server sent with the replayed ones, and
:func:`replay_refusal` replays ``server_step`` itself before refusing what a lean path
rejects; :func:`step_refusal` first asks the model's ``check_step``, which accepts parameters
it proves to be the M-step's by mapping them forward (no M-step), and replays otherwise.

The aggregate must itself be verified (the projected sum tree,
:mod:`fedlatent.engine.secagg.sumtree`): replaying an aggregate the server chose proves
nothing, since any parameters are ``T`` of some statistic.

Tolerance (:data:`REPLAY_RTOL`): a parameter's entries may differ from the replay by
``1e-9`` times that parameter's largest magnitude. The fixed-point aggregate is exact, but
the update and the M-step are floating point, whose last bits differ across CPUs and BLAS
builds (summation order, fused multiply-adds), by a few units in the last place
(``tests/engine/test_replay.py`` replays GMM, LCR and LCA fits on one machine within it). A
1e-6 relative change of any entry within three orders of magnitude of its
parameter's largest is refused. What the tolerance leaves a server is a move of at most
``1e-9`` relative of the parameters, which moves each record's responsibilities, and so the
statistics a site sends, by a relative amount of the same order times the model's
sensitivity: a perturbation far below the fixed-point encoding's own rounding of the reply,
which cannot isolate a record (a probe needs a component moved by its own width).
"""

from __future__ import annotations

import numpy as np

from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.stats import Stats

__all__ = ["REPLAY_RTOL", "params_refusal", "replay", "replay_refusal", "step_refusal"]

#: relative tolerance of a replayed parameter, on the scale of its largest entry
REPLAY_RTOL = 1e-9


def replay(model, state: FedEMState | None, total: Stats, previous: dict, n_total: float, *,
           init_round: bool, gamma: float, p: float, alpha: float, use_cv: bool
           ) -> tuple[FedEMState, dict]:
    """``(state, params)`` after a round whose verified aggregate is ``total``: the server's
    FedEM update of ``state`` (None before the initialization round) and ``T(S_hat)`` from
    the parameters ``previous`` the round evaluated."""
    start = FedEMState(None, None) if state is None else state
    new = start.advance(total, init_round, gamma, p, alpha, use_cv)
    return new, model.replay_step(new.S_hat, previous, n_total)


def step_refusal(model, S_hat, previous: dict, n_total: float, sent: dict, round_: int,
                 client: str) -> str | None:
    """Why ``sent`` is not the M-step of ``S_hat`` (None: it is): the model's
    :meth:`~fedlatent.engine.contract.model.FederatedModel.check_step` where it proves
    ``sent`` within half the tolerance of the replay (products only, no M-step), else
    :func:`replay_refusal` of the replayed M-step. ``previous`` may be any mapping."""
    if model.check_step(S_hat, sent, previous, n_total, REPLAY_RTOL):
        return None
    previous = dict(previous)  # (a mapping of views made when read: the M-step's as a dict)
    replayed = model.replay_step(S_hat, previous, n_total)
    return replay_refusal(model, S_hat, previous, n_total, sent, replayed, round_, client)


def replay_refusal(model, S_hat, previous: dict, n_total: float, sent: dict, replayed: dict,
                   round_: int, client: str) -> str | None:
    """:func:`params_refusal` of ``sent`` against the ``replayed`` parameters (the model's
    lean :meth:`~fedlatent.engine.contract.model.FederatedModel.replay_step` of ``S_hat``);
    where they differ and the model has a lean replay, against its ``server_step`` (the
    server's own path) before refusing: a lean path never refuses what the server's own
    M-step, replayed, accepts."""
    from fedlatent.engine.contract.model import FederatedModel

    why = params_refusal(sent, replayed, round_, client)
    if why is None or type(model).replay_step is FederatedModel.replay_step:
        return why
    return params_refusal(sent, model.server_step(S_hat, previous, n_total), round_, client)


def params_refusal(sent: dict, replayed: dict, round_: int, client: str,
                   rtol: float = REPLAY_RTOL) -> str | None:
    """Why the parameters ``sent`` for round ``round_`` are not the ``replayed`` ones (None:
    they are, within ``rtol`` of each parameter's largest entry): the round, the parameter,
    the largest difference and where."""
    if sent.keys() == replayed.keys() and all(_close(sent[k], replayed[k], rtol) for k in sent):
        return None  # (the same bits, or within the tolerance: nothing to name)
    who = f"client {client!r}: round {round_} refused"
    for name in sorted(set(sent) | set(replayed)):
        if name not in sent or name not in replayed:
            side = "carries" if name in sent else "lacks"
            return f"{who}: its parameters {side} {name!r}, unlike the server's replayed M-step"
        a = np.asarray(sent[name], dtype=np.float64)
        b = np.asarray(replayed[name], dtype=np.float64)
        if a.shape != b.shape:
            return f"{who}: parameter {name!r} has shape {a.shape}, the replay {b.shape}"
        diff = np.abs(a - b)
        bad = ~np.isfinite(a) | (diff > rtol * max(float(np.max(np.abs(b), initial=0.0)),
                                                   np.finfo(np.float64).tiny))
        if np.any(bad):
            i = np.unravel_index(int(np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf),
                                                        -1.0))), a.shape)
            return (f"{who}: parameter {name!r} differs from the replay of the verified "
                    f"aggregate by {float(diff[i]):.3g} at {tuple(int(k) for k in i)} "
                    f"({float(a[i])!r} sent, {float(b[i])!r} replayed), above the tolerance "
                    f"{rtol:g} of its largest entry")
    return None


def _close(a, b, rtol: float) -> bool:
    """Whether ``a`` is ``b`` within ``rtol`` of ``b``'s largest entry (NaN and infinite
    entries never are), in a few array calls: :func:`params_refusal`'s accepting path."""
    if np.shape(a) != np.shape(b):
        return False
    if bool((a == b).all()):  # (the same bits: the same machine's arithmetic)
        return True
    scale = max(float(np.abs(b).max(initial=0.0)), np.finfo(np.float64).tiny)
    return bool(np.abs(np.subtract(a, b, dtype=np.float64)).max(initial=0.0) <= rtol * scale)
