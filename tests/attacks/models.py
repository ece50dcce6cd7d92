"""One small adapter per registered model: its attack case and how its statistics read.

An adapter says, for its model, only what the attacker cannot derive from the engine's
declarations: the small federation (the example's data plus one small client), how the
statistics read as moment matrices of ``z = [1, row]`` (:meth:`Adapter.blocks`), a total that
does not depend on the parameters (:meth:`Adapter.total`), and how candidate rows become a
client's data (for the replay). :data:`ADAPTERS` must name every registered model:
:func:`adapter_for` fails, naming the model and the fix, for one that has none (a new model is
never silently left unattacked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedlatent.data.dataset import FederatedDataset
from fedlatent.engine.contract.registry import estimator_class, estimator_names

from .attacker import Guess, rows_from_moments

__all__ = ["ADAPTERS", "Adapter", "Case", "adapter_for"]


@dataclass(frozen=True)
class Case:
    """A federation whose client ``target`` holds the rows ``truth`` (the adapter's layout)."""

    fd: FederatedDataset
    target: str
    truth: np.ndarray


def _strip(fields: dict[str, Any], prefix: str = "stat/") -> dict[str, np.ndarray]:
    """The fields without a query's prefix (``stat/nk`` -> ``nk``)."""
    return {k[len(prefix):] if k.startswith(prefix) else k: np.asarray(v, dtype=np.float64)
            for k, v in fields.items()}


def canonical(M: np.ndarray, A: np.ndarray) -> np.ndarray:
    """``M`` of ``z' = A z`` as a moment matrix of ``z = [1, row]``."""
    Ai = np.linalg.inv(A)
    return Ai @ M @ Ai.T


def _about(center: np.ndarray) -> np.ndarray:
    """``A`` with ``[1, x - c] = A [1, x]``."""
    d = center.size
    A = np.eye(d + 1)
    A[1:, 0] = -center
    return A


def _x1y(d: int, T=None, y_shift: float = 0.0, y_scale: float = 1.0) -> np.ndarray:
    """``A`` with ``[x~, 1, y~] = A [1, x, y]``: the regression blocks' layout (intercept last),
    ``[x~, 1] = T [x, 1]`` and ``y~ = (y - y_shift) / y_scale`` when the fit standardizes."""
    T = np.eye(d + 1) if T is None else np.asarray(T, dtype=np.float64)
    A = np.zeros((d + 2, d + 2))
    A[: d + 1, 1 : d + 1] = T[:, :d]
    A[: d + 1, 0] = T[:, d]
    A[d + 1, d + 1] = 1.0 / y_scale
    A[d + 1, 0] = -y_shift / y_scale
    return A


class Adapter:
    """The defaults: moment blocks none, total their sum, rows from a total of 1 or 2 rows."""

    name = ""
    #: secure aggregation is refused by the estimator (its capabilities say so)
    secure = True
    #: estimator settings of the secure-sums positive control (its totals must not depend on
    #: the round's parameters for the differencing to apply)
    control_params: dict = {}
    #: candidate rows can be replayed through the recorded messages (continuous rows)
    replayable = True
    #: rows of the small client for the clear cases (the setups refuse fewer under defaults)
    small_rows = 3
    row_width = 0

    def case(self, small: int, seed: int = 0) -> Case:
        raise NotImplementedError

    def estimator(self, federation, rounds: int):
        raise NotImplementedError

    def blocks(self, kind: str, fields: dict, msg: dict) -> list[np.ndarray]:
        return []

    def total(self, kind: str, fields: dict, msg: dict):
        b = self.blocks(kind, fields, msg)
        return np.sum(b, axis=0) if b else None

    def rows_from_total(self, T):
        return rows_from_moments(T)

    def exact(self, tr, target: str, clear) -> list[Guess]:
        return []

    def client_data(self, rows: np.ndarray):
        raise NotImplementedError


def _with_small(parts: dict, name: str, small) -> FederatedDataset:
    parts = dict(parts)
    parts[name] = small
    return FederatedDataset.from_arrays(parts)


# ---- Gaussian mixture ---------------------------------------------------------------------------
def _gaussian_blocks(st: dict, center) -> list[np.ndarray]:
    if "sxx" not in st:  # counts and sums only (the start's candidate round): no moment
        return []  # matrix; a cell of one row is read off by GMMAdapter.exact
    nk, sx, sxx = (np.asarray(st[k], dtype=np.float64) for k in ("nk", "sx", "sxx"))
    if sxx.ndim != 3:  # diagonal, spherical or tied: not one moment matrix per component
        return []
    A = _about(np.asarray(center, dtype=np.float64))
    out = []
    for k in range(nk.size):
        M = np.empty((sx.shape[1] + 1,) * 2)
        M[0, 0], M[0, 1:], M[1:, 0], M[1:, 1:] = nk[k], sx[k], sx[k], sxx[k]
        out.append(canonical(M, A))
    return out


class GMMAdapter(Adapter):
    name = "gmm"
    row_width = 4

    def case(self, small, seed=0):
        from fedlatent.models.gmm.example import blobs

        fd = blobs(n_clients=4, K=3, d=4, seed=seed)
        parts = {c: fd[c].X for c in fd.client_ids}
        rng = np.random.default_rng(seed + 1)
        X = parts[fd.client_ids[0]][:small] + 0.1 * rng.normal(size=(small, 4))
        return Case(_with_small(parts, "small", X), "small", X)

    def estimator(self, federation, rounds):
        return estimator_class("gmm")(n_components=3, max_rounds=rounds, tol=0.0,
                                      random_state=0, verbose=False, federation=federation)

    def blocks(self, kind, fields, msg):
        if kind == "estep":
            return _gaussian_blocks(fields, msg["params/center"])
        st = _strip(fields)
        if kind == "query:hard_stats" and "nk" in st:
            return _gaussian_blocks(st, msg["center"])
        if kind == "query:moments" and "sxx" in st and np.ndim(st["sxx"]) == 2:
            d = st["sx"].size
            M = np.empty((d + 1, d + 1))
            M[0, 0], M[0, 1:], M[1:, 0], M[1:, 1:] = st["n"], st["sx"], st["sx"], st["sxx"]
            return [M]
        return []

    def exact(self, tr, target, clear):
        out = []
        for kind, fields, msg in clear:  # a local centroid over one row is that row
            if kind == "query:kmeans" and np.size(fields.get("counts", [])):
                one = np.asarray(fields["counts"]) == 1
                if one.any():
                    out.append(Guess("local k-means centroids over one row",
                                     np.asarray(fields["centroids"])[one]))
            st = _strip(fields)
            if kind == "query:hard_stats" and "sxx" not in st and "nk" in st:
                one = st["nk"] == 1  # a cell's sum over one row is that row
                if one.any():
                    out.append(Guess("hard-assignment sums over one row",
                                     np.asarray(msg["center"]) + st["sx"][one]))
        return out

    def client_data(self, rows):
        return FederatedDataset.from_arrays({"c": rows})["c"]


class FedGMMAdapter(GMMAdapter):
    """FedGMM's input mixture sends the Gaussian mixture's statistics (the rows attacked: x;
    the labels y would have to be enumerated to replay a guess: no replay here)."""

    name = "fedgmm"
    row_width = 3
    replayable = False

    def case(self, small, seed=0):
        from fedlatent.data.fedgmm_data import make_fedgmm_synthetic

        fd = make_fedgmm_synthetic(n_clients=4, n_samples_per_client=40, n_components=2,
                                   n_features=3, random_state=seed).train
        parts = {c: (fd[c].X, fd[c].y) for c in fd.client_ids}
        X0, y0 = parts[fd.client_ids[0]]
        X = X0[:small] + 0.1 * np.random.default_rng(seed + 1).normal(size=(small, 3))
        return Case(_with_small(parts, "small", (X, np.asarray(y0[:small]))), "small", X)

    def estimator(self, federation, rounds):
        return estimator_class("fedgmm")(2, 2, max_rounds=rounds, tol=0.0, random_state=0,
                                         verbose=False, federation=federation)


# ---- regressions ---------------------------------------------------------------------------
def _regression_blocks(xtx, xty, yty, A) -> list[np.ndarray]:
    xtx, xty, yty = (np.asarray(a, dtype=np.float64) for a in (xtx, xty, yty))
    out = []
    for k in range(yty.size):
        p = xty.shape[1]
        M = np.empty((p + 1, p + 1))
        M[:p, :p], M[:p, p], M[p, :p], M[p, p] = xtx[k], xty[k], xty[k], yty[k]
        out.append(canonical(M, A))
    return out


class LCRAdapter(Adapter):
    name = "lcr"
    row_width = 2  # x (one feature) and y

    def case(self, small, seed=0):
        from fedlatent.models.lcr.example import two_lines

        fd = two_lines(seed=seed, n_clients=4)
        parts = {c: (fd[c].X, fd[c].y) for c in fd.client_ids}
        X0, y0 = parts[fd.client_ids[0]]
        rng = np.random.default_rng(seed + 1)
        X, y = X0[:small] + 0.1 * rng.normal(size=(small, 1)), y0[:small] + 0.1
        return Case(_with_small(parts, "small", (X, y)), "small", np.column_stack([X, y]))

    def estimator(self, federation, rounds):
        return estimator_class("lcr")(2, max_rounds=rounds, tol=0.0, n_init=1, random_state=0,
                                      federation=federation)

    def blocks(self, kind, fields, msg):
        st = _strip(fields)
        if not {"sxx", "sxy", "syy"} <= set(st) or np.ndim(st["sxx"]) != 3:
            return []
        return _regression_blocks(st["sxx"], st["sxy"], st["syy"], _x1y(1))

    def client_data(self, rows):
        return FederatedDataset.from_arrays({"c": (rows[:, :1], rows[:, 1])})["c"]


class HLCRAdapter(Adapter):
    """An agent's cluster blocks (hard labels of its entities); the small agent holds
    ``small`` entities of one event each (rows: x and y)."""

    name = "hlcr"
    row_width = 4
    small_rows = 4  # four entities of one event: blocks of three are sent under the defaults
    replayable = False  # labels are drawn: the replay is not smooth in the rows
    # the default random intercept scales every entity's statistics by the round's rho: the
    # cohorts' totals then change every round and differencing them is not linear; the paper's
    # model (without it) is what the positive control attacks
    control_params = {"random_intercept": False}

    def case(self, small, seed=0):
        import fedlatent as fl

        fd = fl.datasets.make_synthhlcr(n_agents=4, n_entities=8, entities_per_agent=6,
                                        n_clusters=3, n_features=3, events_per_entity=5,
                                        random_state=seed)
        parts = {c: (fd[c].X, fd[c].y, np.asarray(fd[c].entity).astype(str))
                 for c in fd.client_ids}
        X = np.vstack([parts[c][0][:1] for c in fd.client_ids[:small]]) + 0.05
        y = np.concatenate([parts[c][1][:1] for c in fd.client_ids[:small]]) + 0.05
        ent = np.array([f"small-{i}" for i in range(small)])
        return Case(_with_small(parts, "small", (X, y, ent)), "small", np.column_stack([X, y]))

    def estimator(self, federation, rounds, **kw):
        return estimator_class("hlcr")(3, max_rounds=rounds, random_state=0,
                                       federation=federation, **kw)

    def blocks(self, kind, fields, msg):
        st = _strip(fields)
        if kind != "estep" or not {"XtX", "Xty", "yty"} <= set(st):
            return []
        p = {k[len("params/"):]: v for k, v in msg.items() if k.startswith("params/")}
        A = _x1y(st["Xty"].shape[1] - 1, p.get("T"), float(p.get("y_shift", 0.0)),
                 float(p.get("y_scale", 1.0)))
        return _regression_blocks(st["XtX"], st["Xty"], st["yty"], A)

    def exact(self, tr, target, clear):
        """Blocks of one event, one by one (a rank-one block is that event; with the random
        intercept, HLCR's default, it is scaled by the public 1 / (1 + rho), so rank one is
        tested, not a count of 1)."""
        out = []
        for kind, fields, msg in clear:
            for b in self.blocks(kind, fields, msg):
                sv = np.linalg.svd(b, compute_uv=False)
                if b[0, 0] > 1e-12 and sv[1] <= 1e-9 * sv[0]:
                    out.append(Guess("a cluster block of one event", (b[1:, 0] / b[0, 0])[None]))
        return out


# ---- latent class analysis: category codes ------------------------------------------------------
class LCAAdapter(Adapter):
    """Rows are category codes: the per-level totals give each variable's multiset of codes;
    every assignment of them to rows is replayed, and a row is claimed when every assignment
    that replays the recorded replies agrees on it."""

    name = "lca"
    row_width = 4
    R = 3

    def case(self, small, seed=0):
        from fedlatent.models.lca.example import make_lca_data

        fd = make_lca_data(n_clients=4, mean_size=30, random_state=seed)
        parts = {c: fd[c].X for c in fd.client_ids}
        X0 = parts[fd.client_ids[0]]
        _, first = np.unique(X0, axis=0, return_index=True)
        X = X0[np.sort(first)[:small]]
        return Case(_with_small(parts, "small", X), "small", X)

    def estimator(self, federation, rounds):
        return estimator_class("lca")(n_components=3, n_categories=self.R, max_rounds=rounds,
                                      tol=0.0, random_state=0, federation=federation)

    def total(self, kind, fields, msg):
        st = _strip(fields)
        if "counts" not in st or "nk" not in st or np.ndim(st["counts"]) != 2:
            return None
        return np.concatenate([[st["nk"].sum()], st["counts"].sum(axis=0)])

    def rows_from_total(self, T):
        n = int(round(T[0]))
        cands = self._assignments(T)
        if not cands:
            return None
        return self._determined(cands, n)

    def _assignments(self, T, limit: int = 5000) -> list[np.ndarray]:
        """Every row list with the per-level totals ``T``, in every order (a client's
        replies may depend on its rows' order: the random start draws one membership per
        row)."""
        import itertools

        n, levels = int(round(T[0])), np.rint(T[1:]).astype(int).reshape(-1, self.R)
        if n < 1 or (levels.sum(axis=1) != n).any():
            return []
        perms = [sorted(set(itertools.permutations(np.repeat(np.arange(self.R), lv))))
                 for lv in levels]
        if np.prod([len(p) for p in perms]) > limit:
            return []
        return [np.column_stack(combo).astype(np.float64) for combo in itertools.product(*perms)]

    @staticmethod
    def _determined(cands: list[np.ndarray], n: int):
        """The rows every candidate holds (as a multiset, ``n`` rows each)."""
        common = [tuple(r) for r in cands[0]]
        for c in cands[1:]:
            rest = [tuple(r) for r in c]
            keep = []
            for r in common:
                if r in rest:
                    rest.remove(r)
                    keep.append(r)
            common = keep
        return np.array(common, dtype=np.float64) if common else None

    def exact(self, tr, target, clear):
        from .attacker import replay_residuals

        for kind, fields, msg in clear:
            T = self.total(kind, fields, msg)
            if T is None:
                continue
            fits = [c for c in self._assignments(T)
                    if np.abs(replay_residuals(self, tr, target, c)).max() < 1e-8]
            rows = self._determined(fits, int(round(T[0]))) if fits else None
            return [] if rows is None else [Guess(
                f"{len(fits)} code assignment(s) replaying every reply", rows)]
        return []

    def client_data(self, rows):
        return FederatedDataset.from_arrays({"c": rows})["c"]


# ---- SEC: fitted models --------------------------------------------------------------------------
class SECAdapter(Adapter):
    """A learner's fitted model (a row-storing one here: a nearest-neighbour regressor) and its
    scaling constants. SEC needs 4 rows per learner and refuses secure aggregation."""

    name = "sec"
    secure = False
    replayable = False
    small_rows = 4
    row_width = 6  # five features and y

    def case(self, small, seed=0):
        from fedlatent.data.sec_data import make_sec_simulation1

        fd = make_sec_simulation1(n_learners=4, n_samples=40, snr=64.0, random_state=seed)[0]
        parts = {c: (fd[c].X, fd[c].y) for c in fd.client_ids}
        X0, y0 = parts[fd.client_ids[0]]
        n = max(small, 4)
        X, y = X0[:n] + 0.05, y0[:n] + 0.05
        return Case(_with_small(parts, "small", (X, y)), "small", np.column_stack([X, y]))

    def estimator(self, federation, rounds):
        from sklearn.neighbors import KNeighborsRegressor

        return estimator_class("sec")(candidates=[KNeighborsRegressor(n_neighbors=1)],
                                      n_clusters=2, random_state=0, federation=federation)

    def exact(self, tr, target, clear):
        from fedlatent.models.sec.serialize import loads_model

        out = []
        for kind, fields, _ in clear:
            if kind != "query:select" or "model" not in fields:
                continue
            m = loads_model(np.asarray(fields["model"], dtype=np.uint8), source="attack")
            Xs, ys = getattr(m, "_fit_X", None), getattr(m, "_y", None)
            if Xs is None:
                continue
            xm, xs = fields.get("x_mean", 0.0), fields.get("x_scale", 1.0)
            ym, ysc = float(fields.get("y_mean", 0.0)), float(fields.get("y_scale", 1.0))
            out.append(Guess("the rows a fitted nearest-neighbour model stores",
                             np.column_stack([Xs * xs + xm, np.ravel(ys) * ysc + ym])))
        return out


ADAPTERS: dict[str, Adapter] = {a.name: a for a in (
    GMMAdapter(), FedGMMAdapter(), LCRAdapter(), HLCRAdapter(), LCAAdapter(), SECAdapter())}


def adapter_for(name: str) -> Adapter:
    """The adapter of registered model ``name``; LookupError naming the fix when there is none."""
    if name not in ADAPTERS:
        raise LookupError(
            f"registered model {name!r} has no reconstruction-attack adapter: add one to "
            f"tests/attacks/models.py (ADAPTERS) saying how its statistics read as moment "
            f"matrices or what else a reply of it determines; every model in "
            f"estimator_names() = {estimator_names()} is attacked")
    return ADAPTERS[name]
