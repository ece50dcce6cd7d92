"""The federation settings: participation, step size, weighting, compression, variance reduction.

A :class:`Federation` is pure configuration.  The round loop in :mod:`fedlatent.engine.rounds.loop`
reads it; every model gets every setting.  Plain federated EM, FedHLCR's smoothing and naive
FedEM are settings of the same loop, not separate code:

==============================  ==================================================================
plain federated EM              ``Federation()`` (participation 1, step 1, no quantizer)
FedHLCR smoothing (Yang et al.) ``Federation(participation=f, step_size=g, control_variates=False)``
naive FedEM                     ``Federation(quantizer=Quantizer(s), control_variates=False)``
FedEM (Dieuleveut et al.)       ``Federation(participation=p, step_size=g, quantizer=Quantizer(s))``
VR-FedEM                        ``Federation(..., variance_reduction=Spider(k_in, b))``
==============================  ==================================================================

References
----------
Dieuleveut, Fort, Moulines, Robin. "Federated Expectation Maximization with heterogeneity
mitigation and variance reduction", NeurIPS 2021 (slide "FedEM with partial participation",
slide "VR-FedEM").
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from fedlatent.engine.fedem.acceleration import (
    Squarem,
    SubspaceNewton,
    acceleration_config,
    acceleration_problems,
    resolve_acceleration,
)
from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.privacy.dp import DifferentialPrivacy
from fedlatent.engine.privacy.enforce import policy_from_config, policy_to_json
from fedlatent.engine.stats import Stats

__all__ = ["Federation", "Quantizer", "Spider", "Squarem", "StepSchedule", "SubspaceNewton"]


@dataclass(frozen=True)
class Quantizer:
    """Unbiased random dithering with ``levels`` levels (QSGD, Alistarh et al. 2017).

    Each named block ``x`` of a statistic is sent as its norm, the signs and integer levels
    ``l_i in {0..s}``; the receiver reconstructs ``||x|| sign(x_i) l_i / s``.  With
    ``l_i = floor(s |x_i| / ||x||) + Bernoulli(frac)`` the result is unbiased and
    ``E||Q(x)||^2 <= (1 + omega) ||x||^2`` with ``omega = min(d / s^2, sqrt(d) / s)`` for a block
    of ``d`` numbers.  Blocks are quantized separately (their scales differ: counts, first and
    second moments), so the variance factor of a statistic is the largest over its blocks.

    Parameters
    ----------
    levels : int
        Number of levels ``s >= 1``. Fewer levels compress more and add more variance.
    """

    levels: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.levels, int | np.integer) or self.levels < 1:
            raise ValueError(f"Quantizer(levels=...) must be an integer >= 1, got {self.levels!r}")

    def omega(self, shapes: dict[str, tuple[int, ...]]) -> float:
        """Variance factor of the quantizer for statistics with these block shapes."""
        s = self.levels
        om = 0.0
        for shp in shapes.values():
            d = int(np.prod(shp)) if len(shp) else 1
            om = max(om, min(d / s**2, math.sqrt(d) / s))
        return om

    def bits_per_block(self, d: int) -> int:
        """Bits to send one block of ``d`` numbers: a float32 norm, a sign and a level each."""
        return 32 + d * (1 + math.ceil(math.log2(self.levels + 1)))

    def nbytes(self, shapes: dict[str, tuple[int, ...]]) -> int:
        bits = sum(self.bits_per_block(int(np.prod(s)) if len(s) else 1) for s in shapes.values())
        return int(math.ceil(bits / 8))

    def __call__(self, stats: Stats, rng: np.random.Generator) -> Stats:
        """Quantize every block of ``stats`` (unbiased)."""
        s = self.levels
        out = {}
        for k, x in stats.items():
            norm = float(np.linalg.norm(x))
            if norm == 0.0 or not np.isfinite(norm):
                out[k] = np.zeros_like(x) if norm == 0.0 else x.copy()
                continue
            scaled = np.abs(x) * (s / norm)
            low = np.floor(scaled)
            level = low + (rng.random(x.shape) < (scaled - low))
            out[k] = np.sign(x) * level * (norm / s)
        return Stats(out, copy=False)


@dataclass(frozen=True)
class Spider:
    """SPIDER variance reduction of the local statistics (VR-FedEM).

    Every ``inner_rounds`` rounds a client refreshes its estimate with a full pass over its
    data; in between it corrects the previous estimate with a mini-batch of ``batch_size``
    samples evaluated at the current and at the previous parameters:
    ``S_k = mean_B s_i(theta_k) + S_{k-1} - mean_B s_i(theta_{k-1})``.
    """

    inner_rounds: int = 10
    batch_size: int = 32

    def __post_init__(self) -> None:
        if int(self.inner_rounds) < 1:
            raise ValueError(f"Spider(inner_rounds=...) must be >= 1, got {self.inner_rounds!r}")
        if int(self.batch_size) < 1:
            raise ValueError(f"Spider(batch_size=...) must be >= 1, got {self.batch_size!r}")


@dataclass(frozen=True)
class StepSchedule:
    """Step size ``gamma_k = scale / (1 + (k - 1) / decay) ** power`` at round ``k >= 1``."""

    scale: float = 1.0
    decay: float = 10.0
    power: float = 0.6

    def __call__(self, k: int) -> float:
        return float(self.scale / (1.0 + (k - 1) / self.decay) ** self.power)


@dataclass(frozen=True)
class Federation:
    """How a federated fit runs: who takes part, how statistics are combined and compressed.

    Parameters
    ----------
    participation : float in (0, 1], default 1.0
        Probability ``p`` that a client takes part in a round (independent Bernoulli draws).
    step_size : float in (0, 1], or callable round -> float, default 1.0
        Stochastic-approximation step ``gamma``: ``S <- S + gamma * (estimate of h(S))``.
        1.0 with full participation and no compression is plain EM.
    client_weighting : {"samples", "uniform"}, default "samples"
        "samples" weights a client by its number of samples (the sum of statistics, as in
        centralized EM on the pooled data); "uniform" gives each client weight 1/n (the paper).
    quantizer : Quantizer or None
        Unbiased compression of what clients send.
    control_variates : bool, default True
        Keep per-client control variates ``V_c`` (FedEM). False gives "naive FedEM".
    alpha : float or None
        Control-variate step; default ``1 / (1 + omega)`` of the quantizer (1 without one).
    variance_reduction : Spider or None
        SPIDER estimator for the local statistics (VR-FedEM).
    batch_size : int or None
        Mini-batch E-steps of this many samples (without variance reduction). None: full pass.
    track_h : bool, default False
        Record ``||h(S)||^2`` every round. It needs a full pass of every client at the new
        parameters, so it doubles the computation; use it for studies, not for production.
    random_state : int or None
        Seed of participation, quantization and mini-batch draws. None: the estimator's seed.
    on_invalid : {"exclude", "raise"}, default "exclude"
        A client whose statistics break its model's invariants (negative counts, more units
        than it has, a moment matrix that is not positive semi-definite): "exclude" leaves it
        out of that round and records it in ``history_`` (column ``rejected``); "raise" stops
        the fit with an error naming the client and the reason.
    disclosure : DisclosurePolicy, default DisclosurePolicy() (on)
        What a client refuses to send: replies that are functions of too few records
        (DataSHIELD's defaults, :mod:`fedlatent.engine.privacy.disclosure`). It travels to the
        clients in the setup message and they enforce it. ``DisclosurePolicy.off()`` disables it.
    secure_aggregation : bool, default False
        The server learns only the sum of each exchange's replies (round statistics, counts,
        objectives, initialization sums), never one client's
        (:mod:`fedlatent.engine.secagg.secure`):
        keys set up once per fit, masks that cancel exactly in a fixed-point ring, dropped
        clients recovered from the survivors' secret shares. Reply checks then apply to the
        aggregate; ``track_h`` is not available.
    secagg_threshold : int or None
        Survivors needed to unmask a sum; None: ``floor(n_clients / 2) + 1``. Must lie in
        ``(n_clients / 2, n_clients]``.
    privacy : DifferentialPrivacy or None
        Record-level ``(epsilon, delta)`` differential privacy of everything the server sees
        over the whole fit, initialization included (:mod:`fedlatent.engine.privacy`): every
        client clips its data and adds Gaussian noise calibrated up front for the planned
        releases (``max_rounds`` rounds plus the initialization's); ``noise="distributed"``
        needs ``secure_aggregation=True``. The fit runs its planned rounds (no early stop on
        noisy objectives), stops before a round that would exceed the budget, and reports the
        spend in ``history_["epsilon"]`` and ``privacy_spent_``. SPIDER and ``track_h`` are
        not available under it.
    secagg_bound : float, default 2**20
        Largest magnitude of an entry a client sends under secure aggregation (a weighted
        per-unit statistic such as ``x_j x_k``); it fixes the public fixed-point scale, the
        largest power of two <= 2^40 with ``bound * scale * n_clients < 2^62``.
    acceleration : None, "squarem", "newton", Squarem or SubspaceNewton, default None
        Accelerated EM on the server's aggregated statistics, for the exact EM map only: full
        participation, step 1, no quantizer, full passes, no differential privacy (anything
        else is refused, saying why); secure aggregation and control variates keep working.
        ``"squarem"`` (:class:`~fedlatent.engine.fedem.acceleration.Squarem`, SQUAREM with a
        monotonicity safeguard): one point a round, 0.3 to 0.6 of plain EM's rounds on slowly
        converging fits (overlapping components; median 0.43 of scikit-learn's iterations).
        ``"newton"`` (:class:`~fedlatent.engine.fedem.acceleration.SubspaceNewton`): Newton
        on ``F(s) - s`` in the span of the last rounds' secants, three points a round (the
        plain EM step, the Newton proposal, an over-relaxed step; the best is kept, so the
        accepted path never goes down): median 0.30 of scikit-learn's iterations on the same
        fits (:mod:`~fedlatent.engine.fedem.acceleration` gives the measurements). Each
        extra point costs a site a full E-step and one more statistic in its reply, and each
        is a release: the saturation rule counts three statistics a reply (a 4-component,
        5-dimensional full-covariance mixture: 252 free numbers, so clients of at least 153
        rows of 5 values under the default rule); in-process a Newton round takes 2.3 to 3.2
        times a plain one. Use ``"newton"`` where rounds are what is costly (Flower, secure
        aggregation) and sites are not small; ``"squarem"`` where
        replies must stay one statistic. FedGMM's clients keep their own mixing weights:
        under ``"newton"`` each site forms the server's combination of the weights it kept
        (the coefficients come with each point; nothing more leaves it). Off by default: the default
        ``Federation()`` is exact EM, round for round the iterations of centralized EM
        (scikit-learn's, flexmix's), which the exactness tests and the comparisons in the
        documentation rely on; an accelerated fit reaches the optimum, not that path.
    on_refusal : {"exclude", "stop"}, default "exclude"
        A site that refuses the fit's setup by a disclosure rule or its own policy (too few
        records for the rules, a model or budget its policy does not allow): "exclude" leaves
        it out of the fit, with one warning naming it, the rule and the fix, and records it
        (the estimator's ``excluded_clients_``, its ``summary()`` and ``history_.excluded``);
        the others go on, as DataSHIELD drops a study and goes on. "stop" stops the fit,
        naming every refusal. A site refused later (one round's reply) is missing from that
        round only, as before.
    min_clients : int or None, default None
        The fewest sites a fit goes on with after leaving sites out; None: 2 (every site of a
        federation of fewer), and under secure aggregation at least ``secagg_threshold`` when
        it is given. Fewer stops the fit, naming the refusals.
    verified : bool or None, default None
        Verified rounds under secure aggregation: every site checks that its own reply is in
        the sum the server used (a sum tree) and replays the server's step from it, refusing
        any other parameters (:mod:`fedlatent.engine.node.verify`). None: on under secure
        aggregation whenever the sites can replay the settings (participation 1, a numeric
        step size; SQUAREM's and subspace Newton's statistics and extra points are replayed
        too), else off; True: required (other settings refused);
        False: off (the server is trusted with the parameters each site evaluates).
    """

    participation: float = 1.0
    step_size: float | Callable[[int], float] = 1.0
    client_weighting: str = "samples"
    quantizer: Quantizer | None = None
    control_variates: bool = True
    alpha: float | None = None
    variance_reduction: Spider | None = None
    batch_size: int | None = None
    track_h: bool = False
    random_state: int | None = None
    on_invalid: str = "exclude"
    disclosure: DisclosurePolicy = DisclosurePolicy()
    secure_aggregation: bool = False
    secagg_threshold: int | None = None
    secagg_bound: float = 2.0**20
    privacy: DifferentialPrivacy | None = None
    acceleration: str | Squarem | SubspaceNewton | None = None
    on_refusal: str = "exclude"
    min_clients: int | None = None
    verified: bool | None = None
    _extra: dict = field(default_factory=dict, repr=False, compare=False)

    def validate(self) -> None:
        """Check the settings; raise ValueError naming the setting and the fix."""
        p = self.participation
        if not isinstance(p, int | float | np.floating) or not (0.0 < float(p) <= 1.0):
            raise ValueError(f"Federation(participation=...) must be in (0, 1], got {p!r}")
        if not callable(self.step_size):
            g = self.step_size
            if not isinstance(g, int | float | np.floating) or not (0.0 < float(g) <= 1.0):
                raise ValueError(
                    f"Federation(step_size=...) must be in (0, 1] or a callable, got {g!r}"
                )
        if self.client_weighting not in ("samples", "uniform"):
            raise ValueError(
                "Federation(client_weighting=...) must be 'samples' or 'uniform', "
                f"got {self.client_weighting!r}"
            )
        if self.quantizer is not None and not isinstance(self.quantizer, Quantizer):
            raise ValueError("Federation(quantizer=...) must be None or a fl.Quantizer(levels=s)")
        if self.variance_reduction is not None and not isinstance(self.variance_reduction, Spider):
            raise ValueError(
                "Federation(variance_reduction=...) must be None or fl.Spider(inner_rounds, "
                "batch_size)"
            )
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ValueError(f"Federation(batch_size=...) must be >= 1, got {self.batch_size!r}")
        if self.on_invalid not in ("exclude", "raise"):
            raise ValueError(
                "Federation(on_invalid=...) must be 'exclude' (leave the client out of the "
                f"round) or 'raise' (stop the fit), got {self.on_invalid!r}"
            )
        self._validate_refusals()
        if self.alpha is not None and not (0.0 < float(self.alpha) <= 1.0):
            raise ValueError(f"Federation(alpha=...) must be in (0, 1], got {self.alpha!r}")
        self._validate_disclosure()
        self._validate_secure()
        self._validate_privacy()
        self._validate_acceleration()

    def _validate_refusals(self) -> None:
        if self.on_refusal not in ("exclude", "stop"):
            raise ValueError(
                "Federation(on_refusal=...) must be 'exclude' (leave a site that refuses the "
                "setup out of the fit) or 'stop' (stop the fit), got " f"{self.on_refusal!r}")
        m = self.min_clients
        if m is not None and (not isinstance(m, int | np.integer) or isinstance(m, bool)
                              or m < 1):
            raise ValueError(f"Federation(min_clients=...) must be None or an integer >= 1, "
                             f"got {m!r}")

    def fewest_clients(self, n_clients: int) -> int:
        """The fewest of ``n_clients`` sites a fit goes on with once sites are left out:
        ``min_clients``, or 2 (every site of a smaller federation) and under secure
        aggregation at least its threshold when one is given."""
        if self.min_clients is not None:
            return int(self.min_clients)
        least = min(2, int(n_clients))
        if self.secure_aggregation and self.secagg_threshold is not None:
            least = max(least, int(self.secagg_threshold))
        return least

    def _validate_acceleration(self) -> None:
        if resolve_acceleration(self.acceleration) is None:
            return
        why = acceleration_problems(
            participation=self.participation, step_size=self.step_size,
            quantizer=self.quantizer, batch_size=self.batch_size,
            variance_reduction=self.variance_reduction, privacy=self.privacy)
        if why:
            raise ValueError("Federation(acceleration=...) accelerates the exact EM map only; "
                             "not available with " + "; ".join(why))

    @property
    def squarem(self) -> Squarem | None:
        """The SQUAREM settings (None: plain steps or another accelerator); ValueError when
        invalid."""
        acc = resolve_acceleration(self.acceleration)
        return acc if isinstance(acc, Squarem) else None

    @property
    def newton(self) -> SubspaceNewton | None:
        """The subspace-Newton settings (None: plain steps or another accelerator);
        ValueError when invalid."""
        acc = resolve_acceleration(self.acceleration)
        return acc if isinstance(acc, SubspaceNewton) else None

    def _validate_privacy(self) -> None:
        dp = self.privacy
        if dp is None:
            return
        if not isinstance(dp, DifferentialPrivacy):
            raise ValueError("Federation(privacy=...) must be None or a fl.DifferentialPrivacy("
                             f"epsilon, delta, clip=...), got {type(dp).__name__}")
        dp.check_secure_aggregation(bool(self.secure_aggregation))
        if self.variance_reduction is not None:
            raise ValueError("Federation(variance_reduction=Spider(...)) is not available under "
                             "differential privacy (each round would release two correlated "
                             "statistics); use variance_reduction=None")
        if self.track_h:
            raise ValueError("Federation(track_h=True) is not available under differential "
                             "privacy (the evaluation pass is an extra release of every "
                             "client); set track_h=False")

    def _validate_disclosure(self) -> None:
        pol = self.disclosure
        if not isinstance(pol, DisclosurePolicy):
            raise ValueError("Federation(disclosure=...) must be a fl.DisclosurePolicy (or "
                             f"DisclosurePolicy.off()), got {type(pol).__name__}")
        sizes = [("batch_size", self.batch_size)]
        if self.variance_reduction is not None:
            sizes.append(("variance_reduction.batch_size", self.variance_reduction.batch_size))
        for name, b in sizes:
            if b is not None and pol.count_scope == "client" and int(b) < pol.min_records:
                raise ValueError(
                    f"Federation({name}={int(b)}): a mini-batch statistic is a sum over {int(b)} "
                    f"record(s), fewer than the disclosure policy's min_records="
                    f"{pol.min_records}, so every client would refuse it; use a batch of at "
                    f"least {pol.min_records}, or lower DisclosurePolicy(min_records=...)")

    def _validate_secure(self) -> None:
        if not isinstance(self.secure_aggregation, bool | np.bool_):
            raise ValueError("Federation(secure_aggregation=...) must be True or False, got "
                             f"{self.secure_aggregation!r}")
        t = self.secagg_threshold
        if t is not None and (not isinstance(t, int | np.integer) or isinstance(t, bool)
                              or t < 1):
            raise ValueError(f"Federation(secagg_threshold=...) must be None or an integer "
                             f">= 1, got {t!r}")
        b = self.secagg_bound
        if not isinstance(b, int | float | np.floating) or not (0 < float(b) < 2.0**50):
            raise ValueError(f"Federation(secagg_bound=...) must be a number in (0, 2^50), "
                             f"got {b!r}")
        if self.secure_aggregation and self.track_h:
            raise ValueError("Federation(track_h=True) needs every client's statistic at the "
                             "new parameters, which secure aggregation hides; set "
                             "track_h=False or secure_aggregation=False")
        if self.verified not in (None, True, False):
            raise ValueError(f"Federation(verified=...) must be None, True or False, got "
                             f"{self.verified!r}")
        if self.verified is True and not self.secure_aggregation:
            raise ValueError("Federation(verified=True) needs secure_aggregation=True: without "
                             "it a site's aggregate needs the others' replies, so it cannot "
                             "replay the server")
        why = self.verification_problems() if self.verified is True else []
        if why:
            raise ValueError("Federation(verified=True): the sites cannot replay "
                             + "; ".join(why))
        self._validate_cohorts()

    def _validate_cohorts(self) -> None:
        """The cohort rule (:mod:`fedlatent.engine.privacy.disclosure`): under secure
        aggregation, partial participation without control variates makes every round's
        aggregate a sum of its participants' whole statistics, whose totals do not change;
        over rounds with different cohorts they are a linear system in each client's totals.
        Refused unless differential privacy covers it or the policy is off."""
        if not (self.secure_aggregation and float(self.participation) < 1.0
                and not self.control_variates and self.privacy is None
                and not self.disclosure.is_off):
            return
        raise ValueError(
            f"Federation(secure_aggregation=True, participation={self.participation:g}, "
            "control_variates=False): every round's aggregate would be a sum of its "
            "participants' whole statistics, and aggregates over different cohorts can be "
            "solved (least squares) for each client's totals, a one-row client's row among "
            "them; the disclosure policy refuses it. Use control_variates=True (the replies "
            "are then differences in which the totals cancel), participation=1.0, or "
            "differential privacy (privacy=DifferentialPrivacy(..., noise='distributed')); "
            "DisclosurePolicy.off() disables every rule")

    def broadcast_problems(self) -> list[str]:
        """The settings that mix statistics computed at different parameters (empty: none).

        A round's statistics are used as they are only with every client each round, step 1
        and full passes (the FedEM update then gives ``S_hat = sum_c w_c S_c``, whatever the
        control variates). Partial participation (the absent clients' part of ``S_hat`` is
        theirs of earlier rounds: no rule here renews it at the new parameters), a step below
        1 (a running average over rounds), mini-batches and SPIDER (corrections carried from
        earlier parameters) and acceleration (extrapolation across rounds) do not. Handled
        as they are: the quantizer (unbiased: each round's ``S_hat`` is the round's
        statistic plus zero-mean noise), secure aggregation (sums) and differential privacy
        (noise on each round's sums), where the model supports them."""
        out = []
        if float(self.participation) < 1.0:
            out.append(f"participation={self.participation:g}")
        if callable(self.step_size) or float(self.step_size) != 1.0:
            out.append(f"step_size={self.step_size!r}")
        if self.batch_size is not None:
            out.append(f"batch_size={self.batch_size!r} (mini-batches)")
        if self.variance_reduction is not None:
            out.append("variance_reduction=Spider(...) (SPIDER)")
        if resolve_acceleration(self.acceleration) is not None:
            out.append(f"acceleration={self.acceleration!r}")
        return out

    def check_model(self, model) -> None:
        """ValueError, one message for every setting at once, when ``model`` declares
        statistics valid only at the broadcast parameters (``broadcast_only``, its reason)
        and a setting would average them across rounds (:meth:`broadcast_problems`). No
        per-model code: the model's declaration is all the engine reads."""
        reason = getattr(model, "broadcast_only", "")
        problems = self.broadcast_problems() if reason else []
        if problems:
            raise ValueError(
                f"model {model.name!r} sends statistics valid only at the parameters the "
                f"server broadcast ({reason}), so the engine cannot average them across rounds "
                f"or clients of other rounds; not available with {'; '.join(problems)}. Fit "
                "it with participation=1.0, step_size=1.0, batch_size=None, "
                "variance_reduction=None and acceleration=None (the quantizer, secure "
                "aggregation and control variates are fine)")

    def verification_problems(self) -> list[str]:
        """What keeps a site from replaying this federation's server (empty: nothing)."""
        out = []
        if self.participation != 1.0:
            out.append(f"participation={self.participation:g} (a site that missed an exchange "
                       "holds no leaf of it to check the transcript by; use participation=1)")
        if callable(self.step_size):
            out.append("a callable step_size (a site can replay only a number it is sent at "
                       "setup)")
        return out

    @property
    def verifies(self) -> bool:
        """Whether the fit runs verified rounds: under secure aggregation, ``verified=True``,
        or ``None`` (the default) when the sites can replay these settings
        (:meth:`verification_problems`); never without secure aggregation."""
        if not self.secure_aggregation or self.verified is False:
            return False
        return self.verified is True or not self.verification_problems()

    def gamma(self, k: int) -> float:
        """Step size at round ``k`` (1-based)."""
        return float(self.step_size(k)) if callable(self.step_size) else float(self.step_size)

    def alpha_for(self, shapes: dict[str, tuple[int, ...]]) -> float:
        if self.alpha is not None:
            return float(self.alpha)
        if self.quantizer is None:
            return 1.0
        return 1.0 / (1.0 + self.quantizer.omega(shapes))

    @property
    def is_plain_em(self) -> bool:
        return (
            self.participation == 1.0
            and not callable(self.step_size)
            and float(self.step_size) == 1.0
            and self.quantizer is None
            and self.variance_reduction is None
            and self.batch_size is None
        )

    def to_config(self) -> dict:
        """JSON-able description (a callable step size is recorded by its repr)."""
        d = asdict(self)
        d.pop("_extra", None)
        d["disclosure"] = json.loads(policy_to_json(self.disclosure))
        d["privacy"] = None if self.privacy is None else self.privacy.to_config()
        for key, default in (("on_refusal", "exclude"), ("min_clients", None),
                             ("verified", None)):
            if d[key] == default:  # the default: the config (and a checkpoint's identity)
                d.pop(key)  # of before
        acc = resolve_acceleration(self.acceleration)
        if acc is None:  # off: the config (and a checkpoint's identity) of before
            d.pop("acceleration")
        else:
            d["acceleration"] = acceleration_config(acc)
        if callable(self.step_size):
            d["step_size"] = repr(self.step_size)
        return d

    @classmethod
    def from_config(cls, config: dict | None) -> Federation:
        """Inverse of :meth:`to_config`. A callable step size was recorded by its repr and
        cannot be rebuilt: such a config raises ValueError."""
        fed = dict(config or {})
        if fed.get("quantizer"):
            fed["quantizer"] = Quantizer(**fed["quantizer"])
        if fed.get("variance_reduction"):
            fed["variance_reduction"] = Spider(**fed["variance_reduction"])
        fed["disclosure"] = policy_from_config(fed.get("disclosure"))
        fed["privacy"] = DifferentialPrivacy.from_config(fed.get("privacy"))
        if fed.get("acceleration") is not None:
            fed["acceleration"] = resolve_acceleration(fed["acceleration"])
        if isinstance(fed.get("step_size"), str):
            raise ValueError(
                f"Federation step_size {fed['step_size']!r} is a callable and cannot be rebuilt "
                "from a config; give a number"
            )
        return cls(**fed)
