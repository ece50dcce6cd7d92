"""The contract between a model and the engine.

A model is the pure math of one latent-variable method, reconstructible from a JSON config on
any node (so a Flower client can rebuild it): the engine and the runtimes know nothing about its
internals. DESIGN.md section 3.

Client side (runs where the data are)::

    n_units(data) -> int                               how many "samples" (rows, entities...)
    client_stats(params, data, state, rng, rows) -> ClientStep
        sums over the selected units of the expected sufficient statistics at ``params``,
        the number of units summed, the objective summed over them, and the new client state
    client_query(name, payload, data, state, rng) -> (reply, state)
        model-specific one-off exchanges (initialization, local models for SEC...)
    client_stats_batched(params, X, y, w, states) -> BatchStep or None   (optional)
        ``client_stats`` of many clients at once, for the in-process runtime

Server side::

    stat_shapes(params) -> {name: shape}              what a client must send (for validation)
    check(stats, n_units, slack) -> reason or None     what one client's statistics must mean
    server_step(S, params, n_total) -> params          the M-step T(S) on mean statistics

``S`` given to ``server_step`` is on the scale of a *mean over units* (the client-weighted
average of per-client means); ``n_total`` is the number of units in the federation, for models
whose M-step needs sums (priors that do not scale with n).
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..data.dataset import ClientData
from .privacy.disclosure import DisclosurePolicy
from .registry import model_from_config, register_model
from .stats import Stats

__all__ = [
    "ClientStep",
    "FederatedModel",
    "Params",
    "register_model",
    "model_from_config",
    "client_rng",
]

Params = dict[str, np.ndarray]
ClientState = dict[str, np.ndarray]


def client_key(client_id: str) -> int:
    """A stable integer for a client id (independent of client order and runtime)."""
    return zlib.crc32(str(client_id).encode("utf-8"))


def client_rng(seed: int, client_id: str, round_: int, purpose: int = 0) -> np.random.Generator:
    """The generator of one client in one round.

    Equivalent to ``Generator.spawn`` children, but addressed by (client, round, purpose) instead
    of by spawn order, so results do not depend on client order, on the runtime, or on where a
    resumed run restarts.
    """
    key = (client_key(client_id), round_, purpose)
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=key)
    return np.random.default_rng(ss)


def server_rng(seed: int, round_: int, purpose: int = 0) -> np.random.Generator:
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=(2**32 + 7, round_, purpose))
    return np.random.default_rng(ss)


@dataclass
class ClientStep:
    """What one client step produces (before the engine turns it into a message).

    Attributes
    ----------
    stats : Stats
        Sums over the selected units of the expected sufficient statistics.
    n : int
        Number of units summed.
    objective : float
        Objective (log-likelihood or surrogate) summed over the units, at the given params.
    state : dict of str to ndarray
        The client's new private state (never sent).
    """

    stats: Stats
    n: int
    objective: float
    state: ClientState = field(default_factory=dict)


class FederatedModel(ABC):
    """Base of every model's math. Subclasses set ``name`` and implement the hooks."""

    name: ClassVar[str] = ""
    #: the disclosure policy in force on this client (the client node sets it at setup);
    #: model-specific queries that send sums over subsets consult it
    disclosure: DisclosurePolicy = DisclosurePolicy()
    #: the DifferentialPrivacy setting in force on this client (None: not private); set at
    #: setup, for queries whose reply depends on it (a centre, say)
    privacy: Any = None
    #: the site's keys and pinned roster (:class:`~fedlatent.engine.site.keys.SiteIdentity`,
    #: None: none); set at setup, for queries that sign what they send or verify what they
    #: are sent (SEC's models)
    identity: Any = None

    def __init__(self, **config: Any):
        self.config = dict(config)

    def get_config(self) -> dict[str, Any]:
        return dict(self.config)

    # ---- client side ----------------------------------------------------------------------
    def n_units(self, data: ClientData) -> int:
        return data.n_samples

    def init_client_state(self, data: ClientData) -> ClientState:
        return {}

    # ---- disclosure control (fedlatent.engine.privacy.enforce) ------------------------------
    def n_records(self, data: ClientData, rows: np.ndarray | None = None) -> int:
        """Records (rows of the data) behind a sum over ``rows`` of the units (all when
        None); the client refuses replies over fewer than ``min_records``. Default: a unit
        is a row."""
        return int(data.n_samples if rows is None else len(rows))

    def disclosure_blocks(self, stats: Stats) -> tuple[np.ndarray, tuple[str, ...]] | None:
        """``(records per block, names of the statistics whose axis 0 indexes the blocks)``
        for statistics made of sums over hard-labelled subsets of the records (HLCR's cluster
        blocks); blocks over ``0 < n < min_records_per_block`` records are sent as zeros.
        Default None: every block is a (soft-weighted) sum over all the client's records."""
        return None

    # ---- differential privacy (fedlatent.engine.privacy.client_dp) -------------------------
    def dp_clip(self, data: ClientData, dp) -> ClientData:
        """The client's data with one record's influence bounded, once at setup: feature rows
        clipped to the L2 ball of radius ``dp.clip`` around ``dp.center`` and, where the data
        have a target and ``dp.target_range`` is set, targets clipped to it. Models whose
        target is a class label override this (labels need no clipping)."""
        from .privacy.clipping import clip_rows, clip_targets

        X = clip_rows(data.X, dp.clip, dp.center_for(data.n_features))
        y = data.y
        if y is not None and dp.target_range is not None:
            y = clip_targets(y, *dp.target_range)
        return ClientData(X, y, data.entity, data.rows)

    def dp_sensitivity(self, params: Params, dp) -> dict[str, float]:
        """Per-record L2 bounds (add/remove one record) of every block :meth:`client_stats`
        sums, for data clipped by :meth:`dp_clip` (they must hold simultaneously; see
        :mod:`fedlatent.engine.privacy.clipping`). Models that support differential privacy
        override it."""
        raise NotImplementedError(f"model {self.name!r} does not bound its statistics' "
                                  "sensitivity; it cannot run under differential privacy")

    def dp_query_sensitivity(self, name: str, payload: dict[str, Any],
                             dp) -> dict[str, float] | None:
        """Per-record bounds of the fields of query ``name``'s reply that carry data (the
        client adds noise to these; every other field must be public, e.g. its row count), or
        None: the query is refused under differential privacy."""
        return None

    @abstractmethod
    def client_stats(
        self,
        params: Params,
        data: ClientData,
        state: ClientState,
        rng: np.random.Generator,
        rows: np.ndarray | None = None,
    ) -> ClientStep:
        """Expected sufficient statistics summed over ``rows`` (all units when None)."""

    def client_stats_batched(self, params: Params, X: np.ndarray, y: np.ndarray | None,
                             w: np.ndarray, state: ClientState):
        """Optional: :meth:`client_stats` of many clients at once (None: not available, the
        runtime calls the clients one by one).

        ``X`` (C, m, d) holds C clients' rows padded to m, ``y`` (C, m) their targets or None,
        ``w`` (C, m) the weight of each row (1 for a row to sum, 0 for padding or a row outside
        the mini-batch), ``state`` the clients' states stacked (C, ...). Returns a
        :class:`fedlatent.engine.batched.BatchStep` whose row ``c`` equals ``client_stats`` of
        client ``c`` over its rows of weight 1 (up to the summation order).
        """
        return None

    def client_query(
        self,
        name: str,
        payload: dict[str, Any],
        data: ClientData,
        state: ClientState,
        rng: np.random.Generator,
    ) -> tuple[dict[str, Any], ClientState]:
        raise KeyError(f"model {self.name!r} has no client query {name!r}")

    # ---- server side ----------------------------------------------------------------------
    @abstractmethod
    def stat_shapes(self, params: Params) -> dict[str, tuple[int, ...]]:
        """Shapes of the statistic blocks a client sends."""

    @abstractmethod
    def server_step(self, S: Stats, params: Params, n_total: float) -> Params:
        """The M-step: new parameters from mean statistics ``S``."""

    def check(self, stats: Stats, n_units: float, slack: Stats | None = None) -> str | None:
        """The invariants of one client's statistics; None when they hold, else the reason.

        ``stats`` are sums over ``n_units`` units, as a client of this model computes them
        (counts in ``[0, n_units]``, moment matrices positive semi-definite...). ``slack``
        bounds the absolute error of each entry when the server rebuilt the statistic from a
        difference (None: computed directly). The engine has already checked blocks, shapes,
        finiteness and the units claimed; the default adds nothing. Use
        :func:`fedlatent.engine.messages.count_problem` and
        :func:`~fedlatent.engine.messages.psd_failures` (relative tolerances: an honest
        client must never fail).
        """
        return None

    def param_shapes(self, params: Params) -> dict[str, tuple[int, ...]]:
        return {k: np.shape(v) for k, v in params.items()}
