"""The server half of the engine: the FedEM round loop.

Round 1 is the initialization E-step: every client computes its statistics at the initial
parameters, uncompressed, and the server sets ``S_hat`` to their weighted mean (this is EM's first
iteration); with control variates every client then sets ``V_c = S_c(theta_0) - S_hat_0``, the
initialization of the paper's convergence theorem (so the server's ``V`` starts at 0 exactly, and
the first compressed differences are small). From round 2 on, the FedEM update of
Dieuleveut, Fort, Moulines and Robin (2021), written in :mod:`fedlatent.engine.fedem.update` (the
state update); checkpoints in :mod:`fedlatent.engine.fedem.checkpoint`.
FedHLCR's smoothing ``S_t = (1 - gamma) S_{t-1} + gamma S`` is ``p = fraction``, step ``gamma``.

A round is plan -> gather -> server step -> record (:meth:`_Rounds.round`): the
:class:`~fedlatent.engine.rounds.plan.RoundPlan` of the round; one collector
(:mod:`fedlatent.engine.rounds.collectors`: one client at a time, batched, or secure) returns the
round's :class:`~fedlatent.engine.rounds.aggregate.Aggregate`; the FedEM step and the model's
M-step; the mirror of the control variates follows the accepted replies; the round's record.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedlatent.engine.contract.model import FederatedModel, Params
from fedlatent.engine.faults import FederatedFitError, ServerStepError
from fedlatent.engine.fedem.checkpoint import (
    RunIdentity,
    load_loop_checkpoint,
    save_loop_checkpoint,
)
from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.fedem.history import History, RoundRecord
from fedlatent.engine.fedem.update import FedEMState, client_weights, stat_bytes
from fedlatent.engine.protocol.messages import ClientReplyError, pack
from fedlatent.engine.protocol.runtime import Runtime
from fedlatent.engine.rounds.accelerate import accelerator_for
from fedlatent.engine.rounds.aggregate import Aggregate, round_complete
from fedlatent.engine.rounds.collectors import Batched, OneByOne
from fedlatent.engine.rounds.evaluation import h_norm2
from fedlatent.engine.rounds.newton import newton_for
from fedlatent.engine.rounds.plan import RoundPlan, make_plan
from fedlatent.engine.rounds.screen import Mirror, Screen
from fedlatent.engine.rounds.stopping import (
    AUTO_MAX_ROUNDS,
    STAT_TOL,
    accelerated_tol,
    distance_note,
    is_auto,
    near_optimum,
)
from fedlatent.engine.stats import Stats, units_number
from fedlatent.engine.warn import user_stacklevel

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
        from fedlatent.engine.errors import ConvergenceWarning

        return ConvergenceWarning
    if name == "setup_clients":  # moved to the checked protocol
        from fedlatent.engine.protocol.exchange import setup_clients

        return setup_clients
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class FitResult:
    params: Params
    S_hat: Stats
    history: History
    converged: bool
    n_rounds: int


@dataclass
class LoopOptions:
    """How a fit runs (not what it computes).

    Attributes
    ----------
    seed : int
        Seed of every random draw of the run (participation, quantization, mini-batches, models).
    max_rounds : int
        Number of rounds at most, the initialization round included.
    tol : float or "auto"
        "auto": plain EM stops once every parameter is within 0.1 standard error of the
        optimum (Aitken's estimate of the log-likelihood's distance to its limit,
        :mod:`fedlatent.engine.rounds.stopping`); other federations use ``stat_change`` below
        :data:`~fedlatent.engine.rounds.stopping.STAT_TOL`. A number: plain EM
        (:attr:`Federation.is_plain_em`) converges when the mean per-unit objective
        changes by less than ``tol`` between two rounds. Any other federation (partial
        participation, a step size, compression, mini-batches), where each round's objective
        is computed on that round's participants only: convergence when the server statistic
        has settled, i.e. ``history_["stat_change"]`` (its relative change per unit step, see
        :class:`~fedlatent.engine.fedem.history.RoundRecord`) stayed below ``tol`` in each of the
        last ``max(2, ceil(1 / participation))`` rounds, every one with at least one participant and
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
    tol: float | str = 1e-3
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
#: on 1e5 records loses 0.95% of held-out log-likelihood with 3 rounds, 31% with 100). An
#: estimator plans the rounds its own private start needs instead
#: (``FederatedEstimator._private_max_rounds``: the GMM 2, FedGMM 5)
PRIVATE_MAX_ROUNDS = 3


def resolve_max_rounds(max_rounds: int | None, private: bool,
                       private_rounds: int = PRIVATE_MAX_ROUNDS, tol=None) -> int:
    """An estimator's ``max_rounds``: as given, or when None, ``private_rounds`` (default
    :data:`PRIVATE_MAX_ROUNDS`) under differential privacy and :data:`DEFAULT_MAX_ROUNDS`
    otherwise (:data:`~fedlatent.engine.rounds.stopping.AUTO_MAX_ROUNDS` with
    ``tol="auto"``)."""
    if max_rounds is not None:
        return int(max_rounds)
    if private:
        return int(private_rounds)
    return AUTO_MAX_ROUNDS if is_auto(tol) else DEFAULT_MAX_ROUNDS


def progress_bar(total: int, enabled: bool | None, desc: str):
    from tqdm.auto import tqdm

    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, disable=not enabled, desc=desc, leave=False)


def warn_not_converged(description: str, max_rounds: int, tol: float | str,
                       plain: bool = True, detail: str | None = None) -> None:
    from fedlatent.engine.errors import ConvergenceWarning

    what = ("the mean objective still changed" if plain else
            "the server statistic still moved (history_['stat_change'])")
    what = detail or f"{what} by more than tol={tol}"
    warnings.warn(
        f"{description}: did not converge in {max_rounds} rounds ({what}); raise max_rounds "
        "or tol",
        ConvergenceWarning,
        stacklevel=user_stacklevel(),
    )


def _norm(v: np.ndarray) -> float:
    """The Euclidean norm of ``v``; where its square overflows (sums of squares of values near
    1e100, which the data checks accept), the norm of ``v`` scaled by its largest entry."""
    with np.errstate(over="ignore"):
        n = float(np.linalg.norm(v))
    if math.isinf(n) and np.all(np.isfinite(v)):
        m = float(np.max(np.abs(v)))
        n = m * float(np.linalg.norm(np.asarray(v) / m))
    return n


def _complete(rec: RoundRecord) -> bool:
    """:func:`~fedlatent.engine.rounds.aggregate.round_complete` of a round's record."""
    return round_complete(rec.missing, rec.errors or {}, rec.rejected)


def stat_change(old: Stats | None, new: Stats, gamma: float) -> float | None:
    """The relative change of the server statistic in one round, per unit step (None without a
    previous statistic): ``max_b ||new[b] - old[b]|| / (gamma max(||new[b]||, 1e-8 m))`` over
    the blocks ``b``, ``m`` the largest block norm (a block that is zero by construction, such
    as sums about their own centre, is measured against the others' scale)."""
    if old is None or gamma <= 0.0:
        return None
    norms = {b: _norm(v) for b, v in new.items()}
    floor = 1e-8 * max(norms.values(), default=0.0)
    worst = 0.0
    for b, v in new.items():
        diff = _norm(v - old[b])
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

    ``secure`` is the fit's :class:`~fedlatent.engine.secagg.secure.SecureChannel` (set up by the
    estimator); with ``Federation(secure_aggregation=True)`` and none given, one is set up
    here. ``privacy`` is the fit's :class:`~fedlatent.engine.privacy.PrivacyBudget` (its
    initialization releases spent); under ``Federation(privacy=...)`` with none given, one is
    planned here for ``max_rounds`` rounds (:func:`~fedlatent.engine.rounds.fitsetup.setup_fit`)."""
    federation.validate()
    if options.max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {options.max_rounds}")
    if federation.privacy is not None and privacy is None and n_units is not None:
        raise ValueError("under Federation(privacy=...) the clients must be set up with "
                         "the fit's plan: pass the PrivacyBudget the setup used")
    if n_units is None:
        from fedlatent.engine.rounds.fitsetup import setup_fit

        setup = setup_fit(runtime, model, federation, options.max_rounds, privacy=privacy,
                          open_secure=secure is None)
        n_units, privacy, secure = setup.n_units, setup.privacy, secure or setup.secure
        runtime = setup.runtime  # (the sites taking part)
    if federation.secure_aggregation and secure is None:
        from fedlatent.engine.secagg.secure import open_channel

        secure = open_channel(runtime, federation, n_units, options.max_rounds)
    if secure is not None:
        secure.runtime = runtime  # the runtime this loop is given (a wrapper, say)
    return _Rounds(model, runtime, federation, options, n_units, secure, privacy).run(params0)


class _Rounds:
    """One run of the loop: the server's state between rounds and the round itself
    (plan -> gather -> server step -> record)."""

    def __init__(self, model, runtime, federation, options: LoopOptions, n_units,
                 secure=None, budget=None):
        self.model, self.runtime, self.fed, self.opt = model, runtime, federation, options
        self.cids = runtime.client_ids
        self.n_total = float(sum(n_units.values()))
        self.weights = client_weights(federation, {c: n_units[c] for c in self.cids})
        self.w = np.array([self.weights[c] for c in self.cids])
        self.use_cv = bool(federation.control_variates)
        self.screen = Screen(model, dict(n_units), federation, self.cids)
        self.mirror = Mirror(self.cids, self.use_cv and federation.quantizer is None)
        self.state = FedEMState()
        self.history = History()
        self.params: Params = {}
        self.secure = secure  # the SecureChannel under secure aggregation
        self.budget = budget  # the PrivacyBudget under differential privacy
        self.collector = OneByOne(self)
        self.shapes: dict = {}
        # the ServerAccelerator (rounds/accelerate.py) under Federation(acceleration=...)
        self.auto = is_auto(options.tol)  # tol="auto": the rule of rounds/stopping.py
        self.tol = accelerated_tol(self.n_total) if self.auto else float(options.tol)
        self.accel = accelerator_for(model, federation, self.n_total, lambda: self.params) \
            or newton_for(model, federation, self.n_total, lambda: self.params, self.tol)

    # ---- checkpoints ---------------------------------------------------------------------
    def save(self, round_: int) -> None:
        if self.opt.checkpoint is None:
            return
        save_loop_checkpoint(self.opt.checkpoint, params=self.params, state=self.state,
                             history=self.history,
                             client_states=self.runtime.get_client_states(),
                             identity=self.identity(), round_=round_, params0=self.params0,
                             mirror=self.mirror.checkpointed())

    def identity(self) -> RunIdentity:
        """What a checkpoint of this run must match to be resumed."""
        return RunIdentity(self.model.name, self.model.get_config(), self.fed.to_config(),
                           int(self.opt.seed),
                           {c: units_number(self.screen.n_units[c]) for c in self.cids})

    def resume(self, shapes) -> int:
        """Load the checkpoint (refused, saying what differs, unless it is of this very run);
        returns the round to continue from."""
        if self.opt.checkpoint is None:
            raise ValueError("resume=True needs checkpoint=PATH")
        params, S_hat, V, records, states, round_, mirror = load_loop_checkpoint(
            self.opt.checkpoint, self.identity(), self.params0, shapes,
            self.runtime.get_client_states())
        if mirror is not None:
            self.mirror.load(*mirror)
        self.params = params
        self.state = FedEMState(S_hat, V)
        self.history = History.from_records(records)
        if self.budget is not None:  # the rounds already run were releases too
            self.budget.releases += len(self.history)
        if states:
            self.runtime.set_client_states(states)
        return round_ + 1

    def choose_collector(self) -> None:
        """Secure aggregation: the secure collector; a runtime with a batched client step for
        this model (and no differential privacy): the batched one; else one by one."""
        batched = getattr(self.runtime, "batched", None)
        if self.secure is not None:
            from fedlatent.engine.rounds.secure_round import SecureCollector

            self.collector = SecureCollector(self)
        elif self.budget is None and batched is not None and batched(self.model) is not None:
            self.collector = Batched(self)

    # ---- one round -----------------------------------------------------------------------
    def plan(self, k: int) -> RoundPlan:
        points = () if self.accel is None else self.accel.points(self.model, self.params,
                                                                 self.n_total)
        fields = getattr(self.accel, "client_fields", None)  # the clients' states' path
        return make_plan(self.fed, k, int(self.opt.seed), self.state, self.params,
                         len(self.cids), self.shapes, self.alpha, self.sizes, points,
                         None if fields is None else fields([x for x, _ in points], k))

    def gather(self, plan: RoundPlan) -> Aggregate:
        """The round's aggregate from the collector (a batched collector that finds no batched
        step for these settings hands over to the clients one by one)."""
        if self.budget is not None:
            self.screen.set_privacy(self.fed.privacy, self.budget.calibration.noise_multiplier,
                                    self.params, None if self.secure is None
                                    else self.secure.config.threshold)
        try:
            return self.collector.gather(plan)
        except NotImplementedError as err:
            if not isinstance(self.collector, Batched):
                raise
            logger.info("round %d: no batched client step (%s); clients one by one", plan.k,
                        err)
            self.collector = OneByOne(self)
            return self.collector.gather(plan)

    def round(self, k: int) -> bool:
        """Run round ``k``: plan -> gather -> server step -> record; returns whether it
        converged."""
        t0 = time.perf_counter()
        plan = self.plan(k)
        agg = self.gather(plan)
        if agg.skipped:  # nothing crossed: state, parameters and privacy budget unchanged
            if self.accel is not None:
                self.accel.reset()
            self.history.append(RoundRecord(
                round=k, objective=float("nan"), h_norm2=None, bytes_up=0, bytes_down=0,
                participants=0, step_size=0.0, seconds=time.perf_counter() - t0,
                missing=agg.missing, errors=agg.errors, skipped=agg.skipped,
                epsilon=None if self.budget is None else self.budget.spent[0]))
            return False
        new_state = self.state.advance(agg.total, plan.init_round, plan.gamma, plan.p,
                                       plan.alpha, self.use_cv)
        plain = new_state  # F(S_hat); accelerated EM may send another statistic next
        if self.accel is not None and not plan.init_round:
            new_state = self.accel.state_after(self.state, plain, agg, plan)
        new_params = self.server_step(k, new_state.S_hat, agg)
        if agg.accepted is not None:
            self.mirror.follow(plan.init_round, agg.accepted, new_state.S_hat, plan.alpha)
        h2, missing, rejected, errors = None, agg.missing, agg.rejected, agg.errors
        if self.fed.track_h:
            h2, missing, rejected, errors = h_norm2(self, k, new_params, new_state.S_hat,
                                                    missing, rejected, errors)
        bytes_down = agg.bytes_down
        if plan.init_round and self.use_cv and k < self.opt.max_rounds:
            # V_c0 = S_c(theta_0) - S_hat_0 on every client, so V = sum_c w_c V_c0 = 0 (not
            # sent when no round follows: on a deployment each exchange costs seconds)
            bytes_down += self.collector.init_control_variates(
                {"seed": plan.seed, "round": k, **pack("S_hat", new_state.S_hat.to_dict())})
        change = stat_change(self.state.S_hat, new_state.S_hat, plan.gamma)
        self.state, self.params = new_state, new_params
        self.record(plan, agg, t0, h_norm2=h2, missing=missing, rejected=rejected, errors=errors,
                    bytes_down=bytes_down, stat_change=change)
        done = self.converged(round_complete(missing, errors, rejected),
                              bool(missing or rejected))
        end = None if self.accel is None or not (done or k >= self.opt.max_rounds) \
            else self.accel.final(new_state, plain)
        if end is not None:  # the state an accelerated fit ends on (an evaluated one)
            self.state, self.params = end, self.server_step(k, end.S_hat, agg)
        return done

    def server_step(self, k: int, S_hat: Stats, agg: Aggregate) -> Params:
        """``T(S_hat)``; a non-finite statistic or a failing M-step stops the run naming the
        round (and the client that dominates the aggregate, if one does)."""
        who = (lambda: f"; {agg.dominant()}" if agg.dominant() else "")
        if not S_hat.all_finite():
            raise FederatedFitError(
                f"round {k}: the aggregated statistic is not finite{who()}; kept the parameters "
                f"of round {k - 1}", self.params, k)
        try:
            new_params = self.model.server_step(S_hat, self.params, self.n_total)
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
                f"{k - 1}", self.params, k)
        return new_params

    def record(self, plan: RoundPlan, agg: Aggregate, t0: float, **fields) -> None:
        """Append the round's :class:`RoundRecord` (under differential privacy the round is a
        release, whoever took part, and the objective is withheld)."""
        objective = agg.objective_sum / agg.units if agg.units else float("nan")
        epsilon = None
        if self.budget is not None:  # the round's release, whoever took part
            objective = float("nan")  # withheld by the clients: not covered by the noise
            epsilon = self.budget.spend(1)[0]
        self.history.append(RoundRecord(
            round=plan.k, objective=objective, bytes_up=int(agg.bytes_up),
            participants=agg.participants, step_size=plan.gamma,
            seconds=time.perf_counter() - t0, epsilon=epsilon, **fields))

    def converged(self, complete: bool, restarted: bool = False) -> bool:
        """Plain EM: the mean objective changed by less than ``tol`` (a round with every
        reply of the clients still in the fit; accelerated, a round sent the EM step of the
        round before, as scikit-learn tests one EM iteration's change, or the plain rule when
        a missing reply restarted the accelerator: after an exclusion every round sends the
        EM step); any other federation: :meth:`settled`."""
        if not self.fed.is_plain_em:
            return self.settled()
        rule = None if self.accel is None or restarted else self.accel.may_stop(complete)
        if rule is not None:  # accelerated: the accelerator's form of scikit-learn's test
            return rule
        if self.auto:  # within 0.1 standard error of the optimum (rounds/stopping.py)
            recent = self.history[-4:]
            return (len(recent) >= 3 and all(_complete(r) for r in recent)
                    and near_optimum([r.objective for r in recent], self.n_total))
        return (len(self.history) >= 2 and complete
                and abs(self.history[-1].objective - self.history[-2].objective) < self.tol)

    def settled(self) -> bool:
        """The stopping rule of a federation that is not plain EM (see :class:`LoopOptions`):
        ``stat_change < tol`` in each of the last :func:`window_size` rounds, each with
        participants and none missing or refused; never under differential privacy."""
        w = window_size(self.fed.participation)
        recent = self.history[-w:]
        tol = STAT_TOL if self.auto else self.tol
        if self.budget is not None or tol <= 0 or len(recent) < w:
            return False
        return all(r.stat_change is not None and r.stat_change < tol
                   and r.participants > 0 and _complete(r) for r in recent)

    # ---- the run -------------------------------------------------------------------------
    def start(self, params0: Params) -> int:
        """The run's constants, its collector, and the round to start from (a resumed run's
        next)."""
        self.shapes = self.model.stat_shapes(params0)
        self.alpha = self.fed.alpha_for(self.shapes)
        self.sizes = stat_bytes(self.fed, self.shapes)
        self.params = {k: np.asarray(v, dtype=np.float64) for k, v in params0.items()}
        self.params0 = self.params
        if self.opt.resume and self.accel is not None:
            raise ValueError("resume=True is not available with Federation(acceleration=...): "
                             "the accelerator's state is not checkpointed, so the resumed run "
                             "would not be the uninterrupted one; use acceleration=None")
        if self.opt.resume and self.secure is not None and self.secure.verify:
            raise ValueError("resume=True is not available with verified rounds (the default "
                             "under secure aggregation): each site checks a round against the "
                             "transcript of the exchange before, and a resumed run's new key "
                             "set-up cannot show the last round's; fit again from the start, "
                             "or resume a fit run with verification turned off")
        start_round = self.resume(self.shapes) if self.opt.resume else 1
        self.choose_collector()
        return start_round

    def out_of_budget(self, k: int) -> bool:
        """Whether round ``k`` would spend more than the privacy budget (logged)."""
        if self.budget is None or not self.budget.would_exceed(1):
            return False
        c = self.budget.calibration
        logger.warning("round %d would spend epsilon=%.4g > budget %g: stopped before it", k,
                       c.epsilon_after(self.budget.releases + 1), c.epsilon)
        return True

    def run(self, params0: Params) -> FitResult:
        opt = self.opt
        start_round = self.start(params0)
        converged = False
        bar = progress_bar(opt.max_rounds, opt.progress, opt.description)
        bar.update(start_round - 1)
        last_round = start_round - 1
        try:
            for k in range(start_round, opt.max_rounds + 1):
                if self.out_of_budget(k):
                    break
                converged = self.round(k)
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
            warn_not_converged(opt.description, opt.max_rounds, opt.tol, self.fed.is_plain_em,
                               distance_note([r.objective for r in self.history], self.n_total)
                               if self.auto and self.fed.is_plain_em else None)
        return FitResult(self.params, self.state.S_hat, self.history, converged, last_round)
