"""Many in-process clients in one computation: the batched client step.

When every client is local and the model provides a batched client step
(``FederatedModel.client_stats_batched``), the in-process runtime runs the FedEM client step
(full pass, mini-batch, SPIDER; control variates; quantizer) of all the round's clients at once:
rows stacked by client, per-client sums by batched products, states as arrays of shape
(n_clients, ...). It computes what :class:`~fedlatent.engine.node.client.ClientNode` computes for
each client, with the same random streams (:mod:`fedlatent.engine.fedem.streams`): equal to the
per-client path up to the summation order of the sums.

Rows are stacked in buckets of clients of the same size: a bucket is one array of shape
(clients, rows, features) and a model sums over its rows axis, with the same products a client
computes alone (so the sums agree bit for bit). With more than 256 distinct sizes, buckets hold
sizes in ``(2^(j-1), 2^j]``, padded with rows of weight 0 (the sums then agree to rounding).
Either way there are at most a few hundred buckets, never one per client at scale.

A model whose units are not rows (HLCR's entities; ``batched_units``) stacks the clients' data
itself (``batch_units``) and steps all the round's clients in one call
(``client_stats_units``), each drawing from its own client's generator; its states, of a
different size on every client, are held as one array per client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from fedlatent.data.dataset import ClientData
from fedlatent.engine.contract.model import client_rng
from fedlatent.engine.fedem.seeds import client_keys
from fedlatent.engine.fedem.streams import batch_rows, stream_keys, stream_uniforms
from fedlatent.engine.node.batched_points import BatchedPointStates
from fedlatent.engine.node.clientstep import fedem_rows
from fedlatent.engine.node.pointstate import history_rounds, in_key, out_key
from fedlatent.engine.node.rows import as_slice, put_step
from fedlatent.engine.protocol.compiled import at_scale, kernels
from fedlatent.engine.protocol.messages import unpack
from fedlatent.engine.stats import Stats

__all__ = ["Bucket", "BatchStep", "BatchReply", "BatchedClients", "ClientBatch"]

# purposes of the per-(client, round) streams (as in engine/node/client.py)
_P_MODEL, _P_QUANT, _P_BATCH = 0, 1, 2
#: rows of one call of the model's batched step (its temporaries then stay in cache)
_CHUNK_ROWS = 16384
#: reply rows made from sums at once (fedem_rows' passes over them stay in cache)
_FINISH_ROWS = 256
#: rows of the statistics processed at once after the step (differences, quantizer, V_c)
_CHUNK = 1024
#: up to this many distinct client sizes, one bucket per size (no padding: every client's sums
#: are the same products as its own step's, bit for bit); beyond, buckets by powers of two
_MAX_EXACT_BUCKETS = 256


@dataclass
class Bucket:
    """Clients of similar size, padded to the same number of rows.

    Attributes
    ----------
    clients : ndarray of int, shape (C,)
        Positions of the bucket's clients in the batch.
    X : ndarray of shape (C, m, d)
        Their rows; padding rows are 0.
    y : ndarray of shape (C, m) or None
        Their targets (padding: the first client's first target).
    real : ndarray of bool, shape (C, m)
        Which rows are the client's (False: padding).
    """

    clients: np.ndarray
    X: np.ndarray
    y: np.ndarray | None
    real: np.ndarray


class ClientBatch:
    """The data of many clients stacked for batched steps (a view the clients' own process holds;
    nothing here crosses to the server).

    Parameters
    ----------
    datas : list of ClientData
        In the order of the batch (the runtime's client order).
    """

    def __init__(self, datas: list[ClientData]):
        self.n_units = np.fromiter(map(len, (cd.X for cd in datas)), np.int64, len(datas))
        has_y = all(cd.y is not None for cd in datas)
        X = np.concatenate([cd.X for cd in datas]) if datas else np.zeros((0, 0))
        y = np.concatenate([np.asarray(cd.y) for cd in datas]) if has_y and datas else None
        starts = np.concatenate([[0], np.cumsum(self.n_units)[:-1]])
        level = self.n_units
        if np.unique(level).size > _MAX_EXACT_BUCKETS:
            level = np.ceil(np.log2(np.maximum(self.n_units, 1))).astype(np.int64)
        self.buckets: list[Bucket] = []
        for lev in np.unique(level):
            idx = np.flatnonzero(level == lev)
            m = int(self.n_units[idx].max())
            offs = np.arange(m)[None, :]
            real = offs < self.n_units[idx][:, None]
            lo = int(starts[idx[0]])
            if real.all() and np.array_equal(starts[idx], lo + m * np.arange(idx.size)):
                rows = slice(lo, lo + m * idx.size)  # consecutive clients of m rows: a view
                Xb = X[rows].reshape(idx.size, m, -1)
                yb = None if y is None else y[rows].reshape(idx.size, m)
            else:
                src = np.where(real, starts[idx][:, None] + offs, 0)
                Xb = np.where(real[:, :, None], X[src], 0.0)
                yb = None if y is None else np.where(real, y[src], y[0])
            self.buckets.append(Bucket(idx, Xb, yb, real))

    @property
    def n_clients(self) -> int:
        return int(self.n_units.size)


@dataclass
class BatchStep:
    """What a batched client step returns for the C clients of one bucket.

    Attributes
    ----------
    stats : dict of str to ndarray of shape (C, ...)
        Each client's sums (its row of every block).
    n : ndarray of shape (C,)
        Units summed per client.
    objective : ndarray of shape (C,)
        Objective summed per client.
    state : dict of str to ndarray of shape (C, ...)
        The clients' new private model state.
    """

    stats: dict[str, np.ndarray]
    n: np.ndarray
    objective: np.ndarray
    state: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class BatchReply:
    """The replies of many clients to one E-step or evaluation, as arrays.

    ``clients`` are positions in the batch; ``Q`` row ``i`` is client ``clients[i]``'s statistic
    flattened block by block (the blocks of ``template``). ``Q`` is rows of the runtime's reply
    buffer: valid until the next call of the same kind (copy what must outlive it).
    """

    clients: np.ndarray
    Q: np.ndarray
    n: np.ndarray
    objective: np.ndarray
    template: Stats
    #: a multi-point round's extra points, in order: ``(Q_j, objective_j)``, the mean
    #: statistics at ``T(x_j)`` (rows as ``Q``, raw: no ``S_hat``, no control variate, no
    #: quantizer) and the objectives there; empty for an ordinary round
    points: tuple[tuple[np.ndarray, np.ndarray], ...] = ()

    def stats(self, i: int) -> Stats:
        return self.template.unflatten(self.Q[i])


class _Group:
    """One prefix of the client state (``V``, ``init_S``, ``model``...): arrays of shape
    (n_clients, ...) and which clients hold it."""

    def __init__(self, n: int):
        self.arrays: dict[str, np.ndarray] = {}
        self.present = np.zeros(n, dtype=bool)


class BatchedClients(BatchedPointStates):
    """The client side of the in-process runtime, run for many clients at once.

    Holds the clients' private states as arrays (``V`` and ``init_S`` flattened like the
    statistic; the model's state by name) and loads them from / writes them to the clients'
    nodes, so the per-client view (``get_client_states``, a checkpoint, a per-client call) sees
    exactly the state the batched steps produced.
    """

    def __init__(self, ids: list[str], datas: list[ClientData], model):
        self.ids = list(ids)
        self.pos = {c: i for i, c in enumerate(self.ids)}
        self.model = model
        #: the model's own stacking of the data (``batched_units``), else rows in buckets
        self.units = model.batch_units(list(datas)) if model.batched_units else None
        self.batch = ClientBatch(datas) if self.units is None else None
        #: the disclosure policy the clients apply (a step over units suppresses blocks)
        self.policy = model.disclosure
        self.groups: dict[str, _Group] = {}
        self.template: Stats | None = None
        #: the arrays the replies of ``estep`` and ``evaluate`` are written into, round after
        #: round (a reply's ``Q`` is valid until the next call of the same kind)
        self._buffers: dict[str, np.ndarray] = {}

    @cached_property
    def keys(self) -> np.ndarray:
        """The clients' stable integer keys (int64, batch order), made on first use: only the
        steps that draw (mini-batches, the quantizer, a model's own generators) read them, so
        a plain full-pass fit never hashes its clients' ids."""
        return client_keys(self.ids)

    # ---- states <-> nodes ----------------------------------------------------------------
    def load(self, states: list[dict[str, np.ndarray]]) -> None:
        """Take the clients' states (one flat dict per client, in batch order; an empty list:
        no client holds one)."""
        n = len(self.ids)
        self.groups = {}
        for i, st in enumerate(states):
            for key, v in st.items():
                prefix, _, name = key.partition("/")
                g = self.groups.setdefault(prefix, _Group(n))
                v = np.asarray(v)
                if name not in g.arrays and prefix == "model" and self.units is not None:
                    g.arrays[name] = np.empty(n, dtype=object)  # one array per client
                elif name not in g.arrays:
                    g.arrays[name] = np.zeros((n, *v.shape), dtype=v.dtype)
                g.arrays[name][i] = v
                g.present[i] = True

    def dump(self) -> list[dict[str, np.ndarray]]:
        """The clients' states, one flat dict per client (batch order)."""
        out: list[dict[str, np.ndarray]] = [{} for _ in self.ids]
        for prefix, g in self.groups.items():
            names = self._names(prefix, g)
            for i in np.flatnonzero(g.present):
                st = out[i]
                for name, arr in names:
                    st[f"{prefix}/{name}"] = np.array(arr[i])
        return out

    def state_of(self, key: str) -> dict[str, np.ndarray]:
        """One entry of the clients' states (``"model/labels"``), a copy per client that
        holds it, without splitting every state (:meth:`dump`)."""
        prefix, _, name = key.partition("/")
        g = self.groups.get(prefix)
        arr = None if g is None else g.arrays.get(name)
        if arr is None:
            return {self.ids[i]: st[key] for i, st in enumerate(self.dump()) if key in st}
        return {self.ids[i]: np.array(arr[i]) for i in np.flatnonzero(g.present)}

    def _names(self, prefix: str, g: _Group):
        """``(name, array)`` of a group; flat statistic groups are split into their blocks."""
        if prefix in ("V", "init_S", "spider_S") and "" in g.arrays:
            assert self.template is not None
            flat, out, lo = g.arrays[""], [], 0
            for k, v in self.template.items():
                out.append((k, flat[:, lo:lo + v.size].reshape(-1, *v.shape)))
                lo += v.size
            return out
        return list(g.arrays.items())

    def _flat_group(self, prefix: str) -> _Group:
        """A statistic-valued group (``V``, ``init_S``) as one flat array per client."""
        g = self.groups.get(prefix)
        n, F = len(self.ids), self.template.size
        if g is None:
            g = self.groups[prefix] = _Group(n)
        if "" not in g.arrays:
            flat = np.zeros((n, F))
            lo = 0
            if any(k in g.arrays and g.arrays[k].shape[1:] != v.shape
                   for k, v in self.template.items()):
                g.present[:] = False  # an earlier fit's statistic (another K): none kept
                g.arrays = {}
            for k, v in self.template.items():
                if k in g.arrays:
                    flat[:, lo:lo + v.size] = g.arrays[k].reshape(n, -1)
                lo += v.size
            g.arrays = {"": flat}
        return g

    # ---- the client step -----------------------------------------------------------------
    def _model_state(self, idx: np.ndarray, source: str = "model") -> dict[str, np.ndarray]:
        g = self.groups.get(source)
        return {} if g is None else {k: v[idx] for k, v in g.arrays.items()}

    def _reply_buffer(self, kind: str, A: int) -> np.ndarray | None:
        """Rows ``(A, F)`` of the array kept for the replies of ``kind`` (None before the
        statistic's layout is known). A round's replies are written over the previous
        round's (read by then): at 100,000 clients the reply is hundreds of MiB, and mapping
        fresh pages for it every round costs as much as a tenth of the round."""
        if self.template is None:
            return None
        buf = self._buffers.get(kind)
        if buf is None or buf.shape != (len(self.ids), self.template.size):
            buf = self._buffers[kind] = np.empty((len(self.ids), self.template.size))
        return buf[:A]

    def _unit_stats(self, params, idx: np.ndarray, commit: bool, key: tuple[int, int] | None,
                    reuse: str | None = None, finish=None, masks=None):
        """:meth:`_stats` of a model that stacks its own units (``batched_units``): one call
        for all the clients ``idx`` (full passes only), each drawing from its own generator
        (``key``: the round's seed and number)."""
        if masks is not None or key is None:
            raise NotImplementedError("the model's batched step makes full passes only")
        rngs = _Generators(key[0], [self.ids[i] for i in idx], key[1], self.keys[idx])
        step = self.model.client_stats_units(params, self.units, idx, self._model_state(idx),
                                             rngs, self.policy)
        if step is None:
            raise NotImplementedError("the model has no batched step for these settings")
        if self.template is None:
            self.template = Stats({k: np.asarray(v[0]) for k, v in step.stats.items()})
        Q = None if reuse is None else self._reply_buffer(reuse, idx.size)
        Q = np.empty((idx.size, self.template.size)) if Q is None else Q
        col = 0
        for v in step.stats.values():
            v = v.reshape(v.shape[0], -1)
            Q[:, col:col + v.shape[1]] = v
            col += v.shape[1]
        n, obj = np.asarray(step.n, dtype=np.float64), np.asarray(step.objective, np.float64)
        if commit and step.state:
            self._commit_state(idx, step.state, "model" if commit is True else commit)
        if finish is not None:
            finish[0](Q, n, 0, idx.size)
            finish[1][:] = True
        return Q, n, obj

    def _stats(self, params, idx: np.ndarray, masks: dict[int, np.ndarray] | None,
               commit, reuse=None, finish=None, key=None, source: str = "model"):
        """Statistics (A, F) flattened, n (A,), objective (A,) of the clients ``idx`` (batch
        positions, ascending) over their rows or the rows in ``masks`` (bucket -> (C_b, m)), by
        chunks of a bucket's clients (about ``_CHUNK_ROWS`` rows), into reply buffer ``reuse``
        if given. ``finish``: None or ``(f, done)``, ``f(Q, n, lo, hi)`` called on each chunk
        of rows once written, ``done[lo:hi]`` set; ``key``: seed, round. The model state read
        from group ``source``; with ``commit`` kept in ``"model"`` (a prefix: in that group)."""
        if self.units is not None:  # the model stacks its own units
            return self._unit_stats(params, idx, commit, key, reuse, finish, masks)
        A = idx.size
        want = np.zeros(len(self.ids), dtype=bool)
        want[idx] = True
        row_of = np.full(len(self.ids), -1)
        row_of[idx] = np.arange(A)
        Q = n = obj = None
        new_state: dict[str, np.ndarray] = {}
        for b, bk in enumerate(self.batch.buckets):
            sel = want[bk.clients]
            if not sel.any():
                continue
            every = bool(sel.all())
            pos = None if every else np.flatnonzero(sel)
            W = bk.real if masks is None else masks[b]
            count = len(bk.clients) if every else pos.size
            per = max(1, _CHUNK_ROWS // max(bk.X.shape[1], 1))
            for lo in range(0, count, per):
                take = slice(lo, min(lo + per, count)) if every else pos[lo:lo + per]
                cl = bk.clients[take]
                rows = as_slice(row_of[cl])
                if Q is None and self.template is not None:
                    Q, n, obj = self._reply_arrays(reuse, A)
                outs = self._out_views(Q, rows)
                extra = {} if outs is None else {"out": outs}
                step = self.model.client_stats_batched(
                    params, bk.X[take], None if bk.y is None else bk.y[take],
                    W[take].astype(np.float64), self._model_state(cl, source), **extra)
                if step is None:
                    raise NotImplementedError("the model has no batched step for these settings")
                if self.template is None:
                    self.template = Stats({k: np.asarray(v[0]) for k, v in step.stats.items()})
                if Q is None:
                    Q, n, obj = self._reply_arrays(reuse, A)
                put_step(step, outs, rows, Q, n, obj, new_state)
                if finish is not None and isinstance(rows, slice):
                    finish[0](Q, n, rows.start, rows.stop)  # while the rows are in cache
                    finish[1][rows] = True
        if commit and new_state:
            self._commit_state(idx, new_state, "model" if commit is True else commit)
        return Q, n, obj

    def _reply_arrays(self, reuse, A: int):
        """The reply's ``Q`` (A, F) (the buffer ``reuse`` if given), ``n`` (A,), ``obj`` (A,)."""
        Q = None if reuse is None else self._reply_buffer(reuse, A)
        return (np.empty((A, self.template.size)) if Q is None else Q), np.empty(A), np.empty(A)

    def _out_views(self, Q: np.ndarray | None, rows) -> dict[str, np.ndarray] | None:
        """Views of ``Q``'s ``rows`` (a slice) shaped as each statistic (C, ...), for a model
        whose batched step writes there (``batched_out``); None otherwise."""
        if Q is None or not isinstance(rows, slice) or not self.model.batched_out:
            return None
        C, col, views = rows.stop - rows.start, 0, {}
        for k, v in self.template.items():
            views[k] = np.reshape(Q[rows, col:col + v.size], (C, *v.shape), copy=False)
            col += v.size
        return views

    def _commit_state(self, idx: np.ndarray, new_state: dict[str, np.ndarray],
                      prefix: str = "model") -> None:
        """The clients ``idx``'s new private model state (rows of ``new_state``) kept (under
        ``prefix``: an extra point's kept states, see :meth:`_points`)."""
        g = self.groups.setdefault(prefix, _Group(len(self.ids)))
        for k, v in new_state.items():
            if k not in g.arrays:
                g.arrays[k] = np.zeros((len(self.ids), *v.shape[1:]), dtype=v.dtype)
            g.arrays[k][idx] = v
        g.present[idx] = True

    def _batch_masks(self, seed: int, rnd: int, idx: np.ndarray, batch_size: int):
        """Each client's mini-batch as masks per bucket (the per-client path's rows)."""
        masks = {}
        want = np.zeros(len(self.ids), dtype=bool)
        want[idx] = True
        for b, bk in enumerate(self.batch.buckets):
            m = np.zeros_like(bk.real)
            sel = want[bk.clients]
            if sel.any():
                cl = bk.clients[sel]
                keys = stream_keys(seed, self.keys[cl], rnd, _P_BATCH)
                got = batch_rows(keys, self.batch.n_units[cl], batch_size)
                m[sel, :got.shape[1]] = got
            masks[b] = m
        return masks

    def estep(self, idx: np.ndarray, msg: dict, resets: dict[int, np.ndarray]) -> BatchReply:
        """The E-step of the clients ``idx`` (ascending batch positions) for round message
        ``msg``; ``resets`` maps a position to the flat ``V_c`` it must adopt first.

        After the statistics, each chunk of rows is turned into the reply in place (mean,
        ``- S_hat - V_c``, the quantizer, ``V_c += alpha Q_c``): one pass over the sums, the
        same operations, element by element, as a client alone makes."""
        seed, rnd, mode = int(msg["seed"]), int(msg["round"]), str(msg.get("mode", "full"))
        params = unpack(msg, "params")
        S_hat = unpack(msg, "S_hat")
        points = self._points(idx, msg, mode, bool(S_hat))  # (from the round's first state)
        keep_init = not S_hat and bool(msg.get("keep_init", False))
        use_cv = bool(msg.get("control_variates", False))
        levels = int(msg.get("quant_levels", 0))
        keys = stream_keys(seed, self.keys[idx], rnd, _P_QUANT) if levels > 0 else None
        S_flat = Stats(S_hat).flatten()[None, :] if S_hat else None
        cv = use_cv and bool(S_hat)
        alpha = float(msg["alpha"]) if cv else 1.0
        # full passes and mini-batches are made into replies chunk by chunk during the step
        # (from sums); otherwise the step's means are, after it
        fused = mode in ("full", "batch") and not keep_init
        V = had = None

        def control_variates():
            """``V_c`` (after the resets) and who had one, once the layout is known."""
            nonlocal V, had
            if use_cv and V is None and self.template is not None:
                V = self._flat_group("V")
                for i, v in resets.items():
                    V.arrays[""][i] = v
                    V.present[i] = True
                had = V.present[idx]

        def finish(Q, n, lo, hi):
            """Rows ``lo:hi`` of the sums made into the reply, in place."""
            control_variates()
            for a, b, ii in _sub_chunks(idx, lo, hi):
                Vc, view = None if V is None else V.arrays[""][ii], isinstance(ii, slice)
                new = fedem_rows(
                    Q[a:b], n[a:b] if fused else None, S_flat, Vc,
                    None if had is None else had[a:b], levels=levels,
                    sizes=[v.size for v in self.template.values()], alpha=alpha, cv=cv,
                    uniforms=stream_uniforms(keys[a:b], Q.shape[1]) if levels > 0 else None,
                    out=Vc if view else None)
                if new is not None and not view:
                    V.arrays[""][ii] = new

        done = np.zeros(idx.size, dtype=bool)
        S_c, n, obj = self._estep_stats(mode, seed, rnd, idx, params, msg,
                                        (finish, done) if fused else None)
        if keep_init:
            g = self._flat_group("init_S")
            g.arrays[""][idx] = S_c
            g.present[idx] = True
        control_variates()
        _finish_rest(done, finish, S_c, n)
        if cv and V is not None:
            V.present[idx] = True
        return BatchReply(idx, S_c, n, obj, self.template, points)

    def _points(self, idx: np.ndarray, msg: dict, mode: str, has_S_hat: bool):
        """A multi-point round's extra points (``msg["points"] = m``, parameters
        ``params{j}/``): each client's mean statistic and objective at every ``T(x_j)``, from
        the model state the round starts from, or, with ``history``, from the combination of
        kept states the message names, kept with what it gave, as :meth:`ClientNode.
        _point_replies <fedlatent.engine.node.client.ClientNode._point_replies>`. Raises
        NotImplementedError where a client would refuse them (not full passes, the
        initialization round, a state it does not keep) or the model stacks its own units:
        the clients then answer one by one, each saying why. First the accepted point's state
        (:meth:`_accepted_state`), adopted once every start is formed."""
        m = int(msg.get("points", 0) or 0)
        if m > 0 and (mode != "full" or not has_S_hat or self.units is not None or
                      any(not unpack(msg, f"params{j}") for j in range(1, m + 1))):
            raise NotImplementedError("extra points are computed at once only on full passes "
                                      "after the initialization round, over rows")
        key, track = (int(msg["seed"]), int(msg["round"])), "history" in msg
        try:
            history_rounds(msg)
        except ValueError as err:  # each client refuses it one by one, named
            raise NotImplementedError(str(err)) from None
        adopted, a_in = self._accepted_state(idx, msg)
        a_out = self._model_state(idx) if adopted is None else adopted  # (copies)
        starts = self._point_starts(idx, msg, m, a_out, a_in) if track and m > 0 else None
        if adopted is not None:  # (every check passed: nothing changed before)
            self._commit_state(idx, adopted)
        self._start = a_out if track else None
        if m <= 0:
            return ()
        out = []
        for j in range(1, m + 1):
            if track:
                self._commit_state(idx, starts[j - 1], in_key(key[1], j))
            Q, n, obj = self._stats(unpack(msg, f"params{j}"), idx, None,
                                    out_key(key[1], j) if track else False, f"point{j}",
                                    key=key, source=in_key(key[1], j) if track else "model")
            Q /= np.maximum(n, 1)[:, None]
            out.append((Q, obj))
        return tuple(out)

    def _estep_stats(self, mode: str, seed: int, rnd: int, idx: np.ndarray, params, msg,
                     hook):
        """The step's statistics: sums made into replies by ``hook`` as they come (full
        passes, mini-batches), or means (``hook`` None; SPIDER's, kept for its corrections)."""
        if self.units is not None and mode != "full":
            raise NotImplementedError("the model's batched step makes full passes only")
        if mode in ("full", "spider-refresh", "batch"):
            masks = None if mode != "batch" else \
                self._batch_masks(seed, rnd, idx, int(msg["batch_size"]))
            S_c, n, obj = self._stats(params, idx, masks, True, "estep", hook, (seed, rnd))
            self._keep_history(idx, msg)
            if hook is None:
                S_c /= np.maximum(n, 1)[:, None]
            if mode == "spider-refresh":
                self._spider_put(idx, S_c, params)
            return S_c, n, obj
        if mode == "spider":
            self._keep_history(idx, msg)  # (drops kept point states: a plain round)
            return self._spider(seed, rnd, idx, params, int(msg["batch_size"]))
        raise KeyError(f"unknown E-step mode {mode!r}")

    def evaluate(self, idx: np.ndarray, msg: dict) -> BatchReply:
        """Mean statistics at the message's parameters; no state changes."""
        Q, n, obj = self._stats(unpack(msg, "params"), idx, None, False, "evaluate",
                                key=(int(msg["seed"]), int(msg["round"])))
        Q /= np.maximum(n, 1)[:, None]
        return BatchReply(idx, Q, n, obj, self.template)

    def cv_init(self, idx: np.ndarray, msg: dict) -> None:
        """``V_c = S_c(theta_0) - S_hat_0`` for the clients that kept ``S_c(theta_0)``."""
        g = self.groups.get("init_S")
        if g is None:
            return
        g = self._flat_group("init_S")
        has = idx[g.present[idx]]
        S_hat = Stats(unpack(msg, "S_hat")).flatten()
        if has.size == len(self.ids) and "V" not in self.groups:  # every client: in place,
            flat = g.arrays.pop("")  # the kept S_c0 become the V_c (no copy of the clients')
            flat -= S_hat[None, :]
            V = self.groups["V"] = _Group(len(self.ids))
            V.arrays[""] = flat
            V.present[:] = True
            g.present[:] = False
            return
        V = self._flat_group("V")
        V.arrays[""][has] = g.arrays[""][has] - S_hat[None, :]
        V.present[has] = True
        g.present[has] = False

    # ---- queries and setup -----------------------------------------------------------------
    def query(self, idx: np.ndarray, msg: dict, model):
        """The replies of the clients ``idx`` (ascending batch positions) to the query of
        ``msg``, by ``model.client_query_batched`` on a chunk of a bucket's clients at a time
        (about ``_CHUNK_ROWS`` rows): yields ``(rows, fields)``, ``rows`` the positions in
        ``idx`` of the chunk's clients and ``fields`` their replies' entries stacked."""
        name = str(msg["query"])
        want = np.zeros(len(self.ids), dtype=bool)
        want[idx] = True
        row_of = np.full(len(self.ids), -1)
        row_of[idx] = np.arange(idx.size)
        rows = sum(int(want[bk.clients].sum()) * bk.X.shape[1] for bk in self.batch.buckets)
        for bk in self.batch.buckets:
            sel = want[bk.clients]
            every = bool(sel.all())
            pos = None if every else np.flatnonzero(sel)
            count = len(bk.clients) if every else pos.size
            per = max(1, _CHUNK_ROWS // max(bk.X.shape[1], 1))
            for lo in range(0, count, per):
                take = slice(lo, min(lo + per, count)) if every else pos[lo:lo + per]
                cl = bk.clients[take]
                with at_scale(rows):  # (a compiled kernel pays for the whole query's rows)
                    fields = model.client_query_batched(
                        name, msg, bk.X[take], None if bk.y is None else bk.y[take],
                        bk.real[take].astype(np.float64), self._model_state(cl))
                yield row_of[cl], fields

    def mark_setup(self) -> None:
        """Every client set up: the state entry ``engine/initialized`` a node's setup adds
        (:class:`~fedlatent.engine.node.client.ClientNode`), for the clients that lack it."""
        n = len(self.ids)
        g = self.groups.setdefault("engine", _Group(n))
        if "initialized" not in g.arrays:
            g.arrays["initialized"] = np.ones(n)
        g.arrays["initialized"][~g.present] = 1.0
        g.present[:] = True

    # ---- SPIDER ----------------------------------------------------------------------------
    def _spider_put(self, idx, S_c, params) -> None:
        g = self._flat_group("spider_S")
        g.arrays[""][idx] = S_c
        g.present[idx] = True
        p = self.groups.setdefault("spider_params", _Group(len(self.ids)))
        for k, v in params.items():
            v = np.asarray(v)
            if k not in p.arrays:
                p.arrays[k] = np.zeros((len(self.ids), *v.shape), dtype=v.dtype)
            p.arrays[k][idx] = v
        p.present[idx] = True

    def _spider(self, seed, rnd, idx, params, batch_size):
        """SPIDER's correction: ``S = S_prev + mean_B s(theta) - mean_B s(theta_prev)``; a
        client never refreshed takes a full pass."""
        masks = self._batch_masks(seed, rnd, idx, batch_size)
        g = self._flat_group("spider_S")
        fresh = ~g.present[idx]
        S_c = np.empty((idx.size, self.template.size))
        n = np.empty(idx.size)
        obj = np.empty(idx.size)
        if fresh.any():
            Q, n[fresh], obj[fresh] = self._stats(params, idx[fresh], None, True)
            S_c[fresh] = Q / np.maximum(n[fresh], 1)[:, None]
        old = idx[~fresh]
        if old.size:
            Q, n_new, o = self._stats(params, old, masks, True)
            n[~fresh], obj[~fresh] = n_new, o
            prev = self.groups["spider_params"]
            # clients whose previous parameters are the same are computed together
            flat = np.concatenate([prev.arrays[k][old].reshape(old.size, -1)
                                   for k in sorted(prev.arrays)], axis=1)
            _, inv = np.unique(flat, axis=0, return_inverse=True)
            Qo, no = np.empty_like(Q), np.empty(old.size)
            for j in np.unique(inv):
                members = np.flatnonzero(inv.ravel() == j)
                first = old[members[0]]
                pp = {k: prev.arrays[k][first] for k in prev.arrays}
                Qo[members], no[members], _ = self._stats(pp, old[members], masks, False)
            S_c[~fresh] = (g.arrays[""][old] + Q / np.maximum(n_new, 1)[:, None]
                           - Qo / np.maximum(no, 1)[:, None])
        self._spider_put(idx, S_c, params)
        return S_c, n, obj


class _Generators:
    """The generators clients draw their own step's numbers from, built when asked for:
    ``self[i]`` is the ``i``-th client's (``client_rng`` of the client, the round and the
    model's purpose, as a client node makes it); :meth:`uniforms` draws the first uniforms of
    all of them in one compiled pass."""

    def __init__(self, seed: int, ids: list[str], rnd: int, keys: np.ndarray):
        self.seed, self.ids, self.rnd, self.keys = int(seed), ids, int(rnd), keys

    def uniforms(self, counts: np.ndarray) -> np.ndarray:
        """``self[i].random(counts[i])`` for every client, concatenated (the same numbers)."""
        pcg = kernels("fedlatent.engine.fedem.pcg")  # (numba: imported when drawn)
        return pcg.client_uniforms(self.seed, self.keys, self.rnd, _P_MODEL, counts)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> np.random.Generator:
        return client_rng(self.seed, self.ids[i], self.rnd, _P_MODEL)


def _finish_rest(done: np.ndarray, finish, S_c: np.ndarray, n: np.ndarray) -> None:
    """The rows not finished during the step (all of them, or rows of buckets whose positions
    are not consecutive), in chunks of consecutive rows."""
    if done.all():
        return
    todo = np.flatnonzero(~done)
    for run in np.split(todo, np.flatnonzero(np.diff(todo) != 1) + 1):
        for lo in range(int(run[0]), int(run[-1]) + 1, _CHUNK):
            finish(S_c, n, lo, min(lo + _CHUNK, int(run[-1]) + 1))


def _sub_chunks(idx: np.ndarray, lo: int, hi: int):
    """``(a, b, clients)`` of the rows ``lo:hi`` by :data:`_FINISH_ROWS` (a few hundred rows,
    in cache), ``clients`` = ``idx[a:b]`` as a slice when consecutive (rows updated in
    place)."""
    for a in range(lo, hi, _FINISH_ROWS):
        b = min(a + _FINISH_ROWS, hi)
        rows = idx[a:b]  # (ascending and distinct: consecutive when the ends say so)
        yield a, b, slice(int(rows[0]), int(rows[-1]) + 1) if rows[-1] - rows[0] == b - a - 1 \
            else rows
