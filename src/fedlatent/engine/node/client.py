"""The client half of the engine: what runs where the data are, in any runtime.

A :class:`ClientNode` holds one client's data and private state. Runtimes deliver it messages
(``handle(method, message)``) and carry its replies; the in-process runtime keeps the node as an
object, the Flower runtime rebuilds it on every message from ``context.state``.

Methods a node answers:

``setup``       build the model from its name and config; reply with the number of units
``estep``       FedEM client step (full pass, mini-batch or SPIDER; control variates; quantizer);
                ``V_reset/`` blocks in the message (the server refused the last reply) replace
                the control variate before the step; a message with ``points = m`` also gets
                the mean statistic and objective at each ``params{j}`` (``point{j}/``,
                ``objective{j}``; full passes after the initialization round, no privacy)
``evaluate``    mean statistics at the given parameters, no state change (for ||h(S)||^2)
``query``       a model-specific exchange (``message["query"]`` names it)
``describe``    the client's own data checked by the estimator's checks; counts and column
                names only (how the server of a deployment learns the federation's shape)
``settings``    the site policy's floors (:mod:`fedlatent.engine.site.announce`; no data)
``secagg``      secure aggregation: the key set-up and the reveal of shares
                (:mod:`fedlatent.engine.secagg.secure`); a message carrying ``secagg/slot`` gets
                its ``estep`` or ``query`` reply masked

The private state (model state such as FedGMM's pi_c or HLCR labels, the control variate V_c,
the SPIDER memory) is a flat dict of arrays and never leaves the node.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np

from fedlatent.data.dataset import ClientData, FederatedDataset
from fedlatent.engine.contract.model import FederatedModel, client_key, client_rng
from fedlatent.engine.contract.registry import model_from_config
from fedlatent.engine.fedem.streams import batch_rows, stream_keys, stream_uniforms
from fedlatent.engine.node.clientstep import fedem_rows
from fedlatent.engine.node.declared import check_message, check_round
from fedlatent.engine.node.describe import describe_client
from fedlatent.engine.node.pointstate import (
    UnheldState,
    combination,
    extra_points,
    history_rounds,
    in_key,
    out_key,
    point_round,
    stale,
)
from fedlatent.engine.privacy.clipping import weights_refusal
from fedlatent.engine.privacy.disclosure import (
    DisclosurePolicy,
    check_counts,
    check_reply_numbers,
)
from fedlatent.engine.privacy.enforce import (
    DisclosureRefused,
    policy_from_json,
    setup_refusal,
    setup_rule_refusal,
    stricter,
    suppress_blocks,
    suppress_differences,
)
from fedlatent.engine.privacy.patterns import merge_rare_patterns
from fedlatent.engine.protocol.messages import (
    ERROR_KEY,
    pack,
    point_keys,
    refusal_reply,
    unpack,
)
from fedlatent.engine.stats import Stats, units_number

__all__ = ["ClientNode", "describe_client"]

logger = logging.getLogger(__name__)

# purposes of the per-(client, round) generators
_P_MODEL, _P_QUANT, _P_BATCH, _P_QUERY = 0, 1, 2, 3
#: the default policy (frozen: one shared by every node, not checked again for each)
_DEFAULT_POLICY = DisclosurePolicy()


class _LazyRng:
    """A per-(client, round, purpose) generator built on first use (most steps draw nothing)."""

    __slots__ = ("_args", "_rng")

    def __init__(self, *args):
        self._args = args
        self._rng = None

    def __getattr__(self, name):
        if self._rng is None:
            self._rng = client_rng(*self._args)
        return getattr(self._rng, name)


_POINT_KINDS = ("pstate", "pinput")  # (the prefixes of kept point states)
#: state an E-step never writes, kept by reference when a failed one restores the state
_NOT_STEPPED = ("verify/", "secure_last/")  # (its arrays are replaced, never changed)


def _sub(state: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    p = prefix + "/"
    return {k[len(p) :]: v for k, v in state.items() if k.startswith(p)}


def _flat_like(template: Stats, other: Stats) -> np.ndarray:
    """``other`` flattened in the block order of ``template``, as one row (1, F)."""
    return np.concatenate([np.ravel(other[k]) for k in template])[None, :]


def _put(state: dict[str, np.ndarray], prefix: str, arrays: dict[str, np.ndarray]) -> None:
    p = prefix + "/"
    for k in [k for k in state if k.startswith(p)]:
        del state[k]
    for k, v in arrays.items():
        state[p + k] = np.asarray(v)


class ClientNode:
    """One client: its data, its model, its private state.

    Parameters
    ----------
    client_id : str
    data : ClientData
        The client's own data. Nothing in a reply is derived from it except sums.
    state : dict of str to ndarray, optional
        Saved private state (a checkpoint, or Flower's context.state).
    source : FederatedDataset, optional
        The dataset ``data`` comes from (column names and roles, for ``describe``); only this
        client's part of it is ever read.
    disclosure : DisclosurePolicy, optional
        The site's own disclosure policy: the server's (sent at setup) can make it stricter,
        never looser (:mod:`fedlatent.engine.privacy.enforce`). None: the server's.
    identity : SiteIdentity, optional
        The site's signing key and pinned roster (:mod:`fedlatent.engine.site.keys`): it signs
        its key-agreement keys and SEC models, and with a roster accepts only peers' keys and
        models that rostered sites signed. None: nothing signed, nothing verified.
    policy : SitePolicy, optional
        The site's own policy (:mod:`fedlatent.engine.site`): its floors, its ledger, one plan
        and one answer per question; a message it refuses gets a one-line reason (site, rule,
        fix). None: the library's default site policy, ``SitePolicy()`` (its ledger in
        ``site_dir``, else in memory). Only a runtime that holds every site itself passes
        :meth:`SitePolicy.for_simulation` (the node answers as the server's settings say).
    dataset : str
        The name of the data set ``data`` is (its lifetime privacy budget is kept by name).
    site_dir : path, optional
        Where the site's ledger lives when the policy names no directory.
    deployed : bool, default False
        A node of a deployment (a Flower SuperNode): a policy's lifetime budget with no
        directory for its ledger is refused (elsewhere: warned about).
    """

    #: the message a verified round checked (set by ``check_exchange``; ``check_message``)
    shapes_checked = None

    def __init__(
        self,
        client_id: str,
        data: ClientData,
        state: dict[str, np.ndarray] | None = None,
        *,
        source: FederatedDataset | None = None,
        disclosure: DisclosurePolicy | None = None,
        identity=None,
        policy=None,
        dataset: str = "default",
        site_dir=None,
        deployed: bool = False,
    ):
        self.client_id = str(client_id)
        #: the site's guard (its policy and ledger), None without a policy
        self.guard = None
        if policy is None:  # safe by default: the library's own site policy
            from fedlatent.engine.site.policy import SitePolicy

            policy = SitePolicy()
        #: the site's policy (announced to the server by the ``settings`` exchange)
        self.site_policy = policy
        #: whether a server's ``noise_seed`` is honoured (a simulation's site only)
        self.honour_noise_seed = bool(policy.simulation)
        if not policy.relaxed:
            from fedlatent.engine.site.guard import SiteGuard

            if identity is None and (policy.signing_key or policy.roster):
                from fedlatent.engine.site.keys import SiteIdentity

                identity = SiteIdentity.from_paths(policy.signing_key, policy.roster,
                                                   sec_quota=policy.sec_quota,
                                                   site=policy.name or self.client_id)
            self.guard = SiteGuard(policy, self.client_id, dataset=dataset, directory=site_dir,
                                   keys=None if identity is None else identity.keys,
                                   deployed=deployed)
            disclosure = (policy.disclosure if disclosure is None
                          else stricter(policy.disclosure, disclosure))
        #: the site's keys and pinned roster (SiteIdentity; from its policy's paths) or None
        self.identity = identity
        #: a signing key and roster the runtime gave this site for secure aggregation (the
        #: in-process and simulation runtimes hold every site: they provision them), or None
        self.provisioned = None
        self.own_disclosure = disclosure
        self.disclosure = _DEFAULT_POLICY if disclosure is None else disclosure
        self._data = data
        self._raw = data  # as given; ``_data`` is its clipped copy under differential privacy
        self._source = source
        #: the fit's differential privacy (ClientPrivacy) or None; set at setup
        self.privacy = None
        self.state: dict[str, np.ndarray] = dict(state or {})
        self.model: FederatedModel | None = None
        #: this client's secure-aggregation secrets for the current fit (never sent)
        self.secagg = None
        #: the level of this client's own log of its refusals and failures (the server logs
        #: them too, summarized: the in-process runtime lowers it to DEBUG, else a federation
        #: of 200,000 refused clients writes 200,000 warnings)
        self.log_level = logging.WARNING

    # ------------------------------------------------------------------------------------------
    def handle(self, method: str, msg: dict[str, Any]) -> dict[str, Any]:
        if method == "describe":
            if self._source is None:
                raise ValueError(f"client {self.client_id!r} has no column description")
            return describe_client(self._source.subset([self.client_id]), msg)
        if method == "setup":
            from fedlatent.engine.node.verify import setup_verification

            setup_verification(self, msg)  # (a rebuilt node's _setup from a round: not here)
            return self._setup(msg)
        if method == "settings":  # the site's floors, announced (no data)
            from fedlatent.engine.site.announce import announce

            return announce(self.site_policy, self.site_policy.site_name(self.client_id))
        if method == "secagg":
            from fedlatent.engine.secagg.secure import secagg_step

            if self.guard is not None:  # keys set up once per label (on disk); refusals logged
                return self.guard.secagg(self, msg, secagg_step)
            return secagg_step(self, msg)
        if self.guard is not None:  # the site's policy: refuse, replay or answer (recorded)
            return self.guard.answer(self, method, msg, self._reply)
        return self._reply(method, msg)

    def _reply(self, method: str, msg: dict[str, Any]) -> dict[str, Any]:
        if "verify/on" in self.state:  # verified rounds: transcript, replay (or a refusal)
            from fedlatent.engine.node.verify import verified_message

            msg, refusal = verified_message(self, method, msg)
            if refusal is not None:
                return refusal
        if "secagg/slot" in msg and method in ("estep", "query"):
            from fedlatent.engine.secagg.secure import mask_reply
            from fedlatent.engine.secagg.secure_checks import answer_secure

            return mask_reply(self, method, msg, answer_secure(self, method, msg))
        return self._answer(method, msg)

    def _answer(self, method: str, msg: dict[str, Any]) -> dict[str, Any]:
        if self.model is None:
            self._setup(msg)
        if method == "estep":
            return self._estep_or_error(msg)
        if method == "evaluate":
            return self._evaluate_or_error(msg)
        if method == "query":
            return self._query(msg)
        if method == "cv_init":
            return self._cv_init(msg)
        raise KeyError(f"client {self.client_id!r}: unknown method {method!r}")

    def _setup(self, msg: dict[str, Any]) -> dict[str, Any]:
        import json

        if self.guard is not None:
            refusal = self.guard.setup(msg)
            if refusal is not None:
                return refusal
        self.model = model_from_config(str(msg["model"]), json.loads(str(msg["model_config"])))
        sent = policy_from_json(str(msg.get("disclosure") or ""))
        own = self.own_disclosure
        self.disclosure = sent if own is None else stricter(own, sent)
        self.model.disclosure = self.disclosure
        self.model.identity = (None if self.identity is None
                               else self.identity.for_site(self.client_id))
        self._data = merge_rare_patterns(  # rows with a target (LCR); rare missingness
            self.model.fit_data(self._raw), self.disclosure, self.client_id)  # patterns merged
        self.model.site = self.guard
        refusal = setup_refusal(self.disclosure, self.client_id,
                                self.model.n_records(self._data)) or (
            self._rules_refusal(msg) if msg.get("fit") else None)
        if refusal:
            logger.log(self.log_level, "%s", refusal)
            return refusal_reply(refusal, "disclosure")
        self._setup_privacy(msg)
        refusal = "" if self.privacy is None else weights_refusal(self._raw.weight,
                                                                    self.client_id)
        if refusal:
            logger.log(self.log_level, "%s", refusal)
            return refusal_reply(refusal, "privacy")
        if not any(k.startswith("model/") for k in self.state):
            _put(self.state, "model", self.model.init_client_state(self._data))
            self.state.setdefault("engine/initialized", np.array(1.0))
        n = self.model.n_units(self._data)
        return {"n_units": units_number(n), **self._saturation_facts()}

    def _rules_refusal(self, msg: dict[str, Any]) -> str | None:
        """The saturation and rare-level rules at setup (:func:`setup_rule_refusal`); the
        saturation rule is left to the noise under differential privacy."""
        if self.disclosure.is_off:
            return None
        private = bool(msg.get("privacy")) or self.privacy is not None
        key = (id(self._data), self.disclosure, private)
        if getattr(self, "_rules_key", None) == key and not msg.get("batch_size"):
            return self._rules_why  # the same data and policy: the same answer
        from fedlatent.data.categorical import level_counts

        src = self._source
        levels = [] if src is None else level_counts(
            getattr(src, "encoding", None), src.feature_names, self._data.X, self._data.weight)
        if getattr(src, "formula", None) is not None:  # a formula's categorical variables
            levels += src.formula.level_counts(src.feature_names, self._data.X,
                                               self._data.weight)
        levels += self.model.disclosure_levels(self._data)
        policy = self.disclosure
        if private:  # the rule on numbers is DP's job then; levels still checked
            policy = replace(policy, count_scope="aggregate")
        b = int(msg.get("batch_size") or 0)
        batch = (None if b <= 0 else
                 self.model.n_records(self._data, np.arange(min(b, self.model.n_draws(
                     self._data)))))
        why = setup_rule_refusal(policy, self.client_id, self.model, self._data, levels, batch)
        self._rules_key, self._rules_why = key, why
        return why

    def _saturation_facts(self) -> dict[str, int]:
        """What the server's saturation check of an aggregate needs (secure aggregation):
        the free numbers of one reply, this client's records and their width."""
        F = self.model.reply_numbers(self._data)
        if F is None or self.disclosure.count_scope != "aggregate":
            return {}
        return {"reply_numbers": int(F), "n_records": int(self.model.n_records(self._data)),
                "record_width": int(self.model.record_width(self._data))}

    def _setup_privacy(self, msg: dict[str, Any]) -> None:
        """Differential privacy as the setup message sets it: calibrate, clip the data once."""
        from fedlatent.engine.privacy.client_dp import ClientPrivacy

        self.privacy = ClientPrivacy.from_message(msg, self.client_id, self.state,
                                                  honour_seed=self.honour_noise_seed)
        assert self.model is not None
        self.model.privacy = None if self.privacy is None else self.privacy.dp
        self._data = (self._data if self.privacy is None  # (fit_data's rows, from _setup)
                      else self.model.dp_clip(self._data, self.privacy.dp))

    def _private(self, sums, sensitivities, msg: dict[str, Any], what: str):
        """``sums`` with this client's calibrated noise (one release of its budget)."""
        assert self.privacy is not None
        if self.guard is not None:  # the ledger's count, never the restorable state's
            self.guard.before_release(self.privacy, self.state, what)
        out = self.privacy.release(
            sums, sensitivities, what=what, client_key=client_key(self.client_id),
            round_=int(msg.get("round", 0)),
            secagg=self.secagg if "secagg/slot" in msg else None, state=self.state)
        if self.guard is not None:  # on the ledger before the reply leaves
            self.guard.released(self.privacy, msg, what, self.model.n_records(self._data))
        return out

    # ------------------------------------------------------------------------------------------
    def _local_stats(self, params, rows, rng, commit: bool = True, *, statistics: int = 1,
                     mstate: dict[str, np.ndarray] | None = None):
        """The model's client step, refused (:class:`DisclosureRefused`) when it is a sum over
        fewer than ``min_records`` records, or when the reply's ``statistics`` statistics (a
        multi-point round sends ``1 + m``) carry too many numbers for them (the saturation
        rule), with blocks over too few records suppressed. ``mstate``: the model state to
        step from (None: the client's)."""
        assert self.model is not None
        n_rec = self.model.n_records(self._data, rows)
        refusal = check_counts(self.disclosure, self.client_id, n_rec,
                               "the statistic of this step" if rows is None
                               else "a mini-batch statistic")
        if not refusal and rows is None and not self.disclosure.is_off:  # (a setup that did
            refusal = self._rules_refusal({})  # not say it was a fit's: checked here)
        if not refusal and self.privacy is None and self.disclosure.count_scope == "client":
            refusal = self._saturation_refusal(n_rec, rows, statistics)
        if refusal:
            raise DisclosureRefused(refusal)
        mstate = _sub(self.state, "model") if mstate is None else mstate
        step = self.model.client_stats(params, self._data, mstate, rng, rows)
        blocks = self.model.disclosure_blocks(step.stats)
        step.stats, small = suppress_blocks(self.disclosure, step.stats, blocks)
        if blocks is not None and self.privacy is None:  # (DP's noise covers differences)
            step.stats, diff = suppress_differences(self.disclosure, step.stats, blocks[1],
                                                    self.model.disclosure_members(step.stats),
                                                    self.state)
            small = small + diff
        if small:
            logger.debug("client %r: blocks %s over fewer than min_records_per_block=%d "
                         "records (alone or differenced with earlier blocks) suppressed",
                         self.client_id, small, self.disclosure.min_records_per_block)
        if commit:
            _put(self.state, "model", step.state)
        return step

    def _saturation_refusal(self, n_rec, rows, statistics: int) -> str | None:
        """The saturation rule on a reply of ``statistics`` statistics (each a release: a
        multi-point round's reply counts ``1 + m`` times the numbers of one), or None."""
        F = self.model.reply_numbers(self._data)
        width = self.model.record_width(self._data)
        what = ("the round statistic" if rows is None else "a mini-batch statistic") \
            if statistics == 1 else \
            f"a reply of {statistics} statistics (the round's and {statistics - 1} extra points)"
        refusal = check_reply_numbers(self.disclosure, f"client {self.client_id!r}",
                                      None if F is None else statistics * int(F), n_rec, width,
                                      what)
        if refusal and statistics > 1 and F:
            admits = int(self.disclosure.max_parameters_per_record * float(n_rec) * width // F)
            refusal += (f". Each extra point is one more statistic of {F} numbers; this "
                        f"client admits {admits} a reply: " + (
                            f"ask at most {admits - 1} extra point(s) a round" if admits > 1
                            else "ask it for none") + " (Federation(acceleration=None): none)")
        return refusal

    def _extra_points(self, msg: dict[str, Any], mode: str) -> int:
        """:func:`~fedlatent.engine.node.pointstate.extra_points` of this client."""
        return extra_points(self, msg, mode)

    def _point_replies(self, msg: dict[str, Any], m: int, mstate, a_in) -> dict[str, Any]:
        """``point{j}/`` (the mean statistic) and ``objective{j}`` at each ``T(x_j)``: the
        client step from the model state ``mstate`` the round started from, suppression per
        point (each a release). A message with ``history`` (a model with ``point_state``)
        steps point ``j`` from the combination of kept states it names instead, and keeps
        what went in and came out (:mod:`~fedlatent.engine.node.pointstate`)."""
        rnd, track = int(msg["round"]), "history" in msg
        starts = [self._point_start(msg, j, mstate, a_in) for j in range(1, m + 1)] \
            if track else [mstate] * m  # every combination checked before any step
        out: dict[str, Any] = {}
        for j, start in enumerate(starts, 1):
            rng = client_rng(int(msg["seed"]), self.client_id, rnd, _P_MODEL)
            step = self._local_stats(unpack(msg, f"params{j}"), None, rng, commit=False,
                                     mstate=start)
            prefix, obj = point_keys(j)
            out.update(pack(prefix, (step.stats / (step.n or 1)).to_dict()))
            out[obj] = float(step.objective)
            if track:
                _put(self.state, in_key(rnd, j), start)
                _put(self.state, out_key(rnd, j), step.state)
        return out

    def _point_start(self, msg: dict[str, Any], j: int, a_out, a_in) -> dict[str, Any]:
        """The state extra point ``j`` is stepped from (:func:`~fedlatent.engine.node.
        pointstate.combination`, projected by the model); ValueError naming a point this
        client keeps no state for (a deviating server)."""
        def get(prefix):
            got = _sub(self.state, prefix)
            return {k: v[None] for k, v in got.items()} if got else None

        try:
            st = combination(msg, j, get, {k: v[None] for k, v in a_out.items()},
                             None if a_in is None else {k: v[None] for k, v in a_in.items()})
        except UnheldState as err:
            raise ValueError(
                f"client {self.client_id!r}: round {msg['round']}'s extra point {j} combines "
                f"{err}, which this client keeps no state for (a deviating server); a server "
                "may combine only the points of the rounds its 'history' named") from None
        start = {k: v[None] for k, v in a_out.items()}
        return {k: v[0] for k, v in self.model.project_point_state(st, start).items()}

    def _adopt_point(self, msg: dict[str, Any]) -> dict[str, np.ndarray] | None:
        """Before the E-step: the model state of the point of the round before that the
        server accepted (``msg["accepted"] = j``, kept by :meth:`_point_replies`; 0 or
        absent: the round's own statistic, the state the client already holds). Returns the
        state that point was stepped from (None: not kept). ValueError when the client keeps
        no state for point ``j`` of the round before (a deviating server)."""
        j, rnd = int(msg.get("accepted", 0) or 0), int(msg["round"])
        got = _sub(self.state, out_key(rnd - 1, j)) if "history" in msg else {}
        if j and not got:
            raise ValueError(
                f"client {self.client_id!r}: round {rnd}'s message accepts extra point {j} "
                f"of round {rnd - 1}, but this client keeps no model state for that point (a "
                "deviating server); the server must name one of the points it sent the round "
                "before (accepted = 1..m) or none (the round's own statistic)")
        if j:
            _put(self.state, "model", got)
        return _sub(self.state, in_key(rnd - 1, j)) or None if "history" in msg else None

    def _keep_history(self, msg: dict[str, Any], before: dict[str, np.ndarray]) -> None:
        """After a round with ``history``: the round's own point kept (``pinput{k}.0`` what
        it was stepped from, ``pstate{k}.0`` what it gave), inputs of earlier rounds and the
        outputs of rounds no longer in ``history`` dropped; without it, every kept state."""
        rnd = int(msg["round"])
        hist = history_rounds(msg)
        if hist is None and not any(k.startswith(_POINT_KINDS) and point_round(
                k.partition("/")[0]) for k in self.state):
            return
        for key in list(self.state):
            prefix = key.partition("/")[0]
            if (prefix.startswith(_POINT_KINDS) and point_round(prefix)
                    and (hist is None or stale(prefix, rnd, hist))):
                del self.state[key]
        if hist is not None:
            _put(self.state, in_key(rnd, 0), before)
            _put(self.state, out_key(rnd, 0), _sub(self.state, "model"))

    def _estep_or_error(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The E-step, or, if it raises, a reply carrying the exception's text (the server
        records the client as missing with it) and the state as it was before the round."""
        before = {k: v if k.startswith(_NOT_STEPPED) else np.array(v, copy=True)
                  for k, v in self.state.items()}
        try:
            return self._estep(msg)
        except Exception as err:  # noqa: BLE001 - reported to the server, not hidden
            self.state = before
            logger.log(self.log_level, "client %r: round %s failed: %s", self.client_id,
                       msg.get("round"), err)
            return {ERROR_KEY: f"{type(err).__name__}: {err}"}

    def _estep(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.model is not None
        check_message(self, msg)  # declared is evaluated
        seed = int(msg["seed"])
        rnd = int(msg["round"])
        mode = str(msg.get("mode", "full"))
        params = unpack(msg, "params")
        n_units = self.model.n_draws(self._data)  # what a mini-batch draws from
        rng_model = _LazyRng(seed, self.client_id, rnd, _P_MODEL)
        if self.privacy is not None and mode not in ("full", "batch"):
            raise ValueError(f"client {self.client_id!r}: E-step mode {mode!r} is not available "
                             "under differential privacy (SPIDER releases two correlated "
                             "statistics per round); use full passes or mini-batches")

        m, before, a_in = self._round_start(msg, mode)
        if mode == "full" or mode == "spider-refresh":
            step = self._local_stats(params, None, rng_model, statistics=1 + m)
            if self.privacy is not None:
                step.stats = Stats(self._private(
                    step.stats, self.model.dp_sensitivity(params, self.privacy.dp), msg,
                    f"round {rnd}'s statistic"))
                step.objective = 0.0  # not released: not covered by the noise
            S_c = step.stats / (step.n or 1)
            if mode == "spider-refresh":
                _put(self.state, "spider_S", S_c.to_dict())
                _put(self.state, "spider_params", params)
        elif mode == "batch":
            rows = self._batch(seed, rnd, n_units, int(msg["batch_size"]))
            step = self._local_stats(params, rows, rng_model)
            if self.privacy is not None:
                step.stats = Stats(self._private(
                    step.stats, self.model.dp_sensitivity(params, self.privacy.dp), msg,
                    f"round {rnd}'s mini-batch statistic"))
                step.objective = 0.0
            S_c = step.stats / (step.n or 1)
        elif mode == "spider":
            prev_S = _sub(self.state, "spider_S")
            prev_params = _sub(self.state, "spider_params")
            rows = self._batch(seed, rnd, n_units, int(msg["batch_size"]))
            if not prev_S:  # never refreshed (joined late): full pass
                step = self._local_stats(params, None, rng_model)
                S_c = step.stats / (step.n or 1)
            else:
                step = self._local_stats(params, rows, rng_model)
                old = self._local_stats(prev_params, rows, rng_model, commit=False)
                S_c = Stats(prev_S) + step.stats / (step.n or 1) - old.stats / (old.n or 1)
            _put(self.state, "spider_S", S_c.to_dict())
            _put(self.state, "spider_params", params)
        else:
            raise KeyError(f"unknown E-step mode {mode!r}")

        q = self._fedem_update(S_c, msg)
        reply = pack("delta", q.to_dict())
        reply["n"] = units_number(step.n)
        reply["objective"] = float(step.objective)
        if m:
            reply.update(self._point_replies(msg, m, before, a_in))
        self._keep_history(msg, before)
        return reply

    def _round_start(self, msg: dict[str, Any], mode: str):
        """``(m, before, a_in)``: the extra points asked (:meth:`_extra_points`), after the
        accepted point's state is adopted (:meth:`_adopt_point`, whose input ``a_in`` it
        returns) a copy of the model state the round starts from (None when neither the
        points nor ``history`` need it)."""
        try:
            history_rounds(msg)  # (checked before any state changes)
        except ValueError as err:
            raise ValueError(f"client {self.client_id!r}: {err}") from None
        a_in = self._adopt_point(msg)
        m = self._extra_points(msg, mode)
        before = {k: np.array(v, copy=True) for k, v in _sub(self.state, "model").items()} \
            if m or "history" in msg else None
        return m, before, a_in

    def _fedem_update(self, S_c: Stats, msg: dict[str, Any]) -> Stats:
        """``Q_c = Quant(S_c - S_hat - V_c)`` and ``V_c += alpha Q_c``: the client update of
        :func:`~fedlatent.engine.node.clientstep.fedem_rows` on a batch of one (the initialization
        round keeps ``S_c`` when control variates will start from it, and sends it)."""
        S_hat = Stats(unpack(msg, "S_hat"))
        use_cv = bool(msg.get("control_variates", False))
        reset = unpack(msg, "V_reset")
        if use_cv and reset:  # the server refused our last reply: back to the V_c it holds
            _put(self.state, "V", reset)
        V_c = Stats(_sub(self.state, "V")) if use_cv and _sub(self.state, "V") else None
        if len(S_hat) == 0 and bool(msg.get("keep_init", False)):
            _put(self.state, "init_S", S_c.to_dict())
        levels = int(msg.get("quant_levels", 0))
        cv = use_cv and len(S_hat) > 0
        d = S_c.flatten()[None, :].copy()
        uniforms = None
        if levels > 0:  # the counter-based stream: what the batched path draws for us
            keys = stream_keys(int(msg["seed"]), [client_key(self.client_id)],
                               int(msg["round"]), _P_QUANT)
            uniforms = stream_uniforms(keys, d.shape[1])
        V_new = fedem_rows(
            d, None, _flat_like(S_c, S_hat) if len(S_hat) else None,
            _flat_like(S_c, V_c) if V_c is not None else np.zeros_like(d),
            np.array([V_c is not None]), levels=levels, sizes=[v.size for v in S_c.values()],
            uniforms=uniforms, alpha=float(msg["alpha"]) if cv else 1.0, cv=cv)
        if V_new is not None:
            _put(self.state, "V", S_c.unflatten(V_new[0]).to_dict())
        return S_c.unflatten(d[0])

    def _batch(self, seed: int, rnd: int, n_units: int, batch_size: int) -> np.ndarray:
        """This round's mini-batch: ``min(batch_size, n_units)`` rows without replacement,
        from the client's counter-based stream (the batched path's rows for this client)."""
        keys = stream_keys(seed, [client_key(self.client_id)], rnd, _P_BATCH)
        return np.flatnonzero(batch_rows(keys, np.array([n_units]), batch_size)[0])

    def _cv_init(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Control variate at the start: ``V_c = S_c(theta_0) - S_hat_0`` (Dieuleveut et al.'s
        choice), from the statistic this client computed in the initialization round."""
        init = _sub(self.state, "init_S")
        if init:
            V = Stats(init) - Stats(unpack(msg, "S_hat"))
            _put(self.state, "V", V.to_dict())
            _put(self.state, "init_S", {})
        return {"ok": 1}

    def _evaluate_or_error(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The evaluation pass, or, if it raises, a reply carrying the exception's text (as
        for the E-step; evaluating changes no state)."""
        try:
            return self._evaluate(msg)
        except Exception as err:  # noqa: BLE001 - reported to the server, not hidden
            logger.log(self.log_level, "client %r: evaluation of round %s failed: %s",
                       self.client_id, msg.get("round"), err)
            return {ERROR_KEY: f"{type(err).__name__}: {err}"}

    def _evaluate(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.model is not None
        if self.privacy is not None:
            raise ValueError(f"client {self.client_id!r}: the evaluation pass (track_h) is not "
                             "available under differential privacy (it is not in the budget)")
        check_round(self.model, self._data, msg, self.client_id, "evaluation of round")
        params = unpack(msg, "params")
        rng = client_rng(int(msg["seed"]), self.client_id, int(msg["round"]), _P_MODEL)
        step = self._local_stats(params, None, rng, commit=False)
        reply = pack("delta", (step.stats / (step.n or 1)).to_dict())
        reply["n"] = units_number(step.n)
        reply["objective"] = float(step.objective)
        return reply

    def _query(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.model is not None
        name = str(msg["query"])
        import zlib

        purpose = _P_QUERY + (zlib.crc32(name.encode()) % 1000) * 10
        rnd = int(msg.get("round", 0))
        rng = client_rng(int(msg.get("seed", 0)), self.client_id, rnd, purpose)
        mstate = _sub(self.state, "model")
        try:
            reply, mstate = self.model.client_query(name, msg, self._data, mstate, rng)
        except DisclosureRefused as err:  # the model declined: the server learns why
            logger.log(self.log_level, "client %r: query %r refused: %s", self.client_id, name,
                       err)
            return {ERROR_KEY: f"client {self.client_id!r}: {err}"}
        if self.privacy is not None:
            sens = self.model.dp_query_sensitivity(name, msg, self.privacy.dp)
            if sens is None:
                return {ERROR_KEY: f"client {self.client_id!r}: query {name!r} is not available "
                                   "under differential privacy (its reply has no declared "
                                   "sensitivity, so no noise can protect it)"}
            from fedlatent.engine.privacy.dp import PrivacyBudgetExceeded

            try:
                reply = self._private(reply, sens, msg, f"query {name!r}")
            except PrivacyBudgetExceeded as err:
                return {ERROR_KEY: str(err)}
        _put(self.state, "model", mstate)
        return reply
