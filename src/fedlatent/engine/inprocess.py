"""The default runtime: every client is an object in this process holding its own data."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..data.dataset import FederatedDataset
from .client import ClientNode
from .runtime import Runtime

__all__ = ["InProcessRuntime"]


def _freeze(msg: dict[str, Any]) -> dict[str, Any]:
    """A copy of a message, as if it had crossed a wire (no shared arrays)."""
    return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else copy.copy(v))
            for k, v in msg.items()}


class InProcessRuntime(Runtime):
    """Clients as objects; messages are copied both ways as if serialized.

    Parameters
    ----------
    fd : FederatedDataset
    record : bool, default False
        Keep every message that crosses (``self.log``: (direction, client, method, message)),
        so tests can inspect exactly what left each client.
    """

    def __init__(self, fd: FederatedDataset, record: bool = False):
        self._ids = fd.client_ids
        self._fd = fd
        self.nodes = {cid: ClientNode(cid, fd[cid], source=fd) for cid in self._ids}
        self.record = record
        self.log: list[tuple[str, str, str, dict[str, Any]]] = []

    @property
    def client_ids(self) -> list[str]:
        return list(self._ids)

    def call(self, client_ids, method, messages):
        replies = {}
        for cid in client_ids:
            msg = _freeze(messages[cid])
            if self.record:
                self.log.append(("down", cid, method, msg))
            reply = _freeze(self.nodes[cid].handle(method, msg))
            if self.record:
                self.log.append(("up", cid, method, reply))
            replies[cid] = reply
        return replies

    def get_client_states(self):
        return {cid: {k: np.array(v) for k, v in n.state.items()} for cid, n in self.nodes.items()}

    def set_client_states(self, states):
        for cid, st in states.items():
            self.nodes[cid].state = {k: np.array(v) for k, v in st.items()}
