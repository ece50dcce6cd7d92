"""The default runtime: every client is an object in this process holding its own data.

When the model has a batched client step (and messages are not recorded), the round loop runs
the clients' E-steps all at once (:mod:`fedlatent.engine.node.batched`); the clients' states then
live in arrays and are written back to the client objects whenever they are looked at
(``nodes``, :meth:`InProcessRuntime.get_client_states`, a per-client call).
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

import numpy as np

from fedlatent.data.dataset import FederatedDataset
from fedlatent.data.validation import DataValidationError
from fedlatent.engine.contract.model import FederatedModel
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.protocol.runtime import Runtime

__all__ = ["InProcessRuntime"]

logger = logging.getLogger(__name__)


def _freeze(msg: dict[str, Any]) -> dict[str, Any]:
    """A copy of a message, as if it had crossed a wire (no shared arrays)."""
    return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else copy.copy(v))
            for k, v in msg.items()}


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
    """``ClientNode`` keywords of client ``cid``'s site policy (none: no keywords)."""
    if policies is None:
        return {}
    if isinstance(policies, dict):
        return {"policy": policies[cid]} if cid in policies else {}
    from dataclasses import replace

    if policies.directory is not None:  # one ledger per site, never shared (a client id is
        safe = re.sub(r"[^A-Za-z0-9_-]", "_", str(cid))  # data, never a path)
        policies = replace(policies, directory=policies.directory / f"site-{safe}")
    return {"policy": policies}


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
        built here for a test may say ``simulation = true`` to keep a ``noise_seed``.
    """

    def __init__(self, fd: FederatedDataset, record: bool = False, batched: bool = True,
                 policies=None):
        self._ids = fd.client_ids
        self._fd = fd
        self._nodes = {cid: ClientNode(cid, fd[cid], source=fd, **_site(policies, cid))
                       for cid in self._ids}
        for node in self._nodes.values():  # the server logs their faults, summarized
            node.log_level = logging.DEBUG
        self.record = record
        self.use_batched = bool(batched)
        self.log: list[tuple[str, str, str, dict[str, Any]]] = []
        self._batch = None
        #: whether the batch's arrays hold the clients' states (else the nodes do)
        self._batch_owns = False
        #: how many batched calls ran (``estep``, ``evaluate``, ``cv_init``)
        self.batched_calls = 0

    @property
    def client_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def nodes(self) -> dict[str, ClientNode]:
        """The client objects, their states up to date."""
        self._to_nodes()
        return self._nodes

    def _to_nodes(self) -> None:
        if self._batch_owns:
            for cid, st in zip(self._ids, self._batch.dump()):
                self._nodes[cid].state = st
            self._batch_owns = False

    def batched(self, model):
        """The batched client side for ``model`` (None: clients are called one by one)."""
        if self.record or not self.use_batched or type(self).call is not InProcessRuntime.call:
            return None  # recording, or a runtime that changes what clients send: one by one
        if not model.batched_step:  # declared by the model (FederatedModel.batched_step)
            return None
        own_blocks = type(model).disclosure_blocks is not FederatedModel.disclosure_blocks
        if (own_blocks and not model.batched_units) or any(
                n.own_disclosure is not None or n.guard is not None
                for n in self._nodes.values()):
            return None  # a client may suppress blocks or refuse by its own policy: one by one
        if getattr(self._fd, "has_weights", False):
            return None  # frequency weights: the clients' own steps weight their rows
        if self._batch is None or self._batch.model.get_config() != model.get_config() \
                or self._batch.model.name != model.name:
            from fedlatent.engine.node.batched import BatchedClients

            self._to_nodes()
            self._batch = BatchedClients(self._ids, [self._fd[c] for c in self._ids], model)
        if self._ids:  # the policy the server sent every client at setup (none has its own)
            self._batch.policy = self._nodes[self._ids[0]].disclosure
        return self

    def call_batched(self, method: str, idx: np.ndarray, msg: dict[str, Any], resets=None):
        """``estep``, ``evaluate`` or ``cv_init`` of the clients at positions ``idx`` at once."""
        b = self._batch
        self.batched_calls += 1
        if not self._batch_owns:
            b.load([self._nodes[c].state for c in self._ids])
            self._batch_owns = True
        if method == "estep":
            return b.estep(idx, msg, resets or {})
        if method == "evaluate":
            return b.evaluate(idx, msg)
        if method == "cv_init":
            return b.cv_init(idx, msg)
        raise KeyError(f"no batched method {method!r}")

    def call(self, client_ids, method, messages):
        self._to_nodes()
        replies = {}
        for cid in client_ids:
            msg = _freeze(messages[cid])
            if self.record:
                self.log.append(("down", cid, method, msg))
            reply = _freeze(_bounded(cid, method, self._handle(cid, method, msg)))
            if self.record:
                self.log.append(("up", cid, method, reply))
            replies[cid] = reply
        return replies

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

    def get_client_states(self):
        if self._batch_owns:
            return {cid: st for cid, st in zip(self._ids, self._batch.dump())}
        return {cid: {k: np.array(v) for k, v in n.state.items()}
                for cid, n in self._nodes.items()}

    def client_state(self, key: str) -> dict[str, np.ndarray]:
        """One entry of every client's state (e.g. ``"model/labels"``), copied; clients
        without it left out. What :meth:`get_client_states` holds, at a fraction of its cost
        for a caller that reads one entry every round."""
        if self._batch_owns:
            return self._batch.state_of(key)
        return {cid: np.array(n.state[key]) for cid, n in self._nodes.items()
                if key in n.state}

    def set_client_states(self, states):
        self._to_nodes()
        for cid, st in states.items():
            self._nodes[cid].state = {k: np.array(v) for k, v in st.items()}
