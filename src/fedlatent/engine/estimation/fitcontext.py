"""What the hooks of one fit share (:class:`FitContext`): the runtime, the model, the seed, the
clients' sizes, and the one checked way to ask the clients (:meth:`FitContext.ask`,
:meth:`FitContext.ask_sum`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedlatent.data.dataset import FederatedDataset
from fedlatent.engine.contract.model import FederatedModel
from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.protocol.exchange import Expect, Replies, RowReplies, ask
from fedlatent.engine.protocol.runtime import Runtime

__all__ = ["FitContext"]


@dataclass
class FitContext:
    """What the hooks of one fit share: the runtime, the model, the seed, the clients' sizes.

    Models talk to clients only through :meth:`ask` (the engine's checked protocol), never
    through the runtime directly.
    """

    runtime: Runtime
    model: FederatedModel
    federation: Federation
    seed: int
    n_features: int = 0
    n_units: dict[str, int] = field(default_factory=dict)
    faults: list[dict[str, str]] = field(default_factory=list)
    #: the FederatedDataset when the data are in this process (None for a RemoteDataset); only
    #: solvers that pool the data on purpose (centralized references) may read it
    data: FederatedDataset | None = None
    #: whether the runtime was given by the caller (not built in-process from the data)
    runtime_given: bool = False
    #: the fit's SecureChannel under ``Federation(secure_aggregation=True)`` (else None):
    #: initializations then ask through :meth:`ask_sum`
    secure: Any = None
    #: the fit's PrivacyBudget under ``Federation(privacy=...)`` (else None): every query is
    #: one release (the clients add the noise), spent here
    privacy: Any = None
    #: the sites left out at the setup (they refused it by a rule) and why; ``runtime`` then
    #: holds only the others
    excluded: dict[str, str] = field(default_factory=dict)
    #: the disclosure floors the sites announced that raised the fit's policy
    adopted: dict[str, Any] = field(default_factory=dict)

    def units_of(self, clients: list[str]) -> np.ndarray:
        """The units at setup (:attr:`n_units`) of ``clients``, in that order, as a float
        array: a run of clients in setup order starting where the last one ended or at the
        first client (the chunks of replies answered at once, in order) is one slice of an
        array made once per fit (checked: the same ids); any other list is looked up client
        by client."""
        kept = self.__dict__.get("_units_index")
        if kept is None or kept[0] is not self.n_units or len(kept[1]) != len(self.n_units):
            ids = list(self.n_units)
            kept = [self.n_units, ids, np.fromiter(self.n_units.values(), np.float64,
                                                   len(ids)), 0]
            self.__dict__["_units_index"] = kept
        _, ids, units, cursor = kept
        L = len(clients)
        for at in (cursor, 0):
            if ids[at:at + L] == clients:
                kept[3] = at + L
                return units[at:at + L]
        return np.fromiter(map(self.n_units.__getitem__, clients), np.float64, L)

    @property
    def summed_only(self) -> bool:
        """Whether initializations must use :meth:`ask_sum` (secure aggregation, or
        differential privacy: per-client checks cannot hold on noisy replies)."""
        return self.secure is not None or self.privacy is not None

    def ask_sum(self, query: str, payload: dict[str, Any] | None = None, *,
                shapes: dict[str, tuple], what: str | None = None) -> dict[str, np.ndarray]:
        """A query whose replies are needed only summed: ``{field: sum over every client}``.

        Under secure aggregation the server sees only the sum (each field's shape and
        finiteness checked on the aggregate); under differential privacy alone each client's
        reply carries its own noise and is checked for shape and finiteness. Only under one of
        them (otherwise :meth:`ask` checks each reply)."""
        what = what or f"query {query!r}"
        if self.secure is not None:
            from fedlatent.engine.secagg.secure import secure_sum_query

            out = secure_sum_query(self, query, payload, shapes, what=what)
        elif self.privacy is not None:
            from fedlatent.engine.protocol.exchange import array

            rep = self._ask(query, payload, expect={f: array(*shp) for f, shp in shapes.items()},
                            what=what)
            out = {f: sum(np.asarray(rep[c][f], dtype=np.float64) for c in self.client_ids)
                   for f in shapes}
        else:
            raise RuntimeError("ask_sum is the secure-aggregation or private form of ask; use ask")
        if self.privacy is not None:
            self.privacy.spend(1)
        return out

    @property
    def client_ids(self) -> list[str]:
        return list(self.runtime.client_ids)

    def ask(
        self,
        query: str,
        payload: dict[str, Any] | None = None,
        *,
        expect: dict[str, Expect] | None = None,
        what: str | None = None,
        required: bool = True,
        clients: list[str] | None = None,
        per_client: dict[str, dict[str, Any]] | None = None,
        only_sums: bool = False,
    ) -> Replies | RowReplies:
        """Ask clients a model query; every reply is checked against ``expect``.

        ``payload`` goes to every client (``per_client``: one payload per client instead).
        A client that does not answer or fails a check stops the fit with a message naming it
        (``required=True``) or is left out and recorded in ``faults``. In-process clients of
        a model that batches the query answer at once (:class:`RowReplies`, the same checks
        row-wise); ``only_sums``: only the replies' sums are needed (``.total(field)``), so
        no client's reply is kept.
        """
        if self.secure is not None:
            from fedlatent.engine.secagg.secure import refuse_clear_query

            refuse_clear_query(query, what)
        replies = self._ask(query, payload, expect=expect, what=what, required=required,
                            clients=clients, per_client=per_client, only_sums=only_sums)
        if self.privacy is not None:  # every query is a release (the clients noise it)
            self.privacy.spend(1)
        return replies

    def _ask(self, query, payload=None, *, expect=None, what=None, required=True, clients=None,
             per_client=None, only_sums=False) -> Replies | RowReplies:
        base = {"query": query, "seed": int(self.seed)}
        if per_client is not None:
            msgs = {c: {**base, **p} for c, p in per_client.items()}
            replies = ask(self.runtime, "query", msgs, what=what or f"query {query!r}",
                          expect=expect, required=required, per_client=True)
        else:  # in-process clients may answer at once (rows), unless each noises its reply
            replies = ask(self.runtime, "query", {**base, **(payload or {})},
                          what=what or f"query {query!r}", clients=clients, expect=expect,
                          required=required, model=None if self.summed_only else self.model,
                          only_sums=only_sums)
        for c, reason in replies.faults.items():
            self.faults.append({"exchange": what or query, "client": c, "reason": reason})
        return replies
