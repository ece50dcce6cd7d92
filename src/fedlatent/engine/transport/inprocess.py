"""The default runtime: every client is an object in this process holding its own data.

When the model has a batched client step (and messages are not recorded), the round loop runs
the clients' E-steps all at once (:mod:`fedlatent.engine.node.batched`); the clients' states then
live in arrays and are written back to the client objects whenever they are looked at
(``nodes``, :meth:`InProcessRuntime.get_client_states`, a per-client call).
"""

from __future__ import annotations

import copy
import functools
import logging
import re
import warnings
from typing import Any

import numpy as np

from fedlatent.data.dataset import FederatedDataset
from fedlatent.data.validation import DataValidationError
from fedlatent.engine.contract.model import FederatedModel
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.protocol.messages import ERROR_KEY, frozen, refusal_reply
from fedlatent.engine.protocol.runtime import Runtime

__all__ = ["InProcessRuntime"]

logger = logging.getLogger(__name__)


def _freeze(msg: dict[str, Any], share: bool = False) -> dict[str, Any]:
    """A copy of a message, as if it had crossed a wire (no shared arrays). With ``share``
    (the secure-aggregation set-up's messages, method ``secagg``), an array nobody can write
    (:func:`~fedlatent.engine.protocol.messages.frozen`) is relayed as is, as a copy would be:
    the n openings every client is sent, 320 KB at 10,000 clients, are not copied once per
    client. Other methods keep their copies (relaying SEC's models uncopied changed the timing
    of its threaded exchange enough to meet a CPython 3.11 race: a SystemError from numpy's
    header parse, ``ast`` in two threads at once)."""
    return {k: (v if share and frozen(v) else np.array(v, copy=True))
            if isinstance(v, np.ndarray) else copy.copy(v) for k, v in msg.items()}


def _bounded(cid: str, method: str, reply: dict[str, Any]) -> dict[str, Any]:
    """``reply``, or an error reply when its arrays' declared sizes or strides are beyond
    what a message may be (:func:`~fedlatent.engine.protocol.bounds.message_problem`): refused
    before the copy that stands for the wire would allocate it."""
    from fedlatent.engine.protocol.bounds import message_problem

    why = message_problem(reply)
    if why is None:
        return reply
    logger.warning("client %r: its %s reply was refused before it was copied: %s", cid, method,
                   why)
    return {ERROR_KEY: f"reply refused before it was copied: {why}"}


def _error_reply(cid: str, method: str, msg: dict[str, Any], err: Exception) -> dict[str, Any]:
    """The reply of a client whose handler raised ``err``: its type and text."""
    logger.debug("client %r: %s (round %s) raised %r", cid, method, msg.get("round"), err)
    return {ERROR_KEY: f"{type(err).__name__}: {err}"}


def _site(policies, cid: str) -> dict[str, Any]:
    """``ClientNode`` keywords of client ``cid``'s site policy (none given: the relaxed
    policy of a site this runtime holds itself, :meth:`SitePolicy.for_simulation`)."""
    if isinstance(policies, dict):  # one per client id, as it is
        policies = policies.get(cid)
    elif policies is not None and policies.directory is not None:
        from dataclasses import replace  # one ledger per site, never shared (a client id

        safe = re.sub(r"[^A-Za-z0-9_-]", "_", str(cid))  # is data, never a path)
        policies = replace(policies, directory=policies.directory / f"site-{safe}")
    return {"policy": _simulated() if policies is None else policies}


@functools.cache
def _simulated():
    """The relaxed policy every simulated site without one shares (built once)."""
    from fedlatent.engine.site.policy import SitePolicy

    return SitePolicy.for_simulation()


class _Nodes(dict):
    """The client objects by id, each built when first looked up (``nodes[cid]``): a batched
    fit of 100,000 clients never needs most of them (building them cost half a second). The
    dict holds the ones built; an id not yet looked up is a client as built: no state, the
    server's policy (``policies`` None: the relaxed policy of a simulated site, so no own
    rules and no guard)."""

    def __init__(self, fd: FederatedDataset, policies):
        super().__init__()
        self.fd, self.policies = fd, policies

    def __missing__(self, cid: str) -> ClientNode:
        node = ClientNode(cid, self.fd[cid], source=self.fd, **_site(self.policies, cid))
        node.log_level = logging.DEBUG  # the server logs their faults, summarized
        self[cid] = node
        return node

    def build(self, ids) -> None:
        """Every client of ``ids`` built."""
        for cid in ids:
            if cid not in self:
                self.__missing__(cid)

    def state(self, cid: str) -> dict:
        """Client ``cid``'s state (empty for a client not built yet), not building it."""
        node = self.get(cid)
        return {} if node is None else node.state


class _NoWorkers:
    """:class:`~fedlatent.engine.secagg.ahead.Ahead` with one job: nothing ahead."""

    worker_cpu, taken = 0.0, 0

    def __init__(self, n: int = 0):
        self.n = n

    def order(self):
        return range(self.n)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def offer(self, i: int) -> None:
        return None


def _set_up_jobs(n_jobs) -> int:
    """Processes for the secure-aggregation set-up's agreements (``n_jobs``, scikit-learn's
    convention); where workers cannot be forked, 1, said once."""
    if n_jobs is None or (isinstance(n_jobs, int) and n_jobs == 1):
        return 1  # (the default: nothing imported)
    from fedlatent.engine.secagg.ahead import can_fork, effective_jobs

    jobs = effective_jobs(n_jobs)
    if jobs > 1 and not can_fork():
        warnings.warn(f"InProcessRuntime(n_jobs={n_jobs!r}): the secure-aggregation set-up "
                      "runs its agreements in forked worker processes on Linux only; here it "
                      "runs them in this process (1 job)", RuntimeWarning, stacklevel=3)
        return 1
    return jobs


class InProcessRuntime(Runtime):
    """Clients as objects; messages are copied both ways as if serialized.

    Parameters
    ----------
    fd : FederatedDataset
    record : bool, default False
        Keep every message that crosses (``self.log``: (direction, client, method, message)),
        so tests can inspect exactly what left each client. Recording runs the clients one by
        one (no batched step).
    batched : bool, default True
        Use the model's batched client step when it has one.
    policies : SitePolicy or dict of str to SitePolicy, optional
        The sites' own policies (:mod:`fedlatent.engine.site`): one for every client (its
        directory, if any, gets a sub-directory per client) or one per client id. A policy
        built here for a test may say ``simulation = true`` to keep a ``noise_seed``. A client
        without one holds :meth:`SitePolicy.for_simulation` (this runtime holds every site: the
        server's settings are the sites'); ``SitePolicy()`` gives it the library's default.
    n_jobs : int or None, default 1
        Processes for the secure-aggregation set-up's X25519 agreements (k per site, about
        half its time): 1 (or None) this one; 2 one forked worker besides it; -1 every core
        this process may use, -2 all but one (scikit-learn's convention). Linux only
        (elsewhere one process, with a RuntimeWarning); the results are those of one job
        (:mod:`fedlatent.engine.secagg.ahead`). Nothing else runs in the workers.
    """

    def __init__(self, fd: FederatedDataset, record: bool = False, batched: bool = True,
                 policies=None, n_jobs: int | None = 1):
        self._ids = fd.client_ids
        self._fd = fd
        self._nodes = _Nodes(fd, policies)
        if policies is not None:  # (a site's policy is read, and refused, at once)
            self._nodes.build(self._ids)
        self.record = record
        self.use_batched = bool(batched)
        self.log: list[tuple[str, str, str, dict[str, Any]]] = []
        self._batch = None
        #: whether the batch's arrays hold the clients' states (else the nodes do)
        self._batch_owns = False
        #: how many batched calls ran (``estep``, ``evaluate``, ``cv_init``, and the setups
        #: and queries answered at once, :meth:`call_rows`)
        self.batched_calls = 0
        #: a setup answered at once whose message the nodes have not handled yet (each
        #: node handles it when the nodes are first looked at)
        self._pending_setup: dict[str, Any] | None = None
        #: the last setup message and the clients' model rebuilt from it (batched queries)
        self._setup_msg: dict[str, Any] | None = None
        self._client_model: tuple[Any, FederatedModel] | None = None
        #: the roster of the sites' keys given to them for secure aggregation (None: not yet)
        self._provisioned = None
        self.n_jobs = n_jobs
        self._jobs = _set_up_jobs(n_jobs)
        #: CPU seconds of the set-up's worker processes (``n_jobs``), reaped
        self.worker_cpu = 0.0
        #: sites whose agreements a worker computed
        self.worker_sites = 0
        #: whether every node is plain (no own policy or guard) and the rows unweighted
        #: (None: not looked at since the nodes were last handed out)
        self._plain: bool | None = None

    @property
    def client_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def sites_relaxed(self) -> bool:
        """Whether every site is one this runtime holds without a policy (the relaxed
        simulation policy): they announce no floors, so none are asked for."""
        return self._nodes.policies is None

    @property
    def nodes(self) -> dict[str, ClientNode]:
        """The client objects, their states up to date."""
        self._to_nodes()
        self._nodes.build(self._ids)
        self._plain = None  # whoever holds them may change them: looked at again
        return self._nodes

    def _to_nodes(self) -> None:
        """The nodes take the batch's states and a setup made at once (a client not built
        yet and nothing to take stays unbuilt: it is as built)."""
        if self._batch_owns or self._pending_setup is not None:
            self._nodes.build(self._ids)
        if self._batch_owns:
            for cid, st in zip(self._ids, self._batch.dump()):
                self._nodes[cid].state = st
            self._batch_owns = False
        if self._pending_setup is not None:  # the nodes catch up with a setup made at once
            msg, self._pending_setup = self._pending_setup, None
            for cid in self._ids:
                self._nodes[cid].handle("setup", _freeze(msg))

    def _load_batch(self) -> None:
        """The batch's arrays take the clients' states (unless they hold them already)."""
        if not self._batch_owns:
            self._batch.load([self._nodes.state(c) for c in self._ids])
            self._batch_owns = True

    def batched(self, model):
        """The batched client side for ``model`` (None: clients are called one by one)."""
        if self.record or not self.use_batched or type(self).call is not InProcessRuntime.call:
            return None  # recording, or a runtime that changes what clients send: one by one
        if not model.batched_step:  # declared by the model (FederatedModel.batched_step)
            return None
        if self._plain is None:  # (once, not at every call: a scan of every client)
            self._plain = not any(n.own_disclosure is not None or n.guard is not None
                                  for n in self._nodes.values()) \
                and not getattr(self._fd, "has_weights", False)
        own_blocks = type(model).disclosure_blocks is not FederatedModel.disclosure_blocks
        if (own_blocks and not model.batched_units) or not self._plain:
            # a client may suppress blocks or refuse by its own policy, or the clients' own
            # steps weight their rows (frequency weights): one by one
            return None
        if self._batch is None or self._batch.model.get_config() != model.get_config() \
                or self._batch.model.name != model.name:
            from fedlatent.engine.node.batched import BatchedClients

            self._to_nodes()
            self._batch = BatchedClients(self._ids, [self._fd[c] for c in self._ids], model)
        if self._ids:  # the policy the server sent every client at setup (none has its own)
            self._batch.policy = self._nodes[self._ids[0]].disclosure
        if model.batched_units and model.batch_declines(self._batch.units, self._batch.policy):
            return None
        return self

    def call_batched(self, method: str, idx: np.ndarray, msg: dict[str, Any], resets=None):
        """``estep``, ``evaluate`` or ``cv_init`` of the clients at positions ``idx`` at once."""
        b = self._batch
        self.batched_calls += 1
        self._load_batch()
        if method in ("estep", "evaluate") and self._ids:  # as every node checks (declared)
            from fedlatent.engine.node.declared import check_round

            check_round(b.model, self._fd[self._ids[0]], msg, self._ids[0])
        if method == "estep":
            self._points_check(msg, idx)
            return b.estep(idx, msg, resets or {})
        if method == "evaluate":
            return b.evaluate(idx, msg)
        if method == "cv_init":
            return b.cv_init(idx, msg)
        raise KeyError(f"no batched method {method!r}")

    def _points_check(self, msg: dict[str, Any], idx: np.ndarray) -> None:
        """A round with ``m`` extra points: its replies carry ``1 + m`` statistics, which the
        saturation rule counts (as each node does, :meth:`ClientNode._local_stats`); where a
        drawn client's rule refuses them, NotImplementedError: the clients then answer one by
        one, each with its own refusal."""
        from fedlatent.engine.privacy.disclosure import check_reply_numbers

        m = int(msg.get("points", 0) or 0)
        b = self._batch
        policy = b.policy if self._setup_msg is None else self._rebuilt(self._setup_msg)[1]
        if m <= 0 or b.batch is None or policy.count_scope != "client" or policy.is_off:
            return
        first = self._fd[self._ids[0]]  # the default hooks: the same numbers for every client
        F, w = b.model.reply_numbers(first), int(b.model.record_width(first))
        units = b.batch.n_units[idx]
        if F is None or not np.any((1 + m) * F > policy.max_parameters_per_record * units * w):
            return
        i = int(idx[np.argmax((1 + m) * F > policy.max_parameters_per_record * units * w)])
        why = check_reply_numbers(policy, f"client {self._ids[i]!r}", (1 + m) * F,
                                  int(b.batch.n_units[i]), w, f"a reply of {1 + m} statistics")
        if why:
            raise NotImplementedError(why)

    def call_rows(self, model, client_ids, method, message):
        """``setup`` of every client, or a query the model batches
        (``FederatedModel.batched_queries``), answered for the clients at once (rows; see
        :meth:`~fedlatent.engine.protocol.runtime.Runtime.call_rows`); None where the clients
        must answer one by one (no batched side for ``model``, a setup with differential
        privacy or a model's own setup hooks, a query it does not batch)."""
        if method not in ("setup", "query") or self.batched(model) is None:
            return None
        if method == "setup":
            return self._setup_rows(model, list(client_ids), message)
        return self._query_rows(model, list(client_ids), message)

    def _setup_rows(self, model, client_ids: list[str], msg: dict[str, Any]):
        """Every client's setup at once: the model rebuilt once from the message (as each
        client would), the units and the disclosure policy's refusals for all clients; the
        nodes handle the message themselves when first looked at (:meth:`_to_nodes`)."""
        own = [h for h in ("fit_data", "init_client_state", "n_units", "n_records")
               if getattr(type(model), h) is not getattr(FederatedModel, h)]
        if own or "privacy" in msg or client_ids != self._ids:
            return None
        from fedlatent.engine.privacy.enforce import setup_refusal

        msg = _freeze(msg)
        _, policy = self._rebuilt(msg)  # a model or policy no client could build raises here
        units = self._batch.batch.n_units  # rows: the units and records of the default hooks
        errors = {}
        for i in np.flatnonzero((units > 0) & (units < policy.min_records)).tolist():
            why = setup_refusal(policy, self._ids[i], int(units[i]))
            if why:
                errors[i] = refusal_reply(why, "disclosure")
        if policy.count_scope != "client" and not policy.is_off:
            return None  # the rules on an aggregate need every client's own reply
        if msg.get("fit") and not policy.is_off:  # the rules on what a reply determines
            rules = self._rules_rows(model, policy, msg, units)
            if rules is None:
                return None
            errors = {**rules, **errors}
        self._load_batch()
        self._batch.mark_setup()
        self._pending_setup = self._setup_msg = msg
        self.batched_calls += 1
        return iter([(np.arange(len(self._ids)), {"n_units": units.astype(np.float64)}, errors)])

    def _rules_rows(self, model, policy, msg: dict[str, Any], units: np.ndarray):
        """The saturation rule of a fit's setup for every client at once (``{position:
        refusal}``, as each client's own setup check words it), or None where the clients must
        check themselves: rare levels to count (encoded columns, the model's own categorical
        variables), mini-batches, or a scope other than the client's."""
        from fedlatent.engine.privacy.disclosure import check_reply_numbers

        if (getattr(self._fd, "encoding", None) is not None or msg.get("batch_size")
                or policy.count_scope != "client"
                or type(model).disclosure_levels is not FederatedModel.disclosure_levels):
            return None
        first = self._fd[self._ids[0]]  # the default hooks: the same numbers for every client
        F, w = model.reply_numbers(first), int(model.record_width(first))
        if F is None:
            return {}
        bad = np.flatnonzero((units > 0) & (F > policy.max_parameters_per_record * units * w))
        out = {}
        for i in bad.tolist():
            why = check_reply_numbers(policy, f"client {self._ids[i]!r}", F, int(units[i]), w,
                                      "the round statistic")
            if why:
                out[i] = refusal_reply(why, "disclosure")
        return out

    def _rebuilt(self, msg: dict[str, Any]):
        """``(model, policy)`` a client rebuilds from setup message ``msg`` (cached)."""
        import json

        from fedlatent.engine.contract.registry import model_from_config
        from fedlatent.engine.privacy.enforce import policy_from_json

        key = (msg["model"], msg["model_config"], msg.get("disclosure"))
        if self._client_model is None or self._client_model[0] != key:
            m = model_from_config(str(msg["model"]), json.loads(str(msg["model_config"])))
            m.disclosure = policy_from_json(str(msg.get("disclosure") or ""))
            self._client_model = (key, m)
        m = self._client_model[1]
        return m, m.disclosure

    def _query_rows(self, model, client_ids: list[str], msg: dict[str, Any]):
        """The clients' replies to a query the model batches, as chunks of rows."""
        if str(msg.get("query")) not in model.batched_queries or self._setup_msg is None:
            return None
        client, _ = self._rebuilt(self._setup_msg)
        if client_ids == self._ids:
            idx = np.arange(len(self._ids))
        else:
            pos = self._batch.pos
            idx = np.array([pos[c] for c in client_ids], dtype=np.int64)
            if np.any(np.diff(idx) <= 0):
                return None  # (rows are made in client order)
        self._load_batch()
        self.batched_calls += 1
        return ((rows, fields, {}) for rows, fields in
                self._batch.query(idx, _freeze(msg), client))

    def call(self, client_ids, method, messages):
        self._to_nodes()
        if method == "setup" and client_ids:
            self._setup_msg = dict(messages[client_ids[0]])
        replies = {}
        with self._ahead(client_ids, method, messages) as ahead:
            for i in ahead.order():
                cid = client_ids[i]
                msg = _freeze(messages[cid], share=method == "secagg")
                if self.record:
                    self.log.append(("down", cid, method, msg))
                ahead.offer(i)
                reply = _freeze(_bounded(cid, method, self._handle(cid, method, msg)))
                if self.record:
                    self.log.append(("up", cid, method, reply))
                replies[cid] = reply
        self.worker_cpu += ahead.worker_cpu
        self.worker_sites += ahead.taken
        return replies if isinstance(ahead, _NoWorkers) else {c: replies[c] for c in client_ids}

    def _ahead(self, client_ids, method: str, messages):
        """The secure-aggregation set-up's agreements ahead in worker processes
        (:class:`~fedlatent.engine.secagg.ahead.Ahead`): for its roster step with ``n_jobs``
        other than 1, else a stand-in doing nothing (the sites in order)."""
        if self._jobs == 1 or method != "secagg" or len(client_ids) < 2 or any(
                messages[c].get("step") != "roster" for c in client_ids):
            return _NoWorkers(len(client_ids))
        from fedlatent.engine.secagg.ahead import Ahead

        return Ahead(client_ids, [self._nodes[c].secagg for c in client_ids], messages,
                     self._jobs)

    def _handle(self, cid: str, method: str, msg: dict[str, Any]) -> dict[str, Any]:
        """Client ``cid``'s reply; an exception escaping its handler becomes an error reply
        (the server records the client as missing, or an exchange every client must answer
        stops naming it), as a Flower node's error does. The data's own errors
        (``DataValidationError``) and, outside the rounds' E-step and evaluation, the
        ValueError and TypeError that say a setting is wrong (a secure-aggregation bound, a
        column) reach the caller as they are."""
        try:
            return self._nodes[cid].handle(method, msg)
        except DataValidationError:
            raise
        except (ValueError, TypeError) as err:
            if method not in ("estep", "evaluate"):
                raise
            return _error_reply(cid, method, msg, err)
        except Exception as err:  # noqa: BLE001 - reported to the server as the client's error
            return _error_reply(cid, method, msg, err)

    def provision_identities(self, client_ids) -> None:
        """A signing key for each site held here that brings none (a site's own key kept) and a
        roster of every one's key, given to the sites that pin no roster of their own
        (:attr:`ClientNode.provisioned`): secure aggregation then authenticates every peer and
        its consistency statements, as on a deployment with pinned rosters. Once per runtime
        (a new site id: again)."""
        ids = list(self._ids)
        if self._provisioned is not None and self._provisioned.sites == tuple(sorted(ids)):
            return
        from fedlatent.engine.site.keys import Roster, SiteIdentity, SiteKeys

        self._nodes.build(ids)
        keys = {}
        for cid in ids:
            own = self._nodes[cid].identity
            keys[cid] = own.keys if own is not None and own.keys is not None \
                else SiteKeys.generate()
        roster = self._provisioned = Roster({c: k.public_key for c, k in keys.items()},
                                            where="the in-process runtime's roster")
        for cid in ids:
            self._nodes[cid].provisioned = SiteIdentity(keys[cid], roster, site=cid)

    def get_client_states(self):
        if self._batch_owns:
            return {cid: st for cid, st in zip(self._ids, self._batch.dump())}
        return {cid: {k: np.array(v) for k, v in self._nodes.state(cid).items()}
                for cid in self._ids}

    def client_state(self, key: str) -> dict[str, np.ndarray]:
        """One entry of every client's state (e.g. ``"model/labels"``), copied; clients
        without it left out. What :meth:`get_client_states` holds, at a fraction of its cost
        for a caller that reads one entry every round."""
        if self._batch_owns:
            return self._batch.state_of(key)
        return {cid: np.array(self._nodes.state(cid)[key]) for cid in self._ids
                if key in self._nodes.state(cid)}

    def set_client_states(self, states):
        self._to_nodes()
        for cid, st in states.items():
            self._nodes[cid].state = {k: np.array(v) for k, v in st.items()}
