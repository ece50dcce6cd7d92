"""The server half of the engine: the FedEM round loop.

Round 1 is the initialization E-step: every client computes its statistics at the initial
parameters, uncompressed, and the server sets ``S_hat`` to their weighted mean (this is EM's first
iteration); with control variates every client then sets ``V_c = S_c(theta_0) - S_hat_0``, the
initialization of the paper's convergence theorem (so the server's ``V`` starts at 0 exactly, and
the first compressed differences are small). From round 2 on, the FedEM update of
Dieuleveut, Fort, Moulines and Robin (2021), written in :mod:`fedlatent.engine.update` (the state
update and the plan of each round); checkpoints in :mod:`fedlatent.engine.checkpoint`.
FedHLCR's smoothing ``S_t = (1 - gamma) S_{t-1} + gamma S`` is ``p = fraction``, step ``gamma``.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.validation import name_list
from .checkpoint import RunIdentity, load_loop_checkpoint, save_loop_checkpoint
from .federation import Federation
from .history import History, RoundRecord
from .messages import (
    ERROR_KEY,
    ClientReplyError,
    check_reply,
    fault_detail,
    message_nbytes,
    pack,
)
from .model import FederatedModel, Params
from .runtime import Runtime
from .stats import Stats
from .update import (
    FedEMState,
    ReplyScreen,
    client_weights,
    dominant_client,
    round_message,
    select_active,
    stat_bytes,
)
from .warn import user_stacklevel

__all__ = [
    "FederatedFitError",
    "ServerStepError",
    "FitResult",
    "LoopOptions",
    "DEFAULT_MAX_ROUNDS",
    "PRIVATE_MAX_ROUNDS",
    "resolve_max_rounds",
    "run_federated_em",
    "run_rounds",
]

logger = logging.getLogger(__name__)


def __getattr__(name: str):
    # scikit-learn's ConvergenceWarning (subclassed) is imported on first use: a client process
    # imports the engine without scikit-learn.
    if name == "ConvergenceWarning":
        from .errors import ConvergenceWarning

        return ConvergenceWarning
    if name == "setup_clients":  # moved to the checked protocol
        from .exchange import setup_clients

        return setup_clients
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class FederatedFitError(RuntimeError):
    """A fault during a run. ``last_good`` holds the parameters of the last good round,
    ``round_`` (also ``round``) the round that failed, ``clients`` every client it names
    (``faults``: client -> reason; the message shows at most 10 of them)."""

    def __init__(self, message: str, last_good: Params | None = None, round_: int | None = None,
                 faults: dict[str, str] | None = None):
        super().__init__(message)
        self.last_good = last_good
        self.round = round_
        self.faults: dict[str, str] = dict(faults or {})
        self.clients: list[str] = list(self.faults)

    @property
    def round_(self) -> int | None:
        return self.round


class ServerStepError(FederatedFitError, ValueError):
    """The M-step failed on the aggregated statistics (overflow, a singular system): the
    round is named and the last good state kept. Also a ValueError, as the error the model
    raised was."""


@dataclass
class FitResult:
    params: Params
    S_hat: Stats
    history: History
    converged: bool
    n_rounds: int


@dataclass
class Gathered:
    """One round's replies, screened: the new state (before the M-step) and the record."""

    state: Any
    missing: list
    rejected: dict
    errors: dict
    obj_sum: float
    obj_n: int
    participants: int
    bytes_down: int
    bytes_up: int
    after: Any  # after(S_hat_new): follow the clients' control variates
    batched: bool
    # keyword-only: two optional fields after eleven positional ones are easy to mix up
    skipped: str = field(default="", kw_only=True)  # why nothing crossed ("" when it ran)
    #: dominant() -> why the aggregate is one client's (update.dominant_client), or None
    dominant: Any = field(default=None, kw_only=True)


@dataclass
class LoopOptions:
    """How a fit runs (not what it computes).

    Attributes
    ----------
    seed : int
        Seed of every random draw of the run (participation, quantization, mini-batches, models).
    max_rounds : int
        Number of rounds at most, the initialization round included.
    tol : float
        Plain EM (:attr:`Federation.is_plain_em`): convergence when the mean per-unit objective
        changes by less than ``tol`` between two rounds. Any other federation (partial
        participation, a step size, compression, mini-batches), where each round's objective
        is computed on that round's participants only: convergence when the server statistic
        has settled, i.e. ``history_["stat_change"]`` (its relative change per unit step, see
        :class:`~fedlatent.engine.history.RoundRecord`) stayed below ``tol`` in each of the last
        ``max(2, ceil(1 / participation))`` rounds, every one with at least one participant and
        none missing or refused. ``tol=0`` never stops early. Under differential privacy the
        fit runs its planned rounds (no early stop, no ConvergenceWarning: the number of
        rounds is the plan). Any other fit that ends at ``max_rounds`` unconverged raises a
        :class:`~fedlatent.engine.errors.ConvergenceWarning`.
    progress : bool or None
        tqdm bar; None shows it only when stderr is a terminal.
    checkpoint : path or None
        Where to write checkpoints (one file, ``<path>.npz``, replaced atomically) every
        ``checkpoint_every`` rounds and when a fault stops the run.
    resume : bool
        Continue from ``checkpoint``: the result equals the uninterrupted run's. A checkpoint
        of another model, settings, seed, federation or clients, or with client states
        missing, is refused with a message saying what differs.
    description : str
        Names the fit in the progress bar and the ConvergenceWarning.
    callbacks : list of callables or None
        Each is called as ``cb(round, params, S_hat, record)`` after every round (they must not
        modify their arguments).
    """

    seed: int
    max_rounds: int = 100
    tol: float = 1e-3
    progress: bool | None = None
    checkpoint: str | Path | None = None
    checkpoint_every: int = 10
    resume: bool = False
    description: str = "fedlatent"
    callbacks: list | None = None


#: rounds of a fit whose ``max_rounds`` is not given (None)
DEFAULT_MAX_ROUNDS = 100
#: rounds of a fit under ``Federation(privacy=...)`` whose ``max_rounds`` is not given: every
#: round is a release paid from the budget, so the plan is short (the README's "1 to 3 rounds
#: after a good private start"; in ``experiments.privacy_utility``'s setting a GMM at epsilon 1
#: on 1e5 records loses 0.95% of held-out log-likelihood with 3 rounds, 31% with 100)
PRIVATE_MAX_ROUNDS = 3


def resolve_max_rounds(max_rounds: int | None, private: bool) -> int:
    """An estimator's ``max_rounds``: as given, or when None, :data:`PRIVATE_MAX_ROUNDS` under
    differential privacy and :data:`DEFAULT_MAX_ROUNDS` otherwise."""
    if max_rounds is not None:
        return int(max_rounds)
    return PRIVATE_MAX_ROUNDS if private else DEFAULT_MAX_ROUNDS


def progress_bar(total: int, enabled: bool | None, desc: str):
    from tqdm.auto import tqdm

    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, disable=not enabled, desc=desc, leave=False)


def warn_not_converged(description: str, max_rounds: int, tol: float,
                       plain: bool = True) -> None:
    from .errors import ConvergenceWarning

    what = ("the mean objective still changed" if plain else
            "the server statistic still moved (history_['stat_change'])")
    warnings.warn(
        f"{description}: did not converge in {max_rounds} rounds ({what} by more than "
        f"tol={tol}); raise max_rounds or tol",
        ConvergenceWarning,
        stacklevel=user_stacklevel(),
    )


def stat_change(old: Stats | None, new: Stats, gamma: float) -> float | None:
    """The relative change of the server statistic in one round, per unit step (None without a
    previous statistic): ``max_b ||new[b] - old[b]|| / (gamma max(||new[b]||, 1e-8 m))`` over
    the blocks ``b``, ``m`` the largest block norm (a block that is zero by construction, such
    as sums about their own centre, is measured against the others' scale)."""
    if old is None or gamma <= 0.0:
        return None
    norms = {b: float(np.linalg.norm(v)) for b, v in new.items()}
    floor = 1e-8 * max(norms.values(), default=0.0)
    worst = 0.0
    for b, v in new.items():
        diff = float(np.linalg.norm(v - old[b]))
        scale = max(norms[b], floor)
        if diff > 0.0:
            worst = max(worst, diff / scale if scale > 0.0 else math.inf)
    return worst / gamma


def window_size(participation: float) -> int:
    """Rounds the stopping rule of a non-plain federation looks back over."""
    return max(2, math.ceil(1.0 / float(participation) - 1e-9))


def run_federated_em(
    model: FederatedModel,
    runtime: Runtime,
    federation: Federation,
    params0: Params,
    *,
    seed: int,
    n_units: dict[str, int] | None = None,
    **options: Any,
) -> FitResult:
    """Run the FedEM round loop of ``model`` over the clients of ``runtime``.

    ``options`` are the fields of :class:`LoopOptions` (``max_rounds``, ``tol``, ``progress``,
    ``checkpoint``, ``checkpoint_every``, ``resume``, ``description``, ``callbacks``).
    ``n_units`` is what setup returned when the caller has already set the clients up (to run
    initialization queries); None sets them up here.
    """
    return run_rounds(model, runtime, federation, params0, LoopOptions(seed=seed, **options),
                      n_units=n_units)


def run_rounds(
    model: FederatedModel,
    runtime: Runtime,
    federation: Federation,
    params0: Params,
    options: LoopOptions,
    *,
    n_units: dict[str, int] | None = None,
    secure=None,
    privacy=None,
) -> FitResult:
    """The round loop (see the module docstring); returns the last good round's result.

    ``secure`` is the fit's :class:`~fedlatent.engine.secure.SecureChannel` (set up by the
    estimator); with ``Federation(secure_aggregation=True)`` and none given, one is set up
    here. ``privacy`` is the fit's :class:`~fedlatent.engine.privacy.PrivacyBudget` (its
    initialization releases spent); under ``Federation(privacy=...)`` with none given, one is
    planned here for ``max_rounds`` rounds."""
    federation.validate()
    if options.max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {options.max_rounds}")
    if federation.privacy is not None and privacy is None:
        if n_units is not None:
            raise ValueError("under Federation(privacy=...) the clients must be set up with "
                             "the fit's plan: pass the PrivacyBudget the setup used")
        from .privacy.dp import PrivacyBudget, planned_releases

        privacy = PrivacyBudget(federation.privacy.calibrate(
            planned_releases(options.max_rounds)))
    if n_units is None:
        from .exchange import setup_clients
        from .privacy.disclosure import effective

        n_units = setup_clients(runtime, model, effective(federation.disclosure,
                                                          federation.secure_aggregation),
                                federation.privacy,
                                0 if privacy is None else privacy.calibration.releases)
    if federation.secure_aggregation and secure is None:
        from .secure import open_channel

        secure = open_channel(runtime, federation, n_units, options.max_rounds)
    if secure is not None:
        secure.runtime = runtime  # the runtime this loop is given (a wrapper, say)
    rounds = _Rounds(model, runtime, federation, options, n_units)
    rounds.secure = secure
    rounds.budget = privacy
    return rounds.run(params0)


class _Rounds:
    """One run of the loop: the server's state between rounds and the round itself."""

    def __init__(self, model, runtime, federation, options: LoopOptions, n_units):
        self.model, self.runtime, self.fed, self.opt = model, runtime, federation, options
        self.cids = runtime.client_ids
        self.n_total = float(sum(n_units.values()))
        self.weights = client_weights(federation, {c: n_units[c] for c in self.cids})
        self.use_cv = bool(federation.control_variates)
        self.screen = ReplyScreen(model, dict(n_units), federation)
        self.state = FedEMState()
        self.history = History()
        self.params: Params = {}
        self.bserver = None
        self.secure = None  # the SecureChannel under secure aggregation
        self.budget = None  # the PrivacyBudget under differential privacy

    # ---- checkpoints ---------------------------------------------------------------------
    def save(self, round_: int) -> None:
        if self.opt.checkpoint is None:
            return
        save_loop_checkpoint(self.opt.checkpoint, params=self.params, state=self.state,
                             history=self.history,
                             client_states=self.runtime.get_client_states(),
                             identity=self.identity(), round_=round_, params0=self.params0,
                             mirror=self.mirror())

    def mirror(self):
        """The mirror of the clients' control variates for a checkpoint (per-client form)."""
        if self.bserver is not None and self.screen.checkpointed() is not None:
            return self.bserver.dump_mirror()
        return self.screen.checkpointed()

    def identity(self) -> RunIdentity:
        """What a checkpoint of this run must match to be resumed."""
        return RunIdentity(self.model.name, self.model.get_config(), self.fed.to_config(),
                           int(self.opt.seed), {c: int(self.screen.n_units[c]) for c in self.cids})

    def resume(self, shapes) -> int:
        """Load the checkpoint (refused, saying what differs, unless it is of this very run);
        returns the round to continue from."""
        if self.opt.checkpoint is None:
            raise ValueError("resume=True needs checkpoint=PATH")
        params, S_hat, V, records, states, round_, mirror = load_loop_checkpoint(
            self.opt.checkpoint, self.identity(), self.params0, shapes,
            self.runtime.get_client_states())
        if mirror is not None:
            self.screen.mirror, self.screen.resync = mirror
        self.params = params
        self.state = FedEMState(S_hat, V)
        self.history = History.from_records(records)
        if self.budget is not None:  # the rounds already run were releases too
            self.budget.releases += len(self.history)
        if states:
            self.runtime.set_client_states(states)
        return round_ + 1

    # ---- one round -----------------------------------------------------------------------
    def round(self, k: int, shapes, alpha: float, raw_bytes: int, quant_bytes: int) -> bool:
        """Run round ``k``; returns whether it converged."""
        t0 = time.perf_counter()
        seed = int(self.opt.seed)
        init_round = not self.state.initialized
        gamma = 1.0 if init_round else self.fed.gamma(k)
        p = float(self.fed.participation)
        msg = round_message(self.fed, seed, k, init_round, alpha)
        msg.update(pack("params", self.params))
        if self.state.S_hat is not None:
            msg.update(pack("S_hat", self.state.S_hat.to_dict()))
        g = None
        if self.budget is not None:
            self.screen.set_privacy(self.fed.privacy, self.budget.calibration.noise_multiplier,
                                    self.params, None if self.secure is None
                                    else self.secure.config.threshold)
        if self.secure is not None:
            from .secure_round import gather_secure

            g = gather_secure(self, k, msg, shapes, init_round, gamma, p, alpha)
        elif self.bserver is not None:
            g = self.gather_batched(k, msg, init_round, gamma, p, alpha, raw_bytes,
                                    quant_bytes)
        if g is None:
            g = self.gather(k, msg, shapes, init_round, gamma, p, alpha, raw_bytes, quant_bytes)
        if g.skipped:  # nothing crossed: state, parameters and privacy budget unchanged
            self.history.append(RoundRecord(
                round=k, objective=float("nan"), h_norm2=None, bytes_up=0, bytes_down=0,
                participants=0, step_size=0.0, seconds=time.perf_counter() - t0,
                missing=g.missing, errors=g.errors, skipped=g.skipped,
                epsilon=None if self.budget is None else self.budget.spent[0]))
            return False
        new_state, missing, rejected, errors = g.state, g.missing, g.rejected, g.errors
        bytes_down, bytes_up = g.bytes_down, g.bytes_up
        who = (lambda: f"; {g.dominant()}" if g.dominant is not None and g.dominant() else "")
        if not new_state.S_hat.all_finite():
            raise FederatedFitError(
                f"round {k}: the aggregated statistic is not finite{who()}; kept the parameters "
                f"of round {k - 1}",
                self.params,
                k,
            )
        try:
            new_params = self.model.server_step(new_state.S_hat, self.params, self.n_total)
        except (FloatingPointError, OverflowError, ZeroDivisionError, ValueError,
                np.linalg.LinAlgError) as err:
            raise ServerStepError(
                f"round {k}: the M-step failed on the aggregated statistics "
                f"({type(err).__name__}: {err}){who()}; kept the parameters of round {k - 1}",
                self.params, k) from err
        bad = [n for n, v in new_params.items() if not np.all(np.isfinite(v))]
        if bad:
            raise FederatedFitError(
                f"round {k}: the M-step gave non-finite {bad}; kept the parameters of round "
                f"{k - 1}",
                self.params,
                k,
            )
        g.after(new_state.S_hat)
        converged_ok = not missing and not rejected
        h2 = None
        if self.fed.track_h and g.batched:
            h2, rejected = self.bserver.h_norm2(k, new_params, new_state.S_hat, rejected)
        elif self.fed.track_h:
            h2, missing, rejected, errors = self.h_norm2(k, shapes, new_params, new_state.S_hat,
                                                         missing, rejected, errors)
        if init_round and self.use_cv:
            # V_c0 = S_c(theta_0) - S_hat_0 on every client, so V = sum_c w_c V_c0 = 0.
            cv_msg = {"seed": seed, "round": k, **pack("S_hat", new_state.S_hat.to_dict())}
            if g.batched:
                self.runtime.call_batched("cv_init", np.arange(len(self.cids)), cv_msg)
            else:
                self.runtime.broadcast(self.cids, "cv_init", cv_msg)
            bytes_down += message_nbytes(cv_msg) * len(self.cids)
        change = stat_change(self.state.S_hat, new_state.S_hat, gamma)
        self.state, self.params = new_state, new_params
        objective = g.obj_sum / g.obj_n if g.obj_n else float("nan")
        epsilon = None
        if self.budget is not None:  # the round's release, whoever took part
            objective = float("nan")  # withheld by the clients: not covered by the noise
            epsilon = self.budget.spend(1)[0]
        self.history.append(
            RoundRecord(
                round=k,
                objective=objective,
                h_norm2=h2,
                bytes_up=int(bytes_up),
                bytes_down=int(bytes_down),
                participants=g.participants,
                step_size=gamma,
                seconds=time.perf_counter() - t0,
                missing=missing,
                rejected=rejected,
                errors=errors,
                epsilon=epsilon,
                stat_change=change,
            )
        )
        if not self.fed.is_plain_em:
            return self.settled()
        return (
            len(self.history) >= 2
            and converged_ok
            and abs(self.history[-1].objective - self.history[-2].objective) < self.opt.tol
        )

    def settled(self) -> bool:
        """The stopping rule of a federation that is not plain EM (see :class:`LoopOptions`):
        ``stat_change < tol`` in each of the last :func:`window_size` rounds, each with
        participants and none missing or refused; never under differential privacy."""
        w = window_size(self.fed.participation)
        recent = self.history[-w:]
        if self.budget is not None or self.opt.tol <= 0 or len(recent) < w:
            return False
        return all(r.stat_change is not None and r.stat_change < self.opt.tol
                   and r.participants > 0 and not r.missing and not r.rejected
                   for r in recent)

    def gather(self, k, msg, shapes, init_round, gamma, p, alpha, raw_bytes, quant_bytes):
        """Round ``k`` with the clients called one by one: their replies screened, the new
        state (before the M-step), and what to do once it is accepted."""
        seed = int(self.opt.seed)
        active = select_active(self.cids, p, seed, k, init_round)
        msgs = {c: msg for c in active}
        bytes_down = message_nbytes(msg) * len(active)
        # a client whose last reply was refused goes back to its mirrored V_c
        for c in [c for c in active if c in self.screen.resync] if self.screen.resync else ():
            reset = self.screen.resync_message(c)
            if reset:
                msgs[c] = {**msg, **reset}
                bytes_down += message_nbytes(reset)
        replies = self.runtime.call(active, "estep", msgs) if active else {}
        got, parsed, missing, rejected, errors, obj_sum, obj_n = self.screen_replies(
            k, active, replies, shapes, msg)
        bytes_up = (raw_bytes if init_round else quant_bytes) * len(parsed)
        if init_round:
            self.refuse_incomplete_init(k, {**{c: errors.get(c, "no reply") for c in missing},
                                            **rejected})
            new_state = self.state.after_init(got, self.weights, self.use_cv)
        else:
            new_state = self.state.after_round(got, self.weights, gamma, p, alpha)

        def after(S_hat_new):
            self.screen.after_round(init_round, active, parsed, errors, S_hat_new, alpha,
                                    rejected)

        def dominant():
            ids = list(got)
            return dominant_client(ids, np.array([got[c].flatten() for c in ids]),
                                   np.array([self.weights[c] for c in ids])) if ids else None

        return Gathered(new_state, missing, rejected, errors, obj_sum, obj_n, len(got),
                        bytes_down, bytes_up, after, False, dominant=dominant)

    def gather_batched(self, k, msg, init_round, gamma, p, alpha, raw_bytes, quant_bytes):
        """Round ``k`` with every client's step computed at once (None: the model has no
        batched step for these settings; the run goes on with clients one by one)."""
        try:
            return self.bserver.gather(k, msg, init_round, gamma, p, alpha, raw_bytes,
                                       quant_bytes)
        except NotImplementedError as err:
            logger.info("round %d: no batched client step (%s); clients one by one", k, err)
            self.screen.mirror, self.screen.resync = self.bserver.dump_mirror()
            self.bserver = None
            return None

    def refuse_incomplete_init(self, k: int, why: dict[str, str]) -> None:
        if why:
            raise FederatedFitError(
                f"clients [{name_list(why)}] did not answer the initialization round validly "
                f"(every client must): {fault_detail(why)}", self.params, k, faults=why)

    def judge(self, k: int, c: str, rep, shapes, mode: str, S_hat, what: str | None = None):
        """``(Q, reason)`` for client ``c``'s reply ``rep`` in round ``k``: its checked blocks
        (None when malformed: refused like a lie, nothing of it used) and why it must not be
        aggregated (None: it may). With ``on_invalid="raise"`` a reason stops the run, naming
        the client, ``what`` it sent and the round."""
        try:
            Q = check_reply(c, rep, shapes)
        except ClientReplyError as err:
            Q, reason, sent = None, err.reason, "an invalid reply"
        else:
            reason = self.screen.problem(c, Q, rep, mode, S_hat)
            sent = "statistics that cannot be true"
        if reason and self.fed.on_invalid == "raise":
            raise FederatedFitError(
                f"round {k}: client {c!r} sent {what or sent}: {reason}"
                f"; stopped (on_invalid='raise'), kept the parameters of round {k - 1}",
                self.params, k)
        return Q, reason

    def screen_replies(self, k: int, active: list[str], replies, shapes, msg):
        """Sort round ``k``'s replies before anything is aggregated: ``got`` (aggregated),
        ``parsed`` (well formed, aggregated or not), ``missing`` (no reply, or the client
        raised: ``errors`` has its exception text), ``rejected`` (client -> the invariant its
        statistics break, or why its reply is not well formed: a block missing, a wrong shape, a
        non-finite or non-numeric value; with ``on_invalid="raise"`` the first one stops the
        run, naming the client and the round)."""
        got: dict[str, Stats] = {}
        parsed: dict[str, Stats] = {}
        rejected: dict[str, str] = {}
        errors: dict[str, str] = {}
        obj_sum, obj_n = 0.0, 0
        for c in active:
            rep = replies.get(c)
            if rep is None:
                continue
            if ERROR_KEY in rep:
                errors[c] = str(rep[ERROR_KEY])
                continue
            Q, reason = self.judge(k, c, rep, shapes, str(msg.get("mode", "full")),
                                   self.state.S_hat)
            if Q is not None:
                parsed[c] = Q
            if reason:
                rejected[c] = reason
                continue
            got[c] = Q
            obj_sum += float(rep["objective"])
            obj_n += int(rep["n"])
        missing = [c for c in active if c not in replies or c in errors]
        if missing:
            logger.warning("round %d: %d client(s) [%s] did not answer; treated as absent%s", k,
                           len(missing), name_list(missing),
                           f"; {fault_detail(errors)}" if errors else "")
        if rejected:
            logger.warning("round %d: left out %s", k, fault_detail(rejected))
        return got, parsed, missing, rejected, errors, obj_sum, obj_n

    def h_norm2(self, k: int, shapes, params, S_hat, missing, rejected, errors):
        """``||h(S_hat)||^2 = ||mean_c S_c(params) - S_hat||^2`` (one evaluation pass at the
        round's new ``params = T(S_hat)``), and
        the round's ``missing``, ``rejected``, ``errors`` with the evaluation's faults added.

        Each reply is checked as an initialization reply (the client's own statistic at the
        new parameters: the model's invariants, the units it set up); a client that raised,
        did not answer, or whose reply is refused is left out of the mean (the weights of the
        others renormalized; NaN when none is left) and recorded, its reason prefixed with
        ``evaluate:``; with ``on_invalid="raise"`` a refused reply stops the run."""
        ev = self.runtime.broadcast(
            self.cids, "evaluate", {"seed": int(self.opt.seed), "round": k,
                                    **pack("params", params)}
        )
        missing, rejected, errors = list(missing), dict(rejected), dict(errors)
        mean = S_hat.zeros_like()
        total, left_out = 0.0, False
        for c in self.cids:
            rep = ev.get(c)
            if rep is None or ERROR_KEY in rep:
                if rep is not None:
                    errors[c] = "; ".join(filter(None, (errors.get(c),
                                                        f"evaluate: {rep[ERROR_KEY]}")))
                if c not in missing:
                    missing.append(c)
                left_out = True
                continue
            Q, reason = self.judge(k, c, rep, shapes, "full", None,
                                   "an evaluation that cannot be true")
            if reason:
                rejected[c] = "; ".join(filter(None, (rejected.get(c),
                                                      f"evaluate: {reason}")))
                left_out = True
                continue
            mean.add_(Q, self.weights[c])
            total += self.weights[c]
        if total <= 0.0:
            return float("nan"), missing, rejected, errors
        if left_out:
            mean = mean * (1.0 / total)
        return (mean - S_hat).squared_norm(), missing, rejected, errors

    # ---- the run -------------------------------------------------------------------------
    def run(self, params0: Params) -> FitResult:
        opt = self.opt
        shapes = self.model.stat_shapes(params0)
        alpha = self.fed.alpha_for(shapes)
        raw_bytes, quant_bytes = stat_bytes(self.fed, shapes)
        self.params = {k: np.asarray(v, dtype=np.float64) for k, v in params0.items()}
        self.params0 = self.params
        start_round = self.resume(shapes) if opt.resume else 1
        batched = getattr(self.runtime, "batched", None)
        if (self.secure is None and self.budget is None and batched is not None
                and batched(self.model) is not None):
            from .batched_round import BatchedServer

            self.bserver = BatchedServer(self, self.runtime)
            self.bserver.load_mirror(self.screen.mirror, self.screen.resync)
        converged = False
        bar = progress_bar(opt.max_rounds, opt.progress, opt.description)
        bar.update(start_round - 1)
        last_round = start_round - 1
        try:
            for k in range(start_round, opt.max_rounds + 1):
                if self.budget is not None and self.budget.would_exceed(1):
                    c = self.budget.calibration
                    logger.warning(
                        "round %d would spend epsilon=%.4g > budget %g: stopped before it", k,
                        c.epsilon_after(self.budget.releases + 1), c.epsilon)
                    break
                converged = self.round(k, shapes, alpha, raw_bytes, quant_bytes)
                last_round = k
                rec = self.history[-1]
                for cb in opt.callbacks or ():
                    cb(k, self.params, self.state.S_hat, rec)
                bar.update(1)
                bar.set_postfix(objective=f"{rec.objective:.5g}", clients=rec.participants)
                if opt.checkpoint is not None and k % max(1, opt.checkpoint_every) == 0:
                    self.save(k)
                if converged:
                    break
        except (ClientReplyError, FederatedFitError) as err:
            self.save(last_round)
            if isinstance(err, FederatedFitError):
                raise
            raise FederatedFitError(str(err), self.params, last_round + 1) from err
        finally:
            bar.close()
        self.save(last_round)
        if not converged and self.budget is None:
            warn_not_converged(opt.description, opt.max_rounds, opt.tol, self.fed.is_plain_em)
        return FitResult(self.params, self.state.S_hat, self.history, converged, last_round)
