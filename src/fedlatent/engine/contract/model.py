"""The contract between a model and the engine.

A model is the pure math of one latent-variable method, reconstructible from a JSON config on
any node (so a Flower client can rebuild it): the engine and the runtimes know nothing about its
internals. docs/architecture.md, section 3.

Client side (runs where the data are)::

    n_units(data) -> int                               how many "samples" (rows, entities...)
    client_stats(params, data, state, rng, rows) -> ClientStep
        sums over the selected units of the expected sufficient statistics at ``params``,
        the number of units summed, the objective summed over them, and the new client state
    client_query(name, payload, data, state, rng) -> (reply, state)
        model-specific one-off exchanges (initialization, local models for SEC...)
    client_stats_batched(params, X, y, w, states) -> BatchStep or None   (optional)
        ``client_stats`` of many clients at once, for the in-process runtime
    batch_units(datas), client_stats_units(params, batch, idx, state, rngs, policy)
        the same for a model whose units are not rows (``batched_units``; optional)

Server side::

    stat_shapes(params) -> {name: shape}              what a client must send (for validation)
    evaluated_shapes(data) -> {name: shape}           what a round's parameters must be (the
                                                       node refuses any other shape)
    check(stats, n_units, slack) -> reason or None     what one client's statistics must mean
    check_many(stats, n_units, slack) -> mask          ``check`` of many clients at once
    check_rows(rows) -> mask                           ``check_many`` of reply rows as the server
        rebuilds them (default: built a chunk at a time; a model may read them compiled)
    server_step(S, params, n_total) -> params          the M-step T(S) on mean statistics
        (default: ``m_step(project_stats(S), ...)``: a new model writes ``m_step`` and
        declares its ``count_stats``; the engine projects them back into their domain)

Declared data: ``name``, ``batched_step`` (whether ``client_stats_batched`` serves the
in-process batched round), ``batched_queries`` (the queries ``client_query_batched`` answers
for many in-process clients at once), ``count_stats`` (statistics that are sums of
non-negative weights).
Every hook is listed, with what it must do, in ``docs/architecture.md`` (the contract table).

``S`` given to ``server_step`` is on the scale of a *mean over units* (the client-weighted
average of per-client means); ``n_total`` is the number of units in the federation, for models
whose M-step needs sums (priors that do not scale with n).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedlatent.data.dataset import ClientData
from fedlatent.engine.contract.registry import model_from_config, register_model
from fedlatent.engine.fedem.seeds import client_key, client_rng, server_rng
from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.stats import Stats

__all__ = [
    "Capabilities",
    "ClientStep",
    "FederatedModel",
    "Params",
    "payload_params",
    "register_model",
    "model_from_config",
    "client_key",
    "client_rng",
    "server_rng",
]

Params = dict[str, np.ndarray]
ClientState = dict[str, np.ndarray]


@dataclass(frozen=True)
class Capabilities:
    """What an estimator supports, declared as data (``FederatedEstimator.capabilities``).

    Attributes
    ----------
    secure_aggregation : bool
        Whether ``Federation(secure_aggregation=True)`` is supported: every sum of the fit
        (initialization and rounds) goes through :meth:`FitContext.ask_sum` and the round loop.
    differential_privacy : bool
        Whether ``Federation(privacy=DifferentialPrivacy(...))`` is supported: the model bounds
        its statistics' sensitivity (``FederatedModel.dp_sensitivity``) and its queries'.
    secure_refusal : str
        Why not, when ``secure_aggregation`` is False (the refusal's message).
    privacy_refusal : str
        Why not, when ``differential_privacy`` is False (the refusal's message).
    missing_values : bool
        Whether the model takes NaN in X (missing at random, handled by its E-step); when
        False a fit or a prediction refuses NaN naming the client and the column.
    missing_target : bool
        Whether rows with a NaN target are left out of the fit (counted and logged; the model's
        ``fit_data``); when False such a target is refused naming the client.
    """

    secure_aggregation: bool = False
    differential_privacy: bool = False
    secure_refusal: str = "its fit does not yet route every sum through secure aggregation"
    privacy_refusal: str = "its statistics have no bounded sensitivity yet"
    missing_values: bool = False
    missing_target: bool = False

    def __post_init__(self):
        for flag, reason in ((self.secure_aggregation, self.secure_refusal),
                             (self.differential_privacy, self.privacy_refusal)):
            if not flag and not reason:
                raise ValueError("an unsupported capability needs its reason (the refusal)")


#: what a model that declares nothing supports: neither secure aggregation nor privacy
NO_CAPABILITIES = Capabilities()
#: a model whose every sum is secure-aggregated and whose statistics are bounded
ALL_CAPABILITIES = Capabilities(secure_aggregation=True, differential_privacy=True)


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
    """Base of every model's math. Subclasses set ``name`` and implement the hooks.

    Required: :meth:`client_stats`, :meth:`stat_shapes` and the M-step (:meth:`m_step`, or
    :meth:`server_step` for a model that projects its statistics itself). Everything else has
    a default that is right for a model whose unit is a row and that sends soft-weighted sums.
    """

    #: the registry name: any node rebuilds the model from ``(name, get_config())``
    name: ClassVar[str] = ""
    #: whether :meth:`client_stats_batched` serves the in-process batched round (data, read by
    #: the in-process runtime; the method may still decline one configuration by returning None)
    batched_step: ClassVar[bool] = False
    #: whether :meth:`client_stats_batched` takes ``out``: views of the reply buffer (one per
    #: statistic, shaped (C, ...)) it writes its sums into and returns as its ``stats``, so
    #: the runtime copies nothing (others' statistics are copied into the buffer)
    batched_out: ClassVar[bool] = False
    #: whether the batched step is :meth:`client_stats_units` on the model's own stacking of
    #: the clients' data (:meth:`batch_units`) rather than rows bucketed by the engine: units
    #: that are not rows, states of a different size on every client; that step applies the
    #: suppression of :meth:`disclosure_blocks` itself
    batched_units: ClassVar[bool] = False
    #: the queries :meth:`client_query_batched` answers for many in-process clients at once
    #: (initialization exchanges; the others go client by client)
    batched_queries: ClassVar[frozenset[str]] = frozenset()
    #: statistics that are sums of non-negative weights (counts): an honest client's are >= 0,
    #: but the server's mean statistics of a stochastic-approximation round (quantized,
    #: mini-batch, partial participation, noisy) need not be; :meth:`project_stats` puts them
    #: back before :meth:`m_step`
    count_stats: ClassVar[tuple[str, ...]] = ()
    #: why ``Federation(acceleration=...)`` does not apply ("" : it does): the round must be a
    #: deterministic map of the statistic with an objective that EM does not decrease
    acceleration_refusal: ClassVar[str] = ""
    #: why ``Federation(acceleration="newton")`` (rounds evaluating several points, the
    #: server keeping one afterwards) does not apply ("" : it does): the client step must be
    #: a function of the parameters sent, not advance a client state of its own
    multipoint_refusal: ClassVar[str] = ""
    #: why the statistics hold only at the parameters they were computed at ("": they are
    #: expectations EM's fixed point is defined by, which the engine may average across rounds).
    #: A model whose client step sends gradients and Hessians at the broadcast parameters (one
    #: Newton step a round: a generalized EM) declares the reason; the engine then refuses,
    #: with one message, every setting that would mix statistics of different parameters
    #: (:meth:`~fedlatent.engine.fedem.federation.Federation.check_model`)
    broadcast_only: ClassVar[str] = ""
    #: whether the client step advances a model state of the client's own (FedGMM's mixing
    #: weights ``pi_c``) that ``acceleration="newton"`` carries along its path: each client
    #: forms, for every extra point, the combination of its own kept states the server's
    #: coefficients name, put back in the domain by :meth:`project_point_state`
    point_state: ClassVar[bool] = False
    #: what a node checks the configuration it is sent by before it builds the model
    #: (:func:`~fedlatent.engine.contract.params.validate_params`'s forms, by config key:
    #: :func:`~fedlatent.engine.contract.registry.model_from_config`): the setup's config
    #: comes from the server, and a setting the estimator would refuse (a negative
    #: regularizer, say) steers the M-step every site evaluates or replays
    config_constraints: ClassVar[dict[str, list]] = {}
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
    #: the site's guard (:class:`~fedlatent.engine.site.guard.SiteGuard`: its policy and
    #: ledger; None without a site policy); set at setup, for queries the policy bounds
    #: (which models SEC evaluates, its per-run quota kept on the ledger)
    site: Any = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own_step = cls.server_step is not FederatedModel.server_step
        own_m = cls.m_step is not FederatedModel.m_step
        if cls.name and not (own_step or own_m):  # a concrete (named) model
            raise TypeError(f"{cls.__name__} must define m_step (or server_step)")

    def __init__(self, **config: Any):
        self.config = dict(config)

    def get_config(self) -> dict[str, Any]:
        """The JSON config the model was built with (``model_from_config(name, config)``)."""
        return dict(self.config)

    # ---- client side ----------------------------------------------------------------------
    def n_units(self, data: ClientData) -> int | float:
        """How many units the client's statistics are sums over (default: its rows, or the
        sum of their frequency weights when the data are weighted)."""
        return data.mass()

    def n_draws(self, data: ClientData) -> int:
        """How many units a mini-batch draws from (default: the rows; with frequency
        weights :meth:`n_units` is their sum, not a count of rows)."""
        return data.n_samples

    def fit_data(self, data: ClientData) -> ClientData:
        """The client's rows the model fits (idempotent; the client applies it at setup).
        Default: all. Conditional models leave out the rows without a target
        (``data.with_target()``)."""
        return data

    def init_client_state(self, data: ClientData) -> ClientState:
        """The client's private state at setup (never sent; default: none)."""
        return {}

    def objective_penalty(self, params: Params) -> float:
        """The penalty the M-step's objective subtracts from the mean objective at
        ``params`` (a ridge on some parameters, on the scale of a mean over units): EM
        ascends ``objective - penalty``, which ``acceleration="newton"`` compares its points
        by (server arithmetic on the parameters it sent). Default: 0."""
        return 0.0

    def project_point_state(self, states: ClientState, start: ClientState) -> ClientState:
        """Client states formed as a combination of states the client kept (an
        extrapolation, stacked over a first axis: one row per client; see
        :attr:`point_state`) put back into their domain, on the client (nothing sent);
        ``start``: the states the clients hold (the round's start, same layout).
        Default: as they are."""
        return states

    # ---- disclosure control (fedlatent.engine.privacy.enforce) ------------------------------
    def n_records(self, data: ClientData, rows: np.ndarray | None = None) -> int:
        """Records (rows of the data) behind a sum over ``rows`` of the units (all when
        None); the client refuses replies over fewer than ``min_records``. Default: a unit
        is a row (of positive weight, when the data are weighted)."""
        return data.n_records(rows)

    def disclosure_blocks(self, stats: Stats) -> tuple[np.ndarray, tuple[str, ...]] | None:
        """``(records per block, names of the statistics whose axis 0 indexes the blocks)``
        for statistics made of sums over hard-labelled subsets of the records (HLCR's cluster
        blocks); blocks over ``0 < n < min_records_per_block`` records are sent as zeros.
        Default None: every block is a (soft-weighted) sum over all the client's records."""
        return None

    def reply_numbers(self, data: ClientData) -> int | None:
        """The free numbers one round's reply of this client carries, what the saturation
        rule counts (:func:`~fedlatent.engine.privacy.disclosure.check_reply_numbers`): the
        entries of the statistic blocks, a symmetric matrix counted once
        (:func:`~fedlatent.engine.privacy.disclosure.free_numbers`). A model that sends
        per-record sums declares it. Every registered model declares it (an override that
        returns None says its round replies carry no per-record sums): the registry refuses a
        model that leaves this default, so the rule never goes silently off."""
        return None

    reply_numbers.undeclared = True  # the registry refuses a model that keeps this default

    def evaluated_shapes(self, data: ClientData) -> dict[str, tuple[int, ...]]:
        """The shapes of the parameters a round evaluates, for this configuration and a
        client's ``data``: ``{name: shape}`` of every parameter that is not a scalar (the
        components, features, learners the setup declared). The node refuses a round, and
        each of its extra points, whose parameters have another shape or carry an array this
        does not name (:mod:`fedlatent.engine.node.declared`), so what is evaluated is what
        the saturation rule counted (:meth:`reply_numbers`, from the same configuration).
        Every registered model declares it: the registry refuses a model that keeps this
        default, and a node refuses every round of a model that raises here."""
        raise NotImplementedError(f"model {self.name!r} does not declare the shapes of the "
                                  "parameters it evaluates (evaluated_shapes)")

    evaluated_shapes.undeclared = True  # the registry refuses a model that keeps this default

    def record_width(self, data: ClientData) -> int:
        """The values one record holds that a reply summarizes (the saturation rule's
        ``w``). Default: the features; a model that also sums the target adds one."""
        return int(data.n_features)

    def disclosure_levels(self, data: ClientData) -> list[tuple[str, list[str], np.ndarray]]:
        """``[(variable, level names, records holding each level)]`` of the categorical
        variables the model itself one-hot encodes (latent class analysis); the rare-level
        rule refuses a level held by ``0 < n < min_records_per_block`` records. Default: none
        (columns encoded by ``FederatedDataset.from_pandas(categorical=...)`` are found by
        the client from the dataset's encoding)."""
        return []

    def disclosure_members(self, stats: Stats) -> tuple[np.ndarray, np.ndarray] | None:
        """``(members, records)`` of the last :meth:`client_stats` when its blocks
        (:meth:`disclosure_blocks`) are sums over hard-labelled subsets of units: ``members``
        (n_blocks, n_units) boolean, the units in each block; ``records`` (n_units,) the
        records of each unit. The client then suppresses a block that, with the blocks it
        released before, would let a linear combination be a sum over too few records
        (:func:`~fedlatent.engine.privacy.enforce.suppress_differences`). Default None."""
        return None

    # ---- differential privacy (fedlatent.engine.privacy.client_dp) -------------------------
    def dp_clip(self, data: ClientData, dp) -> ClientData:
        """The client's data with one record's influence bounded, once at setup: feature rows
        clipped to the L2 ball of radius ``dp.clip`` around ``dp.center`` and, where the data
        have a target and ``dp.target_range`` is set, targets clipped to it. Models whose
        target is a class label override this (labels need no clipping)."""
        from fedlatent.engine.privacy.clipping import clip_rows, clip_targets

        X = clip_rows(data.X, dp.clip, dp.center_for(data.n_features))
        y = data.y
        if y is not None and dp.target_range is not None:
            y = clip_targets(y, *dp.target_range)
        return data.replace(X=X, y=y)

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
        :class:`fedlatent.engine.node.batched.BatchStep` whose row ``c`` equals ``client_stats`` of
        client ``c`` over its rows of weight 1 (up to the summation order). With
        ``batched_out``, it is called with ``out=`` views of the reply buffer (see there).
        """
        return None

    def batch_units(self, datas: list[ClientData]) -> Any:
        """Optional, with ``batched_units``: the clients' data (in batch order) stacked the way
        :meth:`client_stats_units` reads them, built once per in-process batch."""
        return None

    def batch_declines(self, batch: Any, policy: DisclosurePolicy) -> bool:
        """Optional, with ``batched_units``: whether the batched step cannot give these clients'
        replies under ``policy`` (a rule a client applies by what it released before): then
        every client steps alone, from the first round. Default False."""
        return False

    def client_stats_units(self, params: Params, batch: Any, idx: np.ndarray,
                           state: ClientState, rngs, policy: DisclosurePolicy):
        """Optional, with ``batched_units``: :meth:`client_stats` (full passes) of the clients
        at positions ``idx`` (ascending) of ``batch`` at once, their blocks suppressed as
        :meth:`disclosure_blocks` and ``policy`` say. ``state`` holds each client's state as an
        object array (one array per client of ``idx``), ``rngs[i]`` is the generator client
        ``idx[i]``'s own step draws from. Returns a
        :class:`fedlatent.engine.node.batched.BatchStep` (its state again object arrays) whose
        row ``i`` equals the step of client ``idx[i]`` alone (up to the summation order), or
        None (not for these settings: the clients are called one by one)."""
        return None
    def client_query_batched(self, name: str, payload: dict[str, Any], X: np.ndarray,
                             y: np.ndarray | None, w: np.ndarray,
                             state: ClientState) -> dict[str, np.ndarray]:
        """Optional: :meth:`client_query` of many clients at once, for the queries named in
        :attr:`batched_queries` (the in-process runtime's batched client side).

        ``X``, ``y``, ``w`` and ``state`` as in :meth:`client_stats_batched` (``w``: 1 for a
        row, 0 for padding). Returns every entry of the reply stacked, shape (C, ...): row
        ``c`` is ``client_query``'s reply of client ``c`` (up to the summation order). Only a
        query that draws nothing from the client's generator and leaves its state as it is
        can be batched so.
        """
        raise KeyError(f"model {self.name!r} has no batched client query {name!r}")

    def client_query(
        self,
        name: str,
        payload: dict[str, Any],
        data: ClientData,
        state: ClientState,
        rng: np.random.Generator,
    ) -> tuple[dict[str, Any], ClientState]:
        """A model-specific one-off exchange (initialization, scoring...): the reply (checked
        by the server against what it expects) and the client's new state. ``payload`` holds
        the server's message; parameters travel as ``params/<name>`` (:func:`payload_params`).
        Unknown names raise KeyError (the default)."""
        raise KeyError(f"model {self.name!r} has no client query {name!r}")

    # ---- server side ----------------------------------------------------------------------
    @abstractmethod
    def stat_shapes(self, params: Params) -> dict[str, tuple[int, ...]]:
        """Shapes of the statistic blocks a client sends."""

    def server_step(self, S: Stats, params: Params, n_total: float) -> Params:
        """The M-step the engine calls: new parameters from mean statistics ``S``.

        Default: :meth:`m_step` on ``project_stats(S)``. Models that project their statistics
        themselves (the Gaussian mixtures floor counts and covariances) override this instead.
        """
        return self.m_step(self.project_stats(S), params, n_total)

    def replay_step(self, S: Stats, params: Params, n_total: float) -> Params:
        """The M-step a verifying site replays (:mod:`fedlatent.engine.node.replay`): equal
        to :meth:`server_step` within a small fraction of the replay's tolerance. Default:
        :meth:`server_step` itself. A model may override it with a leaner path for its common
        case (no validation of what the site computed itself), falling back to
        :meth:`server_step` wherever the two could differ by more (a decision taken near its
        threshold); a site whose lean replay differs from the parameters sent replays
        :meth:`server_step` before it refuses them."""
        return self.server_step(S, params, n_total)

    def inference_params(self, S: Stats, params: Params, n_total: float) -> Params:
        """The fitted parameters ``T(S)`` in the form the ``"information"`` query is asked at
        (the estimator's reported values; :mod:`fedlatent.engine.node.verify_info` replays
        them after a verified fit). Default: :meth:`server_step`."""
        return self.server_step(S, params, n_total)

    def check_step(self, S: Stats, sent: Params, params: Params, n_total: float,
                   rtol: float) -> bool:
        """Whether a verifying site may accept ``sent`` as :meth:`server_step` of ``S``
        (``params`` the parameters the round before evaluated) without replaying it: True
        only when ``sent`` is proved within ``rtol / 2`` of each parameter's largest entry
        of what :meth:`replay_step` gives (e.g. the parameters mapped forward to the
        statistics they imply, by products only); False when the check cannot tell, and the
        site then replays the M-step (False never refuses). Default: False."""
        return False

    def m_step(self, S: Stats, params: Params, n_total: float) -> Params:
        """The M-step ``T(S)`` on mean statistics ``S`` already in their domain (counts >= 0).

        Parameters
        ----------
        S : Stats
            Client-weighted mean over units of the statistics :meth:`client_stats` sums.
        params : dict of str to ndarray
            The current parameters (for the parts ``S`` does not determine, e.g. a centre).
        n_total : float
            The number of units in the federation (for priors that do not scale with n).
        """
        raise NotImplementedError(f"model {self.name!r} defines neither m_step nor server_step")

    def project_stats(self, S: Stats) -> Stats:
        """``S`` with the :attr:`count_stats` clipped at 0 (the same object when none is
        negative, so exact EM is untouched). A stochastic-approximation mean ``S`` can leave the
        set where the M-step is defined; this projection is the engine's, not the model's."""
        neg = [k for k in self.count_stats if np.any(np.asarray(S[k]) < 0)]
        if not neg:
            return S
        return Stats({k: (np.maximum(v, 0.0) if k in neg else v) for k, v in S.items()})

    def check(self, stats: Stats, n_units: float, slack: Stats | None = None) -> str | None:
        """The invariants of one client's statistics; None when they hold, else the reason.

        ``stats`` are sums over ``n_units`` units, as a client of this model computes them
        (counts in ``[0, n_units]``, moment matrices positive semi-definite...). ``slack``
        bounds the absolute error of each entry when the server rebuilt the statistic from a
        difference (None: computed directly). The engine has already checked blocks, shapes,
        finiteness and the units claimed; the default adds nothing. Use
        :func:`fedlatent.engine.protocol.messages.count_problem` and
        :func:`~fedlatent.engine.protocol.messages.psd_failures` (relative tolerances: an honest
        client must never fail).
        """
        return None

    def check_many(self, stats: dict[str, np.ndarray], n_units: np.ndarray,
                   slack=None) -> np.ndarray:
        """:meth:`check` of many clients at once, for the batched round: a boolean mask over
        the rows of ``stats`` (each block stacked, shape (C, ...)) that is True at least where
        :meth:`check` fails (a superset: the engine then asks :meth:`check` row by row).

        ``slack`` is None or a callable ``slack(rows) -> {name: (len(rows), ...)}`` giving the
        slack of some rows when asked. Default: :meth:`check` row by row (exact)."""
        n_units = np.asarray(n_units)
        out = np.zeros(n_units.shape[0], dtype=bool)
        for i in range(out.size):
            row = {k: v[i] for k, v in stats.items()}
            sl = None if slack is None else {k: v[0] for k, v in
                                             slack(np.array([i])).items()}
            out[i] = self.check(Stats(row, copy=False), n_units[i],
                                None if sl is None else Stats(sl, copy=False)) \
                is not None
        return out

    def check_rows(self, rows) -> np.ndarray:
        """:meth:`check_many` of some rows of a round's replies, given as the server rebuilds
        them (a :class:`~fedlatent.engine.protocol.reply_rows.ReplyRows`: the statistics
        ``S_c n_c`` and their rounding slack, built on demand): a mask over the rows, True at
        least where :meth:`check` fails. Default: :meth:`check_many` a chunk of rows at a
        time (each chunk's statistics built, the slack asked for when needed). A model
        overrides it to read the rows' parts without building them (the Gaussian mixture's
        compiled screen)."""
        out = np.empty(len(rows), dtype=bool)
        lo = 0
        for part in rows.chunks():
            slack = part.slack if part.has_slack else None
            out[lo:lo + len(part)] = np.asarray(self.check_many(part.stats(), part.n, slack),
                                                dtype=bool)
            lo += len(part)
        return out

    def param_shapes(self, params: Params) -> dict[str, tuple[int, ...]]:
        """Shapes of the parameters broadcast to the clients (checked by the engine)."""
        return {k: np.shape(v) for k, v in params.items()}


def payload_params(payload: dict[str, Any]) -> Params:
    """The parameters a query's payload carries as ``params/<name>`` entries."""
    return {k[7:]: np.asarray(v) for k, v in payload.items() if k.startswith("params/")}
