"""The Flower runtime: any fedlatent estimator on Flower's Message API, simulated or deployed.

Server side, :class:`FlowerRuntime` implements the engine's :class:`~fedlatent.runtime.base.Runtime`
over a Flower ``Grid``: ``call`` sends one ``query.fedlatent`` message per client and returns the
replies that arrive within the round's timeout; a node that does not answer is absent from the
result, so the engine treats it as not taking part in that round (and the history says so).
Client side (:mod:`fedlatent.runtime.flower_site`), the ``ClientApp`` handler rebuilds a
:class:`~fedlatent.engine.node.client.ClientNode` on every message from the node's own data file and
its private state kept in ``context.state`` (FedGMM's pi_c, HLCR's labels and counts, control
variates, SPIDER memory), which it also writes into its site directory after every round, so that
it outlives the run: a site predicts with it afterwards, and a run that stopped resumes from the
server's checkpoint and the sites' states (run config ``resume = true``). Models do not change.

A message is a flat dict (see :mod:`fedlatent.engine.protocol.messages`): arrays travel in an
``ArrayRecord``, scalars and strings in a ``ConfigRecord``. Replies are validated by the engine
before aggregation; an exception on a node comes back as an error reply naming the node's client
and is raised on the server (a data error as :class:`~fedlatent.data.DataValidationError`).

Three ways to run one fit, one result (same seed, same participation pattern):

- in-process: ``est.fit(fd)`` (default);
- Flower simulation: :func:`simulate` (``pip install fedlatent[flower-sim]``, needs Ray);
- a deployment: one superlink, one supernode per site started with
  ``--node-config 'data-path="/site/client.parquet"'``, and ``flwr run`` of the app directory that
  ``fedlatent flower app`` writes (``pip install fedlatent[flower]``); see
  :mod:`fedlatent.runtime.flower_local` for a loopback deployment.

The server app reads its settings from the run config (:func:`run_config_for`) and writes into
``out-dir``: ``status.json`` (updated every round), the fitted estimator (``model.npz`` and
``model.json``, read back by :func:`load_result`), ``history.csv`` and, when ``record`` is set,
``messages.npz``/``messages.json`` with every message that crossed (for privacy checks).
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..data.dataset import DataValidationError
from ..engine.protocol.messages import ERROR_KEY, ClientReplyError
from ..engine.protocol.runtime import Runtime
from .flower_records import (  # the names of the message, importable from here too
    _ERROR,
    _ERROR_TYPE,
    _METHOD,
    _ROUND_METHODS,
    MESSAGE_TYPE,
    decode,
    encode,
)
from .flower_site import RESTORE, ROUND_METHODS, RUN, make_client_app, serve

__all__ = [
    "FlowerRuntime",
    "client_app",
    "decode",
    "encode",
    "load_result",
    "make_client_app",
    "make_server_app",
    "run_config_for",
    "serve",
    "server_app",
    "simulate",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Server side
# ---------------------------------------------------------------------------------------------
class FlowerRuntime(Runtime):
    """The engine's transport over a Flower ``Grid``.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    describe : dict
        The ``describe`` message (:func:`fedlatent.engine.contract.registry.describe_message`):
        every node answers with its client id, counts and column names, after checking its own data.
    min_nodes : int
        Wait until this many nodes are connected (at most ``node_wait`` seconds).
    round_timeout : float
        Seconds to wait for replies to one call; nodes not answering by then are absent.
    record : bool
        Keep every decoded message in ``self.log`` as (direction, client, method, message).
    restore_round : int or None
        Resuming from a server checkpoint of this round: every node's first round message
        tells it to go back to its site state of that round (:mod:`fedlatent.runtime.
        flower_site`).
    """

    def __init__(self, grid, describe: Mapping[str, Any], *, min_nodes: int = 1,
                 node_wait: float = 120.0, round_timeout: float = 120.0, record: bool = False,
                 restore_round: int | None = None):
        self.grid = grid
        # what every node records with its site state (the fit's estimator and parameters)
        self.run = json.dumps({"estimator": str(describe.get("estimator", "")),
                               "params": json.loads(str(describe.get("estimator_params", "{}")))},
                              sort_keys=True)
        self.restore_round = restore_round
        self._restored: set[str] = set()
        self.round_timeout = float(round_timeout)
        self.record = bool(record)
        self.log: list[tuple[str, str, str, dict[str, Any]]] = []
        self.lost: dict[str, str] = {}  # client -> why its last reply is missing
        t0 = time.perf_counter()
        nodes = sorted(grid.get_node_ids())
        while len(nodes) < int(min_nodes):
            if time.perf_counter() - t0 > float(node_wait):
                raise TimeoutError(
                    f"only {len(nodes)} of min-nodes={min_nodes} Flower nodes connected within "
                    f"{node_wait:g} s; start more supernodes or lower min-nodes"
                )
            time.sleep(0.5)
            nodes = sorted(grid.get_node_ids())
        self._node: dict[str, int] = {}
        self._cid_of: dict[int, str] = {}
        self._describing = True
        replies = self._exchange({n: ("describe", dict(describe)) for n in nodes}, node_wait)
        self._describing = False
        by_cid: dict[str, dict[str, Any]] = {}
        for nid in nodes:
            if nid not in replies:
                logger.warning("Flower node %s did not answer 'describe': left out", nid)
                continue
            rep = replies[nid]
            cid = str(rep["client_id"])
            if cid in by_cid:
                raise DataValidationError(
                    f"nodes {self._node[cid]} and {nid} both hold client {cid!r}; give every "
                    "supernode its own data file"
                )
            self._node[cid] = nid
            self._cid_of[nid] = cid
            by_cid[cid] = rep
        if len(by_cid) < int(min_nodes):
            raise TimeoutError(
                f"only {len(by_cid)} of min-nodes={min_nodes} Flower nodes described their data"
            )
        self.describe_replies = by_cid
        self.startup_seconds = time.perf_counter() - t0

    @property
    def client_ids(self) -> list[str]:
        return sorted(self._node)

    def _exchange(self, jobs: dict[int, tuple[str, dict[str, Any]]], timeout):
        """Send ``jobs[node] = (method, msg)``; return ``{node: decoded reply}``."""
        from flwr.app import Message

        msgs, order = [], []
        for nid, (method, msg) in jobs.items():
            payload = dict(msg)
            payload[_METHOD] = method
            payload[RUN] = self.run
            msgs.append(Message(encode(payload), dst_node_id=nid, message_type=MESSAGE_TYPE))
            order.append(nid)
        out: dict[int, dict[str, Any]] = {}
        for rep, dst in self._push_pull(msgs, order, timeout):
            nid = dst if dst is not None else rep.metadata.src_node_id
            cid = self._cid_of.get(nid, f"node {nid}")
            if rep.has_error():
                self.lost[cid] = f"Flower error {rep.error.code}: {rep.error.reason}"
                logger.warning("client %s (node %s): %s", cid, nid, self.lost[cid])
                continue
            out[nid] = decode(rep.content)
            if _ERROR in out[nid]:
                text, kind = str(out[nid][_ERROR]), str(out[nid].get(_ERROR_TYPE, ""))
                if jobs.get(nid, ("",))[0] in _ROUND_METHODS:
                    # as in-process: the loop records the client as missing, with this text
                    out[nid] = {ERROR_KEY: f"{kind}: {text}" if kind else text}
                    logger.warning("client %s (node %s) failed: %s", cid, nid, text)
                    continue
                if kind == "DataValidationError":
                    raise DataValidationError(text)
                if self._describing and kind in ("ValueError", "TypeError"):
                    # the estimator's own check of the node's data: its message names the client
                    raise (ValueError if kind == "ValueError" else TypeError)(text)
                raise ClientReplyError(cid, text)
        return out

    def _push_pull(self, msgs, order, timeout):
        """Push, then pull replies until all arrived or ``timeout``: yields (reply, dst node).

        Grid.send_and_receive sleeps 3 s between pulls; polling from 20 ms up to 0.2 s saves
        seconds per exchange on a deployment (a pull is one small request to the SuperLink).
        """
        ids = [str(i) for i in self.grid.push_messages(msgs)]
        dst_of = dict(zip(ids, order)) if len(ids) == len(order) else {}
        pending = set(ids)
        end = None if timeout is None else time.monotonic() + float(timeout)
        pause = 0.02
        while pending:
            for rep in self.grid.pull_messages(list(pending)):
                rid = str(rep.metadata.reply_to_message_id)
                if rid not in pending:
                    continue
                pending.discard(rid)
                yield rep, dst_of.get(rid)
            if not pending or (end is not None and time.monotonic() >= end):
                break
            time.sleep(pause)
            pause = min(0.2, pause * 1.5)

    def call(self, client_ids, method, messages):
        jobs = {self._node[c]: (method, messages[c]) for c in client_ids}
        if self.restore_round is not None:
            for c in client_ids:
                if c not in self._restored:
                    jobs[self._node[c]] = (method, {**messages[c], RESTORE: self.restore_round})
                    if method in ROUND_METHODS:
                        self._restored.add(c)
        if self.record:
            for c in client_ids:
                self.log.append(("down", c, method, dict(messages[c])))
        replies = self._exchange(jobs, self.round_timeout) if jobs else {}
        out = {self._cid_of[n]: r for n, r in replies.items()}
        for c in client_ids:
            if c not in out:
                self.lost.setdefault(c, f"no reply within {self.round_timeout:g} s")
            elif self.record:
                self.log.append(("up", c, method, dict(out[c])))
        return out


def run_config_for(estimator, *, out_dir, min_nodes: int, round_timeout: float = 120.0,
                   node_wait: float = 120.0, data_name: str = "", record: bool = False,
                   resume: bool = False) -> dict:
    """The ``[tool.flwr.app.config]`` of a fit of ``estimator`` (all TOML scalars).

    ``resume = true`` (``flwr run ... -c resume=true``) continues the run whose checkpoint is in
    ``out-dir``: the server's checkpoint plus the sites' states give the uninterrupted result.
    """
    from ..engine.contract.registry import estimator_config

    name, params = estimator_config(estimator)
    fed = params.pop("federation", None)
    return {
        "estimator": name,
        "params": json.dumps(params),
        "federation": json.dumps(fed) if fed is not None else "",
        "min-nodes": int(min_nodes),
        "round-timeout": float(round_timeout),
        "node-wait": float(node_wait),
        "out-dir": str(Path(out_dir).resolve()),
        "data-name": str(data_name),
        "record": bool(record),
        "resume": bool(resume),
    }


def _recorded(caught) -> list[dict[str, str]]:
    """The warnings of a fit as ``{"category", "message"}`` (each emitted again, as the fit
    would have)."""
    out = []
    for w in caught:
        out.append({"category": w.category.__name__, "message": str(w.message)})
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    os.replace(tmp, path)


def _save_log(out: Path, log) -> None:
    arrays, index = {}, []
    for i, (direction, cid, method, msg) in enumerate(log):
        keys = {}
        for k, v in msg.items():
            if isinstance(v, np.ndarray):
                arrays[f"{i}/{k}"] = v
                keys[k] = "array"
            else:
                keys[k] = v if isinstance(v, bool | int | float | str) else repr(v)
        index.append({"i": i, "direction": direction, "client": cid, "method": method,
                      "message": keys})
    np.savez(out / "messages.npz", **arrays)
    _write_json(out / "messages.json", index)


def _report_exchanges(rt: FlowerRuntime, status: dict[str, Any], path: Path) -> None:
    """Count ``rt``'s exchanges in ``status`` (``exchanges``, ``exchange``: the last method)
    and write it to ``path`` after each one before the first round, so that whoever watches
    the run sees the initialization advance."""
    call = rt.call

    def counted(client_ids, method, messages):
        replies = call(client_ids, method, messages)
        status["exchanges"] = int(status.get("exchanges", 0)) + 1
        status["exchange"] = str(method)
        if not status.get("round"):
            _write_json(path, status)
        return replies

    rt.call = counted


def run_server(grid, config: Mapping[str, Any]) -> None:
    """The server app's work: rebuild the estimator, fit it over the grid, save the result."""
    from ..data.remote import RemoteDataset
    from ..engine.contract.registry import estimator_from_config

    out = Path(str(config["out-dir"]))
    out.mkdir(parents=True, exist_ok=True)
    status: dict[str, Any] = {"status": "running", "error": None, "round": 0,
                              "app_started_at": time.time()}
    _write_json(out / "status.json", status)
    t_start = time.perf_counter()
    rt = None
    try:
        name, params = str(config["estimator"]), json.loads(str(config["params"]))
        fed = str(config.get("federation", ""))
        params["federation"] = json.loads(fed) if fed else None
        loading = _prefetch(name)  # the estimator's imports, while the nodes answer
        resume = bool(config.get("resume", False))
        restore = checkpoint_round(out / "checkpoint") if resume else None
        status["resumed_from"] = restore
        # the describe message of the estimator the run config holds (describe_message's)
        rt = FlowerRuntime(grid, {"estimator": name, "estimator_params": json.dumps(params)},
                           min_nodes=int(config["min-nodes"]),
                           node_wait=float(config.get("node-wait", 120.0)),
                           round_timeout=float(config.get("round-timeout", 120.0)),
                           record=bool(config.get("record", False)), restore_round=restore)
        status["answered_at"] = time.time()  # (epoch seconds: every node described its data)
        loading.join()
        est = estimator_from_config(name, params)
        status["estimator_ready_at"] = time.time()  # (and the server's estimator imported)
        status["startup_seconds"] = rt.startup_seconds
        status["clients"] = rt.client_ids
        _report_exchanges(rt, status, out / "status.json")
        rd = RemoteDataset.from_replies(rt.describe_replies)
        t_fit = time.perf_counter()

        def on_round(k, params, S_hat, record):
            status["round"] = int(k)
            status["last"] = {"objective": float(record.objective),
                              "participants": int(record.participants),
                              "missing": list(record.missing), "seconds": float(record.seconds)}
            _write_json(out / "status.json", status)
            logger.info("fedlatent round %d: objective %.6g, %d clients answered%s", k,
                        record.objective, record.participants,
                        f", missing {record.missing}" if record.missing else "")

        # a fault keeps the last good round in out-dir/checkpoint.npz; the fit's warnings
        # (ConvergenceWarning...) are recorded for whoever reads the result
        with warnings.catch_warnings(record=True) as caught:
            est.fit(rd, runtime=rt, callbacks=[on_round], progress=False,
                    checkpoint=out / "checkpoint", checkpoint_every=1, resume=resume)
        status["warnings"] = _recorded(caught)
        status["fit_seconds"] = time.perf_counter() - t_fit
        est.save(out / "model")
        hist = getattr(est, "history_", None)
        if hist is not None:
            hist.to_frame().to_csv(out / "history.csv", index=False)
            secs = [r.seconds for r in hist]
            status["seconds_per_round"] = float(np.mean(secs)) if secs else None
            status["rounds"] = len(secs)
        status["lost"] = dict(rt.lost)
        status["status"] = "ok"
    except BaseException as err:  # noqa: BLE001 - reported in status.json, then re-raised
        status["status"] = "error"
        status["error"] = f"{type(err).__name__}: {err}"
        if getattr(err, "faults", None):  # each client's reason, whole (the message names 10)
            status["faults"] = {str(c): str(why) for c, why in err.faults.items()}
        raise
    finally:
        status["total_seconds"] = time.perf_counter() - t_start
        if rt is not None and rt.record:
            _save_log(out, rt.log)
        _write_json(out / "status.json", status)


def _prefetch(name: str):
    """A started thread importing the module of the estimator registered as ``name`` (its
    scikit-learn, SciPy and pandas: about a second), so that the server app's first message
    goes out first and the imports run while the nodes answer it. A failure is left to the
    caller's own import (which raises it)."""
    import threading

    from ..engine.contract.registry import estimator_class

    def load():
        try:
            estimator_class(name)
        except Exception:  # noqa: BLE001 - raised again where the estimator is built
            logger.debug("prefetch of estimator %r failed", name, exc_info=True)

    thread = threading.Thread(target=load, name="fedlatent-prefetch", daemon=True)
    thread.start()
    return thread


def checkpoint_round(path: Path) -> int:
    """The round of the server checkpoint ``<path>.npz`` a resumed run continues from."""
    from ..engine.fedem.checkpoint import load_arrays_json

    npz = path.with_name(path.name + ".npz")
    if not npz.exists():
        raise FileNotFoundError(f"resume: there is no checkpoint {npz} to resume from; run "
                                "without resume (the out-dir of a run that stopped holds one)")
    _, meta = load_arrays_json(path)
    return int(meta["round"])


def make_server_app(config: Mapping[str, Any] | None = None):
    """A ``ServerApp`` running :func:`run_server`; ``config`` (for simulations, which do not read
    the app's pyproject) is laid over ``context.run_config``."""
    from flwr.serverapp import ServerApp

    app = ServerApp()
    fixed = dict(config or {})

    @app.main()
    def main(grid, context) -> None:
        run_server(grid, {**dict(context.run_config), **fixed})

    return app


# ---------------------------------------------------------------------------------------------
# Results and simulation
# ---------------------------------------------------------------------------------------------
def load_result(out_dir):
    """The estimator a server app fitted and saved in ``out_dir`` (raises its error if it
    failed)."""
    from ..engine.contract.registry import estimator_by_class_name
    from ..engine.fedem.checkpoint import load_arrays_json

    out = Path(out_dir)
    st_path = out / "status.json"
    if not st_path.exists():
        raise RuntimeError(f"{out} has no status.json: the Flower server app did not start")
    status = json.loads(st_path.read_text())
    if status.get("status") != "ok":
        raise RuntimeError(f"the Flower run failed: {status.get('error') or status}")
    _, meta = load_arrays_json(out / "model")
    cls = estimator_by_class_name(str(meta["class"]))
    if cls is None:
        raise RuntimeError(f"{out} holds a model of unknown class {meta['class']!r}")
    est = cls.load(out / "model")
    est.flower_status_ = status
    return est


def simulate(estimator, fd, *, workdir=None, round_timeout: float = 600.0, record: bool = False,
             num_cpus: int | None = None, verbose: bool = False, policies=None):
    """Fit ``estimator`` on ``fd`` with Flower's simulation engine (one supernode per client).

    The engine runs in this process, as ``flwr-simulation`` runs it
    (:func:`fedlatent.runtime.flower_engine.run_engine`), without Flower's deprecated
    ``run_simulation`` entry point.

    Each client's rows are written to its own file in ``workdir`` (a temporary directory,
    removed afterwards, by default) and read only by that client's node. Returns the fitted
    estimator loaded from what the server app saved; ``est.flower_status_`` has the timings
    (``startup_seconds``, ``seconds_per_round``, ``total_seconds``). ``round_timeout``: seconds
    to wait for the replies to one exchange, and for the nodes' first answers. ``policies``: a site
    policy file per client id (``{client: path}``), as a SuperNode's ``policy-path``. Every
    simulated site gets a signing key and the roster of them all in ``workdir`` (for secure
    aggregation; a site whose policy pins a roster keeps its own).
    """
    import tempfile

    from ..data.files import write_client_files
    from .flower_engine import run_engine

    if workdir is None:  # the client files and results are loaded, then removed
        with tempfile.TemporaryDirectory(prefix="fedlatent-") as tmp:
            return simulate(estimator, fd, workdir=tmp, round_timeout=round_timeout,
                            record=record, num_cpus=num_cpus, verbose=verbose,
                            policies=policies)
    work = Path(workdir)
    files = write_client_files(fd, work / "data")
    out = work / "out"
    # every node of a simulation exists: its first answer waits only for Ray to start its actor,
    # which on a loaded machine took over the deployment default of 120 s (0 of 3 described)
    config = run_config_for(estimator, out_dir=out, min_nodes=fd.n_clients,
                            round_timeout=round_timeout, node_wait=round_timeout, record=record)
    ncpu = int(num_cpus or os.cpu_count() or 1)
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": ncpu, "include_dashboard": False,
                             "log_to_driver": bool(verbose)}}
    t0 = time.perf_counter()
    from .flower_site import provision

    run_engine(make_server_app(config),
               make_client_app([str(files[c]) for c in fd.client_ids],
                               None if policies is None else [str(policies.get(c, "") or "")
                                                              for c in fd.client_ids],
                               identities=provision(fd.client_ids, work / "keys")),
               fd.n_clients, backend, verbose=verbose)
    est = load_result(out)
    est.flower_status_["wall_seconds"] = time.perf_counter() - t0
    return est


#: The components a Flower app directory names (``fedlatent flower app`` writes it).
server_app = None
client_app = None
try:  # only with the flower extra installed
    server_app = make_server_app()
    client_app = make_client_app()
except ImportError:  # pragma: no cover - flwr missing
    pass
