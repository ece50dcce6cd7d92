"""The transport interface the engine talks to. Models never import a runtime."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

__all__ = ["Runtime"]


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
        client declined. None (the default): the caller sends the message client by client
        (:meth:`call`). Only a runtime holding every client in one process answers so
        (``InProcessRuntime``, for a model with a batched step and the methods it batches).
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
