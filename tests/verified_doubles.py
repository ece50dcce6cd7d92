"""Test doubles shared by the verified-rounds tests (imported by bare name, as
``replay_recording``): a runtime whose nodes are rebuilt for each message, as Flower's are, and
a server change that moves one coordinate of a round's parameters by 1e-6 (relative), a
server that moves the control variates' start (``CvInit``) and one whose GMM start probes
rows (``probing_start``)."""

from __future__ import annotations

import numpy as np

from fedlatent.engine.protocol.messages import unpack
from fedlatent.engine.stats import Stats
from fedlatent.engine.transport.inprocess import InProcessRuntime


def moved(msg, prefix: str = "params"):
    """``msg`` with the largest entry of its largest parameter under ``prefix`` moved by 1e-6
    (relative)."""
    params = unpack(msg, prefix)
    name = max(params, key=lambda k: float(np.max(np.abs(params[k]), initial=0.0)))
    a = np.array(params[name], dtype=np.float64)
    i = np.unravel_index(int(np.argmax(np.abs(a))), a.shape)
    a[i] *= 1 + 1e-6
    msg[f"{prefix}/{name}"] = a
    return msg


class Rebuilt(InProcessRuntime):
    """Every node built afresh for each message from its saved state, its setup handled
    again and its secure aggregation client reloaded, as a Flower node is
    (``runtime/flower_site.py``): the replay lives only in ``node.state``."""

    def call(self, client_ids, method, messages):
        from fedlatent.engine.node.client import ClientNode
        from fedlatent.engine.secagg import SecAggClient

        if method == "setup":
            self.setups = dict(messages)
        elif getattr(self, "setups", None):
            for c in client_ids:
                old = self.nodes[c]
                node = ClientNode(c, self._fd[c], dict(old.state), source=self._fd,
                                  policy=old.site_policy)
                node.handle("setup", dict(self.setups[c]))
                if old.secagg is not None:
                    node.secagg = SecAggClient.load(old.secagg.dump())
                self.nodes[c] = node
        return super().call(client_ids, method, messages)


def six_sites(spread: float = 1.5):
    """Three 2-d Gaussians (means 0, (spread, 0.5), (0.5, spread)) over six sites of 100 rows:
    the verified-rounds tests' GMM data (1.5 overlaps enough that an accelerator acts)."""
    import fedlatent as fl

    rng = np.random.default_rng(3)
    X = rng.standard_normal((600, 2)) + np.array([[0, 0], [spread, 0.5], [0.5, spread]])[
        rng.integers(3, size=600)]
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": p for i, p in enumerate(np.array_split(X, 6))})


def soft_stats(seed: int, K: int = 3, d: int = 4, n: int = 500) -> Stats:
    """Mean statistics of ``n`` rows with soft memberships (a well-posed M-step)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(0, 3, d)
    r = rng.dirichlet(np.ones(K), n)
    return Stats({"nk": r.mean(0), "sx": r.T @ X / n,
                  "sxx": np.einsum("nk,ni,nj->kij", r, X, X) / n})


def claim_failure(monkeypatch, at: int) -> None:
    """A server that says round ``at``'s honest aggregate broke the model's invariants (it
    did not; its group tests' sums, ``replay=True``, are judged as they are)."""
    from fedlatent.engine.rounds import secure_round

    check = secure_round.aggregate_problem

    def aggregate_problem(rounds, plan, S, sums, **kw):
        Q, why = check(rounds, plan, S, sums, **kw)
        if plan.k == at and not kw.get("replay"):
            return None, "breaks the model's invariants: (claimed)"
        return Q, why

    monkeypatch.setattr(secure_round, "aggregate_problem", aggregate_problem)


class CvInit(InProcessRuntime):
    """A server whose ``cv_init`` message (after the initialization round: each site sets
    ``V_c = S_c(theta_0) - S_hat``) carries an ``S_hat`` with component 0's ``sx`` moved by
    ``-nk_0 move``: every later reply ``S_c - S_hat - V_c`` carries ``+nk_0 move`` more, so
    the aggregate and the ``S_hat`` each site replays from it move component 0's mean by
    ``move`` (the server's own invariant checks off: it is the one cheating)."""

    def __init__(self, fd, move=(3.0, 0.0), **kw):
        super().__init__(fd, **kw)
        self.move, self.sent = np.asarray(move, dtype=np.float64), []

    def call(self, client_ids, method, messages):
        if method == "cv_init":
            messages = {c: self._moved(dict(m)) for c, m in messages.items()}
        return super().call(client_ids, method, messages)

    def broadcast(self, client_ids, method, msg):
        return self.call(client_ids, method, {c: msg for c in client_ids})

    def _moved(self, msg):
        sx = np.array(msg["S_hat/sx"], copy=True)
        sx[0] -= np.asarray(msg["S_hat/nk"])[0] * self.move
        self.sent.append(msg)
        return {**msg, "S_hat/sx": sx}


def probing_start(monkeypatch, steps: int, moments: bool | None = None) -> list:
    """A server whose GMM k-means start, before its first honest hard-assignment exchange,
    asks ``steps`` of its own: three of the start's centres, the first moved towards the
    second by 0.2% of their distance each time. Two consecutive sums whose counts differ by
    one row leaving one cell for another give that row (the sums are about ``center``; the
    counts rounded to whole rows: a DP reply's noise is far below one). ``moments``: whether
    its queries ask the second moments (None: as the start's own do; a DP reply carries
    them). Returns the list the rebuilt rows are appended to."""
    from fedlatent.models.gmm import init as gmm_init

    honest, rows = gmm_init._hard_sums, []

    def probing(ctx, centers, center, ct, what, second=True):
        ask = second if moments is None else moments
        if not getattr(probing, "done", False):
            probing.done = True
            C, c0 = np.array(centers, dtype=np.float64)[:3], np.asarray(center, np.float64)
            prev = honest(ctx, C, center, ct, what, ask)
            for s in range(1, steps + 1):
                C2 = C.copy()
                C2[0] = C[0] + 0.002 * s * (C[1] - C[0])
                cur = honest(ctx, C2, center, ct, what, ask)
                dn = np.round(cur["nk"] - prev["nk"])
                if np.sum(np.abs(dn)) == 2 and np.max(dn) == 1:  # one row, one cell to another
                    j = int(np.argmax(dn))
                    rows.append(c0 + cur["sx"][j] - prev["sx"][j])
                prev = cur
        return honest(ctx, centers, center, ct, what, second)

    monkeypatch.setattr(gmm_init, "_hard_sums", probing)
    return rows


def rows_near(rows: list, fd, tol: float) -> list:
    """The rebuilt ``rows`` within ``tol`` of a row of the federation's data (max norm)."""
    X = np.vstack([np.asarray(fd[c].X) for c in fd.client_ids])
    return [x for x in rows if np.min(np.max(np.abs(X - x), axis=1)) < tol]
