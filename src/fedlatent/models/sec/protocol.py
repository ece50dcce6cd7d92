"""SEC's exchanges with the learners: the Select and Exchange steps, every reply checked.

Both steps go through the engine's one checked protocol
(:func:`fedlatent.engine.protocol.exchange.ask`, or
:meth:`FitContext.ask <fedlatent.engine.estimation.estimator.FitContext.ask>` during a fit): each
reply is validated against what the step expects (model bytes present, finite non-negative losses,
sizes >= 1, one validation MSE per candidate...), and a learner that does not answer or answers
badly stops the step with a :class:`~fedlatent.engine.rounds.loop.FederatedFitError` naming it
("... client 'l03': no reply; nothing of this exchange was used").

Messages go in waves of one message per learner, one ``ask`` (one runtime call, one network
exchange on Flower, where the learners work in parallel) per wave; with ``n_jobs`` other than
None or 1, one ``ask`` per message in joblib threads instead (a runtime whose learners are remote
gains from it; in process the work is mostly GIL-bound).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...engine.protocol.exchange import Expect, Replies, array, ask, number
from ...engine.protocol.messages import message_nbytes
from ...engine.protocol.runtime import Runtime
from ...engine.rounds.loop import FederatedFitError
from .serialize import dumps_model

__all__ = ["Traffic", "exchange_step", "select_step", "sender", "validate_step"]

#: ``send(messages, expect, what)``: one wave of per-client messages -> checked replies
Send = Callable[[dict[str, dict[str, Any]], Mapping[str, Expect], str], Replies]
#: (client, message)
Job = tuple[str, dict[str, Any]]

#: what the Select, Exchange and Validate steps are called in errors
SELECT, EXCHANGE, VALIDATE = "SEC select", "SEC exchange", "SEC validate"


def sender(target: Any) -> Send:
    """How a step reaches the learners: through a fit's context (``target.ask``; its faults are
    recorded) or, outside a fit, through a :class:`~fedlatent.engine.protocol.runtime.Runtime`."""
    if isinstance(target, Runtime):

        def send(msgs, expect, what):
            return ask(target, "query", msgs, what=what, expect=expect, per_client=True)

    else:

        def send(msgs, expect, what):
            query = str(next(iter(msgs.values()))["query"])
            return target.ask(query, per_client=msgs, expect=expect, what=what)

    return send


def refuse(what: str, client: str, reason: str) -> None:
    """Stop a step on a reply that passed the field checks but not the step's own."""
    raise FederatedFitError(f"{what}: client {client!r}: {reason}; nothing of this exchange "
                            "was used")


class Traffic:
    """Bytes that crossed in one step (as :func:`~fedlatent.engine.protocol.messages.message_nbytes`
    counts them) and the number of runtime calls."""

    def __init__(self) -> None:
        self.bytes_up = 0
        self.bytes_down = 0
        self.calls = 0

    def add(self, jobs: Sequence[Job], replies: Sequence[Mapping[str, Any]], calls: int) -> None:
        self.bytes_down += sum(message_nbytes(m) for _, m in jobs)
        self.bytes_up += sum(message_nbytes(r) for r in replies)
        self.calls += calls


def run_jobs(send: Send, jobs: list[Job], expect: Mapping[str, Expect], what: str, n_jobs,
             traffic: Traffic | None = None) -> list[dict[str, Any]]:
    """The checked replies to ``(client, message)`` jobs, in the order of ``jobs``.

    Serial (``n_jobs`` None or 1): waves of one message per client, one ``send`` per wave.
    Otherwise one ``send`` per job in joblib threads.
    """
    if n_jobs in (None, 1) or len(jobs) <= 1:
        out: list[Any] = [None] * len(jobs)
        todo = list(range(len(jobs)))
        calls = 0
        while todo:
            wave: dict[str, int] = {}
            for i in todo:
                wave.setdefault(jobs[i][0], i)
            rep = send({c: jobs[i][1] for c, i in wave.items()}, expect, what)
            calls += 1
            for c, i in wave.items():
                out[i] = rep[c]
            done = set(wave.values())
            todo = [i for i in todo if i not in done]
    else:
        from joblib import Parallel, delayed

        reps = Parallel(n_jobs=n_jobs, prefer="threads")(
            delayed(send)({c: m}, expect, what) for c, m in jobs
        )
        out = [r[c] for r, (c, _) in zip(reps, jobs)]
        calls = len(jobs)
    if traffic is not None:
        traffic.add(jobs, out, calls)
    return out


def select_expect(n_features: int, standardize: bool) -> dict[str, Expect]:
    """What every Select reply must hold (the cross-field checks are in :func:`select_step`)."""
    expect = {
        "model": array(None),
        "e": number(low=0),
        "n": number(low=1),
        "selected": number(low=0),
        # a candidate that failed on the half split has validation MSE +inf
        "cv_mse": Expect((None,), low=0, finite=False),
        "y_scale": number(),
    }
    if standardize:
        expect.update(x_mean=array(n_features), x_scale=array(n_features), y_mean=number())
    return expect


def select_step(send: Send, cids: list[str], cands: Mapping[str, list[tuple[str, Any]]],
                seed: int, *, n_features: int, standardize: bool, n_jobs=None,
                traffic: Traffic | None = None, split: str = "random", run: str = ""
                ) -> dict[str, dict[str, Any]]:
    """Step 1: every learner selects its candidate and replies its fitted model.

    Parameters
    ----------
    send : Send
    cids : list of str
        The learners.
    cands : dict of str to list of (name, unfitted regressor)
        Each learner's candidates (learners sharing one list share its encoding).
    seed : int
    n_features : int
    standardize : bool
        Whether the learners standardize (their replies then carry the scaling constants).
    split : {"random", "systematic"}
        The learners' half split (:func:`~.candidates.select_model`).
    run : str
        The run's id: a learner with a signing key signs its model for it (``signature``).

    Returns
    -------
    dict of str to dict
        Each learner's checked reply: ``model`` (skops bytes), ``e``, ``n``, ``selected``,
        ``cv_mse``, ``y_scale`` and, when standardizing, ``x_mean``, ``x_scale``, ``y_mean``.
    """
    encoded: dict[int, dict[str, Any]] = {}
    jobs: list[Job] = []
    for c in cids:
        lst = cands[c]
        key = id(lst)
        if key not in encoded:
            msg: dict[str, Any] = {"query": "select", "seed": int(seed), "split": str(split),
                                   "candidate_names": json.dumps([n for n, _ in lst]),
                                   "run": str(run)}
            for k, (_, est) in enumerate(lst):
                msg[f"candidate/{k}"] = dumps_model(est)
            encoded[key] = msg
        jobs.append((c, encoded[key]))
    replies = run_jobs(send, jobs, select_expect(n_features, standardize), SELECT, n_jobs,
                       traffic)
    out = {}
    for c, rep in zip(cids, replies):
        m = len(cands[c])
        if np.size(rep["model"]) < 1:
            refuse(SELECT, c, "sent an empty model")
        sel = float(rep["selected"])
        if sel != int(sel) or int(sel) >= m:
            refuse(SELECT, c, f"selected candidate {sel:g}, but it has {m} candidates")
        cv = np.asarray(rep["cv_mse"], dtype=np.float64)
        if cv.size != m or np.isnan(cv).any():
            refuse(SELECT, c, f"sent {cv.size} validation MSEs (NaN or not) for {m} candidates")
        if float(rep["y_scale"]) <= 0 or (standardize and
                                          np.any(np.asarray(rep["x_scale"]) <= 0)):
            refuse(SELECT, c, "sent a scale <= 0")
        out[c] = rep
    return out


def exchange_step(send: Send, receivers: list[str], blobs: Sequence[np.ndarray], seed: int, *,
                  batch: int, n_jobs=None, traffic: Traffic | None = None, run: str = "",
                  signed: Sequence[tuple[str, np.ndarray | None]] | None = None) -> np.ndarray:
    """Step 2: every receiver evaluates every model on its own data.

    Parameters
    ----------
    send : Send
    receivers : list of str
    blobs : list of ndarray (uint8)
        Fitted models as skops bytes; ``batch`` of them per message.
    seed : int
    batch : int
    run : str
        The run's id (the one the models were signed for).
    signed : list of (signer id, signature or None), optional
        Who selected each model and its signature, relayed for learners that verify them.

    Returns
    -------
    E : ndarray of shape (n_models, n_receivers)
        ``E[i, j]``: the MSE of model i on receiver j's data.
    """
    m = len(blobs)
    jobs: list[Job] = []
    where = []
    for j, c in enumerate(receivers):
        for s in range(0, m, batch):
            msg: dict[str, Any] = {"query": "exchange", "seed": int(seed), "offset": s,
                                   "run": str(run)}
            for k in range(s, min(s + batch, m)):
                msg[f"model/{k - s}"] = blobs[k]
                if signed is not None:  # who selected it, and its signature when it signed
                    msg[f"signer/{k - s}"] = str(signed[k][0])
                    if signed[k][1] is not None:
                        msg[f"signature/{k - s}"] = signed[k][1]
            jobs.append((c, msg))
            where.append((j, s))
    replies = run_jobs(send, jobs, {"loss": array(None, low=0)}, EXCHANGE, n_jobs, traffic)
    E = np.empty((m, len(receivers)))
    for (j, s), (c, _), rep in zip(where, jobs, replies):
        loss = np.asarray(rep["loss"], dtype=np.float64).reshape(-1)
        want = min(s + batch, m) - s
        if loss.shape[0] != want:
            refuse(EXCHANGE, c, f"sent {loss.shape[0]} losses for {want} models")
        E[s : s + want, j] = loss
    return E


def validate_step(send: Send, cids: list[str], labels: np.ndarray, blobs: Sequence[np.ndarray],
                  n: np.ndarray, seed: int, *, split: str, n_jobs=None,
                  traffic: Traffic | None = None, run: str = "",
                  signed: Sequence[tuple[str, np.ndarray | None]] | None = None
                  ) -> np.ndarray:
    """Step 4: every learner of a cluster of two or more compares, out of fold on its rows,
    its own model with its cluster's prediction (:meth:`~.model.SECModel._validate`).

    Returns
    -------
    ndarray of shape (L, 3)
        Per learner, the out-of-fold MSE alone and with its cluster and the standard error of
        their difference (NaN for a learner alone in its cluster: nothing to compare).
    """
    out = np.full((len(cids), 3), np.nan)
    jobs: list[Job] = []
    where = []
    for i, c in enumerate(cids):
        others = [j for j in np.flatnonzero(labels == labels[i]) if j != i]
        if not others:
            continue
        msg: dict[str, Any] = {"query": "validate", "seed": int(seed), "split": str(split),
                               "run": str(run), "offset": 0,
                               "weights": np.r_[n[others], n[i]].astype(np.float64)}
        for k, j in enumerate(others):
            msg[f"model/{k}"] = blobs[j]
            if signed is not None:
                msg[f"signer/{k}"] = str(signed[j][0])
                if signed[j][1] is not None:
                    msg[f"signature/{k}"] = signed[j][1]
        jobs.append((c, msg))
        where.append(i)
    expect = {"mse_alone": number(low=0), "mse_cluster": number(low=0),
              "se_difference": number(low=0), "n_validation": number(low=1)}
    replies = run_jobs(send, jobs, expect, VALIDATE, n_jobs, traffic)
    for i, rep in zip(where, replies):
        out[i] = float(rep["mse_alone"]), float(rep["mse_cluster"]), float(rep["se_difference"])
    return out
