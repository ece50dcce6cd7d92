"""``Federation(acceleration=...)``: the settings of accelerated EM and when they apply.

The algorithm is in :mod:`fedlatent.engine.rounds.accelerate`; this module holds only what a
:class:`~fedlatent.engine.fedem.federation.Federation` validates and records (it imports nothing
from the engine, so the federation settings stay a leaf of the import graph).

Why SQUAREM (Varadhan and Roland 2008) rather than damped Anderson acceleration (DAAREM,
Henderson and Varadhan 2019): SQUAREM needs the last three points of the EM map and one scalar
step length, so the server keeps three statistics whatever the model's size and every
extrapolation is a line in the statistic space that the model's invariants can be checked on
(and backtracked along for free); DAAREM keeps a window of ``m`` past statistics and
residuals, solves a damped least-squares problem per round and needs its damping schedule
and restarts tuned. In a federation the costly thing is the round, not the server's
arithmetic, and both methods use one EM evaluation (one round) per map call.

Measured (2026-11-26, ``benchmarks/rounds_to_tol.py``'s GMM, 8 seeds, same start as
scikit-learn): DAAREM (m = 10, kappa = 25, one plain EM step after each restart so that its fits
stop by the same EM-step rule) needed a median 0.70 of scikit-learn's iterations, SQUAREM 0.43;
DAAREM's apparent wins without that rule (0.14 to 0.27) were fits stopped early on a stalled
step, up to 5.9e-3 below scikit-learn's log-likelihood. Step-bound variants of SQUAREM (R's
SQUAREM schedule, shrinking the bound to 3/4 of a refused step, keeping the chain after a
refusal) moved the median by at most 0.05, within the spread between seeds.

Why SQUAREM stays near half of scikit-learn's iterations, and what would reach a third
(2026-11-26, ``benchmarks/accel_variants.py``: a centralized prototype that counts rounds on
``rounds_to_tol.py``'s data, 8 seeds, scikit-learn's stopping rule on the accepted path): each
extrapolation needs ``F(F(x))``, two rounds in sequence. Rounds that carry several points (each
client returns its statistic and objective at each; sums, so secure aggregation still applies)
remove the round a refusal costs but not that one: SQUAREM trying three step lengths and the
plain point in its extrapolation round, 0.41 (GMM, same start) and 0.49 (scikit-learn's k-means
start) against 0.47 and 0.48. Newton on ``h(s) = F(s) - s`` in the span of the last steps takes
one round per step: with the EM map's Jacobian along that span read from the round's own points
(secants between the proposal, the over-relaxed ``x + 3 h(x)`` and the plain ``F(x)``: 3 points
a round) 0.30 and 0.29, LCR 0.33, LCA 0.24 (SQUAREM 0.35, 0.28); with finite differences (7
points) 0.26, 0.28, 0.28, 0.21. Over 16 seeds (``--seeds 16``) the 3-point variant sits at the
target, not below it: 0.32, 0.34, LCR 0.35 (7 points: 0.29, 0.30, 0.31; SQUAREM 0.50, 0.53,
0.38); fits of under 15 iterations keep a floor of 6 to 9 rounds. Each point is a release,
so the saturation rule counts 3 (7) statistics a reply: 252 (588) free numbers for this GMM,
where its smallest clients (161 to 182 rows of 5 values) allow 266 to 300.

Built (2026-11-26, sixth session): :class:`SubspaceNewton` (``acceleration="newton"``,
:mod:`fedlatent.engine.rounds.newton`) over rounds that carry several points
(``RoundPlan.points``, ``Aggregate.points``). Its subspace also keeps the secant pairs of the
last two rounds (``memory=2``; a pair within ``drop`` of the newer ones' span left out),
Anderson-type memory at no extra point: in the prototype (B'') 0.28, 0.30, LCR 0.28, LCA 0.22
over 8 seeds, 0.30, 0.32, LCR 0.30 over 16 (B' 0.32, 0.34, 0.35); keeping one round's pairs,
over-relaxation factors 2, 2.5 and 4, or a tighter ``drop`` moved the medians by at most 0.03
either way, within the spread between seeds. Through the engine (``rounds_to_tol.py``, tol
1e-6, 20 clients), rounds / scikit-learn's iterations from the same start: GMM median 0.30
(0.25-0.52) over 8 seeds, 0.32 (0.16-0.52) over 16, a log-likelihood at least scikit-learn's
in 8 of 8 and 15 of 16 (SQUAREM 0.43 and 0.49); LCR 0.28 (0.18-0.41) and 0.30 (0.18-0.74)
of flexmix-style EM's iterations, at least its log-likelihood in 7 of 8 and 14 of 16 (a stop
on a plateau: seed 0 ends 3.0e-5 below); LCA 0.26 and 0.21 of plain EM's rounds (SQUAREM
0.34 and 0.29). The engine's GMM statistics are moments about a fixed centre: Newton's
least-squares step is not invariant under that shift, which accounts for the engine's GMM
rounds differing from the prototype's on the same data (both medians sit near 0.30).
FedGMM (2026-11-26, seventh session): its clients keep a state (their own mixing weights
``pi_c``) that every E-step advances, so the fit's state is ``z = (s, pi_1 .. pi_C)`` and the
EM map acts on ``z``. Every point Newton sends is an affine combination of evaluations: the
plain ``F(a)``, the over-relaxed ``F(a) + (w - 1) (F(a) - a)`` and the proposal
``F(a) + J U c = F(a) + G beta`` (``beta = R^{-1} c`` over the kept secant columns), each
halved towards ``F(a)``. The server sends these coefficients with each extra point (public
arithmetic on the sums it holds: nothing new leaves a site, a reply is as long as before and
the saturation rule counts the same statistics) and each client forms the same combination of
the states it kept (each point's input and output for the rounds the server's memory still
names: :mod:`fedlatent.engine.node.pointstate`), put back in the domain by the model's
``project_point_state``; a message naming a state the client does not keep is refused (a
deviating server). FedGMM keeps each extrapolated weight at least 0.9 of the one it holds, and
renormalizes: a floor of 1e-10 set weights near 0, where EM moves them back only slowly, and
the fits stalled early (median 0.43 of plain EM's rounds, 3 of 8 seeds at its
log-likelihood); a floor of 0.1, 0.5, 0.75 of the weight held: 5, 5, 6 of 8. Its candidates
are compared by the objective minus the learners' ridge (``objective_penalty``: the M-step
maximizes the penalized log-likelihood; compared by the log-likelihood alone the proposals
gained by growing coefficients that the next M-step took back, the path falling back by up to
9e-3 a round). Measured (``rounds_to_tol.py``'s FedGMM rows, tol 1e-6, disclosure rules off:
under the default rules these 150-row sites refuse a reply of two statistics and Newton falls
back to plain rounds): median 0.48 (0.31-0.55) of plain EM's rounds over seeds 0-7, at least
plain EM's log-likelihood (to 1e-6 relative) in 7 of 8 (seed 5 ends 4.0e-5 below); seeds
8-15: 0.52 (0.38-0.72), 7 of 8 (seed 10: 1.3e-6 below). The least-squares step sees the
statistic's residual only, not the clients' own (their weights' EM steps), which set FedGMM's
slow tail: adding them would need each client's Gram contributions in its reply, new numbers
leaving a site; not done. The version that only made the clients adopt the accepted point's
state (their weights moving one EM step a round) took 0.84.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar

__all__ = ["Squarem", "SubspaceNewton", "acceleration_config", "acceleration_problems",
           "resolve_acceleration"]


@dataclass(frozen=True)
class Squarem:
    """SQUAREM with the S3 step length (Varadhan and Roland 2008), acting on the server's
    statistic ``S_hat`` (the EM map ``F(S) = sum_c w_c S_c(T(S))`` is one round).

    From ``s0``, ``s1 = F(s0)``, ``s2 = F(s1)`` (two rounds): ``r = s1 - s0``,
    ``v = s2 - 2 s1 + s0``, step ``a = ||r|| / ||v||`` clamped to ``[1, step_max]``, and the
    next round is sent ``s' = s0 + 2 a r + a^2 v`` (``a = 1`` gives ``s2``, plain EM). ``s'``
    must lie in the model's domain (the invariants a client's statistic obeys: counts in
    ``[0, n]``, positive semi-definite moments, a finite M-step); if not, ``a`` is halved
    towards 1 (server arithmetic only, no round), and after ``backtracks`` tries the plain
    ``s2`` is sent. The round at ``s'`` reports the objective there: if it is below the
    objective at ``s1`` (the safeguard), that round's statistics are discarded and ``s2`` is
    sent next; else ``s'`` starts the next cycle (two rounds per cycle). ``step_max`` is
    multiplied by ``mstep`` when the step reached it and divided by it (not below
    ``step_max0``) after a rejection, as in the paper's SqS3 scheme.

    Parameters
    ----------
    step_max0 : float, default 4.0
        The largest step at the start (the paper's default is 1; 4 spares the first cycle,
        and the safeguard catches a bad start at the cost of one round).
    mstep : float, default 4.0
        Factor by which ``step_max`` grows and shrinks.
    backtracks : int, default 4
        Halvings of the step towards 1 when the extrapolated statistic leaves the domain.
    """

    step_max0: float = 4.0
    mstep: float = 4.0
    backtracks: int = 4

    def __post_init__(self) -> None:
        if not (isinstance(self.step_max0, int | float) and math.isfinite(self.step_max0)
                and self.step_max0 >= 1.0):
            raise ValueError(f"Squarem(step_max0=...) must be a number >= 1, got "
                             f"{self.step_max0!r}")
        if not (isinstance(self.mstep, int | float) and math.isfinite(self.mstep)
                and self.mstep > 1.0):
            raise ValueError(f"Squarem(mstep=...) must be a number > 1, got {self.mstep!r}")
        if not isinstance(self.backtracks, int) or isinstance(self.backtracks, bool) \
                or self.backtracks < 0:
            raise ValueError(f"Squarem(backtracks=...) must be an integer >= 0, got "
                             f"{self.backtracks!r}")


@dataclass(frozen=True)
class SubspaceNewton:
    """Newton on ``h(s) = F(s) - s`` in a small subspace, three points a round (the engine's
    :mod:`~fedlatent.engine.rounds.newton`; ``benchmarks/accel_variants.py``'s B'').

    Each round evaluates, beside its statistic (the plain point ``F(a)`` of the accepted
    point ``a``), two extra points: the Newton proposal and the over-relaxed
    ``a + over * h(a)``. The round keeps the best of the three by objective as the next ``a``
    (the plain point's objective is at least ``a``'s, EM's monotonicity, so the accepted path
    never goes down). The subspace is spanned by the secants of the round (each extra point
    minus the plain point) and those of the last ``memory`` rounds, whose ``F`` differences
    give the EM map's Jacobian along it; the proposal solves the linearized ``h = 0`` there
    (least squares). A point outside the model's domain is halved towards ``F(a)`` at most
    ``backtracks`` times, then dropped.

    Parameters
    ----------
    over : float, default 3.0
        The over-relaxation factor ``c`` of the extra point ``a + c h(a)`` (> 1).
    memory : int, default 2
        Earlier rounds whose secant pairs stay in the subspace (0: the round's own only).
    drop : float, default 0.1
        An older secant whose part outside the span of the newer ones is below this fraction
        of its length is dropped (in (0, 1)): it would make the Jacobian's estimate
        ill-conditioned.
    backtracks : int, default 6
        Halvings of an extra point towards ``F(a)`` while it leaves the domain.
    """

    over: float = 3.0
    memory: int = 2
    drop: float = 0.1
    backtracks: int = 6
    #: extra points a round at most (the Newton proposal and the over-relaxed point): a reply
    #: carries ``1 + extra_points`` statistics, what the saturation rule counts
    extra_points: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if not (isinstance(self.over, int | float) and math.isfinite(self.over)
                and self.over > 1.0):
            raise ValueError(f"SubspaceNewton(over=...) must be a number > 1, got {self.over!r}")
        for name in ("memory", "backtracks"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"SubspaceNewton({name}=...) must be an integer >= 0, got "
                                 f"{v!r}")
        if not (isinstance(self.drop, int | float) and 0.0 < self.drop < 1.0):
            raise ValueError(f"SubspaceNewton(drop=...) must be in (0, 1), got {self.drop!r}")
        if self.memory > MAX_MEMORY:
            raise ValueError(f"SubspaceNewton(memory=...) must be at most {MAX_MEMORY} (a "
                             f"client keeps the states of at most {MAX_MEMORY + 1} rounds), got "
                             f"{self.memory!r}")


#: the largest ``SubspaceNewton(memory=...)``: clients keep point states of ``memory + 1``
#: rounds and refuse a history of more than 16 (``engine/node/pointstate.py``'s MAX_HISTORY)
MAX_MEMORY = 15


def resolve_acceleration(value) -> Squarem | SubspaceNewton | None:
    """The settings of ``Federation(acceleration=value)``: None (or "none") is off,
    "squarem" and "newton" the defaults of :class:`Squarem` and :class:`SubspaceNewton`,
    either object itself, a dict their fields (a recorded config: ``method="newton"`` for
    the latter); anything else raises ValueError."""
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        return None
    if isinstance(value, Squarem | SubspaceNewton):
        return value
    if isinstance(value, str) and value.lower() in ("squarem", "newton"):
        return Squarem() if value.lower() == "squarem" else SubspaceNewton()
    if isinstance(value, dict):
        fields = dict(value)
        if fields.pop("method", "squarem") == "newton":
            return SubspaceNewton(**fields)
        return Squarem(**fields)
    raise ValueError("Federation(acceleration=...) must be None, 'squarem' or a "
                     f"fl.Squarem(...), got {value!r} (or 'newton' or a "
                     "fl.SubspaceNewton(...) for subspace Newton)")


def acceleration_config(settings: Squarem | SubspaceNewton) -> dict:
    """The recorded form of ``settings`` (:func:`resolve_acceleration`'s inverse): SQUAREM's
    fields as before, SubspaceNewton's with ``method="newton"``."""
    d = asdict(settings)
    return {"method": "newton", **d} if isinstance(settings, SubspaceNewton) else d


def acceleration_problems(*, participation: float, step_size, quantizer, batch_size,
                          variance_reduction, privacy) -> list[str]:
    """Why accelerated EM does not apply to these federation settings (empty: it does).

    SQUAREM extrapolates from differences of successive EM maps and guards each extrapolation
    with the objective: both need the exact map. A random estimate of it (partial
    participation, quantized replies, mini-batches, SPIDER, noise) makes ``v`` a difference of
    noises, which the extrapolation multiplies by ``a^2``, and the objectives of two rounds
    then come from different clients or batches; under differential privacy the clients
    withhold the objective altogether. A step size below 1 is already a damped map.
    """
    out = []
    if float(participation) != 1.0:
        out.append(f"participation={participation!r} (each round's statistic is a random "
                   "estimate of the EM map; use participation=1.0)")
    if callable(step_size) or float(step_size) != 1.0:
        out.append(f"step_size={step_size!r} (the accelerated map is EM's; use step_size=1.0)")
    if quantizer is not None:
        out.append("quantizer=... (quantized replies are a random estimate of the EM map; "
                   "use quantizer=None)")
    if batch_size is not None or variance_reduction is not None:
        out.append("mini-batch E-steps (batch_size/variance_reduction give a random estimate "
                   "of the EM map; use full passes)")
    if privacy is not None:
        out.append("privacy=... (the clients withhold the objective the safeguard needs, and "
                   "the extrapolation would amplify the noise; use acceleration=None)")
    return out
