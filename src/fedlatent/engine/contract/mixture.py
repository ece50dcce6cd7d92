"""What every finite mixture shares on the engine side: the random-membership start.

A mixture model (:class:`MixtureModel`) sends, per component, sums of its statistics weighted by
the rows' responsibilities. Given responsibilities drawn at random instead of computed, the same
sums are the random-membership start (flexmix's and poLCA's default start): every client draws,
for each of its rows, memberships uniform on the simplex from its own generator (keyed by the
seed, the client and the query) and sends the per-component sums; the server adds them up
(:func:`random_membership_stats`) and runs the M-step on their total. Soft rather than hard
random labels, so that no component's sums on a small client are one record's values.

Client side: a model implements :meth:`MixtureModel.responsibility_stats`; the query
``"random_stats"`` is then answered here. Server side: :func:`random_membership_stats` asks it
with every reply checked (or only the sum under secure aggregation / differential privacy).
Client processes import this module: it imports neither scikit-learn nor the server loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedlatent.data.dataset import ClientData
from fedlatent.engine.contract.model import FederatedModel
from fedlatent.engine.stats import Stats

__all__ = ["MixtureModel", "random_membership_stats"]

#: the query of the random-membership start
RANDOM_QUERY = "random_stats"
#: with frequency weights, the random start draws a row's copies' memberships up to this many
#: draws per row on average (beyond: one draw per row)
MAX_DRAWS_PER_ROW = 16


class MixtureModel(FederatedModel):
    """A finite mixture of ``n_components`` components (the model side).

    Subclasses implement :meth:`responsibility_stats` (and the hooks of
    :class:`~fedlatent.engine.contract.model.FederatedModel`); the random-membership start's client
    query is then answered by this class.
    """

    #: the number of components (set by the subclass's ``__init__``)
    K: int = 0

    def responsibility_stats(self, data: ClientData, resp: np.ndarray) -> Stats:
        """The client's statistics summed over its rows with responsibilities ``resp``.

        Parameters
        ----------
        data : ClientData
            The client's rows.
        resp : ndarray of shape (n_rows, K)
            Each row's weight on each component (rows on the simplex).

        Returns
        -------
        Stats
            The blocks :meth:`client_stats` sends, with these responsibilities.
        """
        raise NotImplementedError(f"model {self.name!r} has no responsibility_stats")

    def client_query(self, name: str, payload: dict[str, Any], data: ClientData, state,
                     rng: np.random.Generator):
        """``"random_stats"``: the statistics at memberships drawn uniform on the simplex
        (Dirichlet(1, ..., 1)) for every row, from the client's own generator. A row of
        frequency weight ``w`` takes ``ceil(w)`` draws in turn, its membership their mean
        (:func:`_memberships`): for whole weights its weighted sum is exactly the sum of the
        draws its copies would take, placed next to it."""
        if name == RANDOM_QUERY:
            resp = _memberships(rng, self.K, data.n_samples, data.weight)
            st = self.responsibility_stats(data, resp)  # weighs the rows by their weights
            return {"n": data.mass(), **{f"stat/{k}": v for k, v in st.items()}}, state
        return super().client_query(name, payload, data, state, rng)

    def dp_query_sensitivity(self, name: str, payload: dict[str, Any], dp):
        """The random start's sums have a round's bounds (its responsibilities are on the
        simplex, as a round's are); ``n`` is public (client sizes are)."""
        if name == RANDOM_QUERY:
            return {f"stat/{k}": v for k, v in self.dp_sensitivity({}, dp).items()}
        return super().dp_query_sensitivity(name, payload, dp)


def _memberships(rng: np.random.Generator, K: int, n: int,
                 weight: np.ndarray | None) -> np.ndarray:
    """Random memberships (n, K) uniform on the simplex; with frequency weights, each row's
    mean of ``ceil(w)`` consecutive draws (its copies' draws; 0 for a weight-0 row), so that
    a weighted client draws what its rows repeated ``w`` times next to each other draw. Large
    (survey-scale) weights would need more than :data:`MAX_DRAWS_PER_ROW` draws per row: one
    draw per row then (a start as random, not the copies')."""
    reps = None if weight is None else np.ceil(weight).astype(np.int64)
    if reps is None or reps.sum() > MAX_DRAWS_PER_ROW * max(n, 1):
        return rng.dirichlet(np.ones(K), size=n)
    draws = rng.dirichlet(np.ones(K), size=int(reps.sum()))
    out = np.zeros((n, K))
    live = reps > 0
    starts = np.concatenate([[0], np.cumsum(reps)[:-1]])[live]
    out[live] = np.add.reduceat(draws, starts, axis=0) / reps[live, None]
    return out


def random_membership_stats(ctx, shapes: dict[str, tuple[int, ...]], *,
                            nonnegative: tuple[str, ...] | None = None,
                            what: str = "initialization (random memberships)") -> Stats:
    """The random-membership statistics summed over every client (the server side).

    Every reply is checked: ``n`` equal to the client's units at setup, each block's shape,
    finite values, the ``nonnegative`` blocks >= 0 (default: the model's ``count_stats``) and
    the model's invariants (its ``check``); a client that does not answer or answers badly stops
    the fit with an error naming it. Under secure aggregation or differential privacy only the
    sum is asked (``ctx.ask_sum``).

    Parameters
    ----------
    ctx : FitContext
    shapes : dict of str to tuple
        The statistics' shapes (the model's ``stat_shapes``).
    nonnegative : tuple of str or None
    what : str
        The exchange's name in errors.

    Returns
    -------
    Stats
        The sums over every client (not means).
    """
    from fedlatent.engine.protocol.exchange import array, number

    if ctx.summed_only:  # the same sums, only their total seen (or each noisy)
        tot = ctx.ask_sum(RANDOM_QUERY, shapes={f"stat/{k}": s for k, s in shapes.items()},
                          what=what)
        return Stats({k: tot[f"stat/{k}"] for k in shapes})
    nonneg = ctx.model.count_stats if nonnegative is None else nonnegative
    first = next(iter(shapes))

    def units(n, reply, c):
        return None if float(n) == ctx.n_units[c] else (
            f"claims {float(n):g} rows, {ctx.n_units[c]} at setup")

    def meaning(_, reply, c):  # the model's invariants of one client's sums
        return ctx.model.check({k: np.asarray(reply[f"stat/{k}"]) for k in shapes},
                               ctx.n_units[c])

    expect = {"n": number(low=1, check=units)}
    for k, shp in shapes.items():
        expect[f"stat/{k}"] = array(*shp, low=0 if k in nonneg else None,
                                    check=meaning if k == first else None)
    rep = ctx.ask(RANDOM_QUERY, expect=expect, what=what)
    S = None
    for c in ctx.client_ids:
        st = Stats({k: rep[c][f"stat/{k}"] for k in shapes})
        S = st if S is None else S.add_(st)
    return S

