"""The server half of the engine: the FedEM round loop.

Round 1 is the initialization E-step: every client computes its statistics at the initial
parameters, uncompressed, and the server sets ``S_hat`` to their weighted mean (this is EM's first
iteration); with control variates every client then sets ``V_c = S_c(theta_0) - S_hat_0``, the
initialization of the paper's convergence theorem (so the server's ``V`` starts at 0 exactly, and
the first compressed differences are small). From round 2 on, the update of Dieuleveut, Fort,
Moulines and Robin (2021), slide
"FedEM with partial participation", with client weights ``w_c`` (``n_c / n`` or ``1 / n_clients``)::

    active clients A ~ Bernoulli(p) each
    for c in A:  S_c = local mean statistic at T(S_hat)   (full pass, mini-batch or SPIDER)
                 Delta_c = S_c - S_hat - V_c ;  send Q_c = Quant(Delta_c) ;  V_c += alpha Q_c
    server:      S_hat += gamma * ( (1/p) sum_{c in A} w_c Q_c + V )
                 V     += alpha * sum_{c in A} w_c Q_c
                 theta  = T(S_hat) ; broadcast

With p = 1, gamma = 1 and no quantizer this is exactly EM on the pooled data: ``S_hat`` becomes
``sum_c w_c S_c`` whatever ``V``. Without control variates ``V_c = V = 0`` ("naive FedEM").
FedHLCR's smoothing ``S_t = (1 - gamma) S_{t-1} + gamma S`` is ``p = fraction``, step ``gamma``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import load_arrays_json, save_arrays_json
from .federation import Federation
from .history import History, RoundRecord
from .messages import ClientReplyError, check_reply, message_nbytes, pack
from .model import FederatedModel, Params, server_rng
from .runtime import Runtime
from .stats import Stats

__all__ = [
    "ConvergenceWarning",
    "FederatedFitError",
    "FitResult",
    "run_federated_em",
    "setup_clients",
]

logger = logging.getLogger(__name__)


class ConvergenceWarning(UserWarning):
    """The fit stopped at max_rounds before the objective settled."""


class FederatedFitError(RuntimeError):
    """A fault during a run. ``last_good`` holds the parameters of the last good round."""

    def __init__(self, message: str, last_good: Params | None = None, round_: int | None = None):
        super().__init__(message)
        self.last_good = last_good
        self.round = round_


@dataclass
class FitResult:
    params: Params
    S_hat: Stats
    history: History
    converged: bool
    n_rounds: int


def setup_clients(runtime: Runtime, model: FederatedModel) -> dict[str, int]:
    """Send every client the model's name and config; return each client's number of units.

    The one place a model reaches the clients: they rebuild it from the registry (no code or
    pickle crosses).
    """
    cids = runtime.client_ids
    msg = {"model": model.name, "model_config": json.dumps(model.get_config())}
    infos = runtime.broadcast(cids, "setup", msg)
    lost = [c for c in cids if c not in infos]
    if lost:
        raise FederatedFitError(f"clients {lost} did not answer the setup message")
    n_units = {c: int(infos[c]["n_units"]) for c in cids}
    for c, m in n_units.items():
        if m < 1:
            raise FederatedFitError(f"client {c!r} has no units to fit")
    return n_units


def _progress(total: int, enabled: bool | None, desc: str):
    from tqdm.auto import tqdm

    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, disable=not enabled, desc=desc, leave=False)


def run_federated_em(
    model: FederatedModel,
    runtime: Runtime,
    federation: Federation,
    params0: Params,
    *,
    seed: int,
    max_rounds: int = 100,
    tol: float = 1e-3,
    progress: bool | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 10,
    resume: bool = False,
    description: str = "fedlatent",
    callbacks: list | None = None,
    n_units: dict[str, int] | None = None,
) -> FitResult:
    """Run the FedEM round loop of ``model`` over the clients of ``runtime``.

    Parameters
    ----------
    model : FederatedModel
        The model's math; its name and config are sent to every client at setup.
    runtime : Runtime
        Transport to the clients (in-process or Flower).
    federation : Federation
        Participation, step size, weighting, compression, variance reduction.
    params0 : dict of str to ndarray
        Initial parameters.
    seed : int
        Seed of every random draw of the run (participation, quantization, mini-batches, models).
    max_rounds : int
        Number of rounds at most, the initialization round included.
    tol : float
        Convergence when the mean per-unit objective changes by less than ``tol`` between two
        deterministic rounds (full participation and full passes).
    progress : bool or None
        tqdm bar; None shows it only when stderr is a terminal.
    checkpoint : path or None
        Where to write checkpoints (``<path>.npz`` and ``<path>.json``) every ``checkpoint_every``
        rounds and when a fault stops the run.
    resume : bool
        Continue from ``checkpoint``: the result equals the uninterrupted run's.
    callbacks : list of callables or None
        Each is called as ``cb(round, params, S_hat, record)`` after every round (for studies
        that need per-round parameters; they must not modify their arguments).
    n_units : dict or None
        What :func:`setup_clients` returned, when the caller has already set the clients up
        (to run initialization queries); None sets them up here.

    Returns
    -------
    FitResult
    """
    federation.validate()
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    cids = runtime.client_ids
    n_clients = len(cids)
    if n_units is None:
        n_units = setup_clients(runtime, model)
    n_total = float(sum(n_units.values()))
    if federation.client_weighting == "samples":
        weights = {c: n_units[c] / n_total for c in cids}
    else:
        weights = {c: 1.0 / n_clients for c in cids}

    p = float(federation.participation)
    quant = federation.quantizer
    use_cv = bool(federation.control_variates)
    vr = federation.variance_reduction
    shapes = model.stat_shapes(params0)
    alpha = federation.alpha_for(shapes)
    raw_bytes = int(sum(8 * int(np.prod(s)) for s in shapes.values())) + 16
    quant_bytes = (quant.nbytes(shapes) + 16) if quant is not None else raw_bytes

    params = {k: np.asarray(v, dtype=np.float64) for k, v in params0.items()}
    S_hat: Stats | None = None
    V: Stats | None = None
    history = History()
    start_round = 1
    if resume:
        if checkpoint is None:
            raise ValueError("resume=True needs checkpoint=PATH")
        arrays, meta = load_arrays_json(checkpoint)
        if meta.get("model") != model.name or meta.get("seed") != int(seed):
            raise ValueError(
                f"checkpoint {checkpoint} is of model {meta.get('model')!r} with seed "
                f"{meta.get('seed')}; this fit is {model.name!r} with seed {seed}"
            )
        params = {k[7:]: v for k, v in arrays.items() if k.startswith("params/")}
        S_hat = Stats.from_dict(arrays, "S_hat/")
        V = Stats.from_dict(arrays, "V/") if any(k.startswith("V/") for k in arrays) else None
        history = History.from_records(meta["history"])
        start_round = int(meta["round"]) + 1
        states: dict[str, dict[str, np.ndarray]] = {}
        for k, v in arrays.items():
            if k.startswith("client/"):
                _, cid, rest = k.split("/", 2)
                states.setdefault(cid, {})[rest] = v
        if states:
            runtime.set_client_states(states)

    def save(round_: int) -> None:
        if checkpoint is None:
            return
        arrays = {f"params/{k}": v for k, v in params.items()}
        if S_hat is not None:
            arrays.update(S_hat.to_dict("S_hat/"))
        if V is not None:
            arrays.update(V.to_dict("V/"))
        client_states = runtime.get_client_states()
        if client_states:
            for cid, st in client_states.items():
                for k, v in st.items():
                    arrays[f"client/{cid}/{k}"] = v
        meta = {
            "model": model.name,
            "model_config": model.get_config(),
            "federation": federation.to_config(),
            "seed": int(seed),
            "round": round_,
            "history": [asdict(r) for r in history],
        }
        save_arrays_json(checkpoint, arrays, meta)

    converged = False
    deterministic = federation.is_plain_em
    bar = _progress(max_rounds, progress, description)
    bar.update(start_round - 1)
    last_round = start_round - 1
    try:
        for k in range(start_round, max_rounds + 1):
            t0 = time.perf_counter()
            init_round = S_hat is None
            gamma = 1.0 if init_round else federation.gamma(k)
            if init_round:
                active = list(cids)
            else:
                draw = server_rng(seed, k).random(n_clients)
                active = [c for c, u in zip(cids, draw) if u < p] if p < 1.0 else list(cids)
            msg: dict[str, Any] = {
                "seed": int(seed),
                "round": k,
                "control_variates": use_cv and not init_round,
                "alpha": alpha,
                "quant_levels": 0 if (init_round or quant is None) else quant.levels,
            }
            if init_round:
                msg["mode"] = "spider-refresh" if vr is not None else "full"
                msg["keep_init"] = use_cv
            elif vr is not None:
                msg["mode"] = "spider-refresh" if (k - 2) % vr.inner_rounds == 0 else "spider"
                msg["batch_size"] = vr.batch_size
            elif federation.batch_size is not None:
                msg["mode"] = "batch"
                msg["batch_size"] = int(federation.batch_size)
            else:
                msg["mode"] = "full"
            msg.update(pack("params", params))
            if S_hat is not None:
                msg.update(pack("S_hat", S_hat.to_dict()))
            replies = runtime.broadcast(active, "estep", msg) if active else {}
            missing = [c for c in active if c not in replies]
            if missing:
                logger.warning("round %d: clients %s did not answer; treated as absent", k, missing)
            got: dict[str, Stats] = {}
            obj_sum, obj_n = 0.0, 0
            for c in active:
                if c not in replies:
                    continue
                got[c] = check_reply(c, replies[c], shapes)
                obj_sum += float(replies[c]["objective"])
                obj_n += int(replies[c]["n"])
            bytes_down = message_nbytes(msg) * len(active)
            bytes_up = (raw_bytes if init_round else quant_bytes) * len(got)

            if init_round:
                if missing:
                    raise FederatedFitError(
                        f"clients {missing} did not answer the initialization round", params, k
                    )
                S_new = None
                for c in cids:
                    S_new = got[c] * weights[c] if S_new is None else S_new.add_(got[c], weights[c])
                V_new = S_new.zeros_like() if use_cv else None
            else:
                agg = S_hat.zeros_like()
                for c in got:
                    agg.add_(got[c], weights[c])
                S_new = S_hat.copy().add_(agg, gamma / p)
                V_new = V
                if use_cv:
                    S_new.add_(V, gamma)
                    V_new = V.copy().add_(agg, alpha)
            if not S_new.all_finite():
                raise FederatedFitError(
                    f"round {k}: the aggregated statistic is not finite; kept the parameters of "
                    f"round {k - 1}",
                    params,
                    k,
                )
            new_params = model.server_step(S_new, params, n_total)
            bad = [n for n, v in new_params.items() if not np.all(np.isfinite(v))]
            if bad:
                raise FederatedFitError(
                    f"round {k}: the M-step gave non-finite {bad}; kept the parameters of round "
                    f"{k - 1}",
                    params,
                    k,
                )
            if init_round and use_cv:
                # V_c0 = S_c(theta_0) - S_hat_0 on every client, so V = sum_c w_c V_c0 = 0.
                cv_msg = {"seed": int(seed), "round": k, **pack("S_hat", S_new.to_dict())}
                runtime.broadcast(cids, "cv_init", cv_msg)
                bytes_down += message_nbytes(cv_msg) * n_clients
            S_hat, V, params = S_new, V_new, new_params
            h2 = None
            if federation.track_h:
                ev = runtime.broadcast(
                    cids, "evaluate", {"seed": int(seed), "round": k, **pack("params", params)}
                )
                mean = S_hat.zeros_like()
                for c in cids:
                    mean.add_(check_reply(c, ev.get(c), shapes), weights[c])
                h2 = (mean - S_hat).squared_norm()
            objective = obj_sum / obj_n if obj_n else float("nan")
            history.append(
                RoundRecord(
                    round=k,
                    objective=objective,
                    h_norm2=h2,
                    bytes_up=int(bytes_up),
                    bytes_down=int(bytes_down),
                    participants=len(got),
                    step_size=gamma,
                    seconds=time.perf_counter() - t0,
                    missing=missing,
                )
            )
            last_round = k
            for cb in callbacks or ():
                cb(k, params, S_hat, history[-1])
            bar.update(1)
            bar.set_postfix(objective=f"{objective:.5g}", clients=len(got))
            if checkpoint is not None and k % max(1, checkpoint_every) == 0:
                save(k)
            if deterministic and len(history) >= 2 and not missing:
                change = history[-1].objective - history[-2].objective
                if abs(change) < tol:
                    converged = True
                    break
    except (ClientReplyError, FederatedFitError) as err:
        if checkpoint is not None:
            save(last_round)
        if isinstance(err, FederatedFitError):
            raise
        raise FederatedFitError(str(err), params, last_round + 1) from err
    finally:
        bar.close()
    if checkpoint is not None:
        save(last_round)
    if deterministic and not converged:
        warnings.warn(
            f"{description}: did not converge in {max_rounds} rounds (the mean objective still "
            f"changed by more than tol={tol}); raise max_rounds or tol",
            ConvergenceWarning,
            stacklevel=3,
        )
    return FitResult(params, S_hat, history, converged, last_round)
