"""The transport interface the engine talks to. Models never import a runtime."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

__all__ = ["Runtime", "SiteSubset"]


class Runtime(ABC):
    """Carries messages between the server loop and client nodes.

    ``call`` sends one message per client and returns the replies; a client that does not answer
    (dropped, timed out) is absent from the result, and the engine treats it as not taking part.
    """

    @property
    @abstractmethod
    def client_ids(self) -> list[str]:
        """Client ids, sorted."""

    @abstractmethod
    def call(
        self, client_ids: list[str], method: str, messages: dict[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        """Deliver ``messages[cid]`` to each client; return ``{cid: reply}`` of those answering."""

    def broadcast(
        self, client_ids: list[str], method: str, message: dict[str, Any]
    ) -> dict[str, dict[str, Any]]:
        return self.call(client_ids, method, {c: message for c in client_ids})

    def batched(self, model) -> Any:
        """The batched client side for ``model`` (an object with ``call_batched``), or None
        (the default): the round loop then calls the clients one message at a time. Only a
        runtime holding every client's data in one process can batch (``InProcessRuntime``)."""
        return None

    def call_rows(self, model, client_ids: list[str], method: str,
                  message: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[int, str]] | None:
        """The replies of the clients ``client_ids`` to one ``message`` computed at once:
        ``(fields, errors)``, ``fields[k]`` stacking every client's entry ``k`` (one row per
        client, in the order of ``client_ids``) and ``errors`` mapping a position to why that
        client declined (its text, or the reply of a refusal by a rule:
        :func:`~fedlatent.engine.protocol.messages.refusal_reply`). None (the default): the
        caller sends the message client by client (:meth:`call`). Only a runtime holding
        every client in one process answers so (``InProcessRuntime``, for a model with a
        batched step and the methods it batches).
        """
        return None

    def provision_identities(self, client_ids: list[str]) -> None:
        """Give the sites this runtime holds itself a signing key and a roster of each other's
        keys, for secure aggregation (before its set-up). The default does nothing: the sites
        of a deployment bring their own (a site policy's ``signing-key`` and ``roster``); the
        in-process and simulation runtimes hold every site, and provision them."""
        return None

    # Checkpointing of client state is possible only where the runtime can see it (in-process).
    def get_client_states(self) -> dict[str, dict[str, np.ndarray]] | None:
        return None

    def set_client_states(self, states: dict[str, dict[str, np.ndarray]]) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot restore client states")


class SiteSubset(Runtime):
    """The clients of ``runtime`` but those ``excluded``: what a fit runs on once its setup
    left sites out (:func:`~fedlatent.engine.protocol.exchange.setup_sites`). Every message
    goes to the runtime underneath; positions of a batched call (``call_batched``) are
    translated to the runtime's and back, so the round loop sees only the kept clients.

    Parameters
    ----------
    runtime : Runtime
    excluded : iterable of str
        The clients left out.
    """

    def __init__(self, runtime: Runtime, excluded):
        self.inner = runtime
        gone = set(map(str, excluded))
        everyone = list(runtime.client_ids)
        self._ids = [c for c in everyone if c not in gone]
        self.excluded = [c for c in everyone if c in gone]
        self._gone = gone
        #: position in ``runtime.client_ids`` of each kept client, and the inverse (-1: out)
        self._pos = np.array([i for i, c in enumerate(everyone) if c not in gone],
                             dtype=np.int64)
        self._back = np.full(len(everyone), -1, dtype=np.int64)
        self._back[self._pos] = np.arange(self._pos.size)

    @property
    def client_ids(self) -> list[str]:
        return list(self._ids)

    def call(self, client_ids, method, messages):
        self._refuse_others(client_ids)
        return self.inner.call(client_ids, method, messages)

    def call_rows(self, model, client_ids, method, message):
        self._refuse_others(client_ids)
        return self.inner.call_rows(model, client_ids, method, message)

    def batched(self, model):
        return None if self.inner.batched(model) is None else self

    def call_batched(self, method: str, idx: np.ndarray, msg: dict[str, Any], resets=None):
        """The runtime's batched call for the kept clients at positions ``idx`` of
        :attr:`client_ids`; a reply's ``clients`` (the runtime's positions) come back as
        positions of :attr:`client_ids`."""
        from dataclasses import is_dataclass, replace

        idx = np.asarray(idx, dtype=np.int64)
        moved = {int(self._pos[i]): v for i, v in (resets or {}).items()}
        rep = self.inner.call_batched(method, self._pos[idx], msg, moved)
        if is_dataclass(rep) and hasattr(rep, "clients"):
            rep = replace(rep, clients=self._back[np.asarray(rep.clients, dtype=np.int64)])
        return rep

    def get_client_states(self):
        states = self.inner.get_client_states()
        return None if states is None else {c: states[c] for c in self._ids if c in states}

    def set_client_states(self, states) -> None:
        self.inner.set_client_states(states)

    def client_state(self, key: str) -> dict[str, np.ndarray]:
        """One entry of every kept client's state (the in-process runtime's reader)."""
        got = self.inner.client_state(key)
        return {c: v for c, v in got.items() if c not in self._gone}

    @property
    def nodes(self):
        """The kept clients' objects (a runtime that holds them: in-process)."""
        nodes = self.inner.nodes
        return {c: nodes[c] for c in self._ids}

    def __getattr__(self, name: str):  # what else the runtime offers (a record's ``log``)
        if name in ("inner", "_gone"):  # (not yet set: no recursion)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _refuse_others(self, client_ids) -> None:
        bad = [c for c in client_ids if c in self._gone]
        if bad:
            raise ValueError(f"clients {bad[:10]} were left out of this fit at its setup")
