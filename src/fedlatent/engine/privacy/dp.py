"""Differential privacy settings, the noise calibrated up front, and the budget tracker.

``DifferentialPrivacy(epsilon, delta, clip, noise="local" | "distributed")`` is the user's setting
(a frozen value checked on construction). :meth:`DifferentialPrivacy.calibrate` turns it and the
number of planned releases into a :class:`Calibration`: the smallest Gaussian noise multiplier
(noise standard deviation / L2 sensitivity of one release to one record) whose composition over
the plan stays within ``(epsilon, delta)``. :class:`PrivacyBudget` counts the releases actually
made, says before a release whether it would exceed the budget (so the round loop can stop
before that round) and reports the ``(epsilon, delta)`` spent so far.

Guarantee: record-level ``(epsilon, delta)``-DP, add/remove-one-record adjacency, of everything
released through the Gaussian mechanism of :mod:`.mechanisms` with the calibrated multiplier and
the sensitivities of :mod:`.clipping`. Anything released outside it (a client's row count sent in
the clear, an objective value) is not covered and must be noised or withheld by the caller.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedlatent.engine.privacy.accountant import (
    ACCOUNTANTS,
    calibrate_noise_multiplier,
    composed_epsilon,
    require_dp_accounting,
)

__all__ = [
    "NOISE_MODES",
    "Calibration",
    "DifferentialPrivacy",
    "PrivacyBudget",
    "PrivacyBudgetExceeded",
    "planned_releases",
]

NOISE_MODES = ("local", "distributed")


class PrivacyBudgetExceeded(RuntimeError):
    """A release would spend more than the privacy budget."""


def _positive(name: str, value: object, prefix: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{prefix}{name} must be a positive finite number, got {value!r}")
    return float(value)


def _numeric(value: object) -> bool:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return arr.ndim <= 1


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def planned_releases(rounds: int, per_round: int = 1, initialization: int = 0) -> int:
    """Number of Gaussian releases a fit plans: ``rounds * per_round + initialization``.

    ``per_round`` counts the noised exchanges of one round (the round statistics, plus e.g. a
    second Newton exchange); ``initialization`` the noised sums of the initialization.
    """
    rounds = _count("rounds", rounds, 0)
    per_round = _count("per_round", per_round, 1)
    initialization = _count("initialization", initialization, 0)
    total = rounds * per_round + initialization
    if total < 1:
        raise ValueError("a private fit must plan at least one release (rounds * per_round + "
                         "initialization >= 1)")
    return total


@dataclass(frozen=True)
class DifferentialPrivacy:
    """Record-level ``(epsilon, delta)`` differential privacy of a whole fit.

    Parameters
    ----------
    epsilon : float
        Total privacy budget, ``> 0``.
    delta : float
        In ``(0, 1)``; choose it well below ``1 / n_records`` (e.g. ``1e-5``).
    clip : float
        L2 radius of the ball, around the model's public (or privately estimated) centre, that
        every feature row is clipped to (:func:`.clipping.clip_rows`). It bounds one record's
        contribution, hence the sensitivity of the statistics.
    noise : {"local", "distributed"}
        ``"local"``: every client adds the full noise to its own sums; private against anyone,
        secure aggregation or not. ``"distributed"``: each of the ``n`` participants adds
        variance ``sigma^2 / n`` so that only the *sum* carries ``sigma^2``; private only with
        secure aggregation (one client's message alone carries too little noise).
    target_range : (float, float) or None
        ``(lo, hi)`` the targets are clipped to, for models that have a target.
    accountant : {"pld", "rdp"}
        ``dp-accounting``'s privacy-loss-distribution (tight) or Renyi (looser) accountant.
    center : tuple of float or None
        The public centre of the clipping ball (None: the origin). Choose it from public
        knowledge (a published mean, the middle of the instruments' range), never from the
        data themselves.
    noise_seed : int or None
        None (the default, and the only private choice): every client draws its noise from
        the operating system's randomness, so nobody can subtract it. An integer makes the
        noise a function of ``(noise_seed, client, round)`` so that simulations are
        reproducible; whoever knows it can remove the noise: never set it in a deployment.
    """

    epsilon: float
    delta: float
    clip: float
    noise: str = "local"
    target_range: tuple[float, float] | None = None
    accountant: str = "pld"
    center: tuple[float, ...] | None = None
    noise_seed: int | None = None

    def __post_init__(self) -> None:
        _positive("epsilon", self.epsilon, "DifferentialPrivacy: ")
        if isinstance(self.delta, bool) or not isinstance(self.delta, numbers.Real) or not (
                0.0 < self.delta < 1.0):
            raise ValueError(f"DifferentialPrivacy: delta must be in (0, 1) (typically 1e-5, "
                             f"below 1 / n_records), got {self.delta!r}")
        _positive("clip", self.clip, "DifferentialPrivacy: ")
        for name in ("epsilon", "delta", "clip"):  # numpy scalars become plain floats
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.noise not in NOISE_MODES:
            raise ValueError(f"DifferentialPrivacy: noise must be one of {NOISE_MODES}, got "
                             f"{self.noise!r}")
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"DifferentialPrivacy: accountant must be one of {ACCOUNTANTS}, "
                             f"got {self.accountant!r}")
        if self.target_range is not None:
            tr = self.target_range
            ok = (isinstance(tr, tuple | list) and len(tr) == 2
                  and all(isinstance(v, numbers.Real) and math.isfinite(v) for v in tr)
                  and tr[0] < tr[1])
            if not ok:
                raise ValueError(f"DifferentialPrivacy: target_range must be (lo, hi) with "
                                 f"finite lo < hi, got {tr!r}")
            object.__setattr__(self, "target_range", (float(tr[0]), float(tr[1])))
        if self.center is not None:
            c = np.asarray(self.center, dtype=np.float64).ravel() if _numeric(self.center) \
                else None
            if c is None or c.size == 0 or not np.all(np.isfinite(c)):
                raise ValueError(f"DifferentialPrivacy: center must be a non-empty sequence of "
                                 f"finite numbers (one per feature), got {self.center!r}")
            object.__setattr__(self, "center", tuple(float(v) for v in c))
        if self.noise_seed is not None and (isinstance(self.noise_seed, bool) or not isinstance(
                self.noise_seed, numbers.Integral) or self.noise_seed < 0):
            raise ValueError(f"DifferentialPrivacy: noise_seed must be None or a non-negative "
                             f"integer, got {self.noise_seed!r}")

    def center_for(self, n_features: int) -> np.ndarray:
        """The clipping centre as an array of ``n_features`` (the origin when None), or a
        ValueError naming the mismatch."""
        if self.center is None:
            return np.zeros(int(n_features))
        if len(self.center) != int(n_features):
            raise ValueError(f"DifferentialPrivacy(center=...) has {len(self.center)} values for "
                             f"{n_features} features; give one per feature")
        return np.asarray(self.center, dtype=np.float64)

    def to_config(self) -> dict:
        """JSON-ready fields (they travel to the clients in the setup message)."""
        return {"epsilon": self.epsilon, "delta": self.delta, "clip": self.clip,
                "noise": self.noise,
                "target_range": None if self.target_range is None else list(self.target_range),
                "accountant": self.accountant,
                "center": None if self.center is None else list(self.center),
                "noise_seed": self.noise_seed}

    @classmethod
    def from_config(cls, config: dict | None) -> DifferentialPrivacy | None:
        """Inverse of :meth:`to_config` (None stays None); every field checked."""
        if config is None:
            return None
        fields = {"epsilon", "delta", "clip", "noise", "target_range", "accountant", "center",
                  "noise_seed"}
        if not isinstance(config, dict) or not set(config) <= fields:
            got = sorted(config) if isinstance(config, dict) else type(config).__name__
            raise ValueError(f"a DifferentialPrivacy config has the fields {sorted(fields)}, "
                             f"got {got}")
        cfg = dict(config)
        if cfg.get("target_range") is not None:
            cfg["target_range"] = tuple(cfg["target_range"])
        if cfg.get("center") is not None:
            cfg["center"] = tuple(cfg["center"])
        return cls(**cfg)

    @property
    def requires_secure_aggregation(self) -> bool:
        """True for ``noise="distributed"``."""
        return self.noise == "distributed"

    def check_secure_aggregation(self, secure_aggregation: bool) -> None:
        """Refuse distributed noise without secure aggregation (each message would be exposed
        with only ``1/n`` of the noise variance)."""
        if self.requires_secure_aggregation and not secure_aggregation:
            raise ValueError(
                "DifferentialPrivacy(noise='distributed') is private only with secure "
                "aggregation: set Federation(secure_aggregation=True), or use noise='local'")

    def calibrate(self, releases: int, *, sampling_rate: float | None = None) -> Calibration:
        """The noise multiplier for ``releases`` planned releases (see :func:`planned_releases`).

        ``sampling_rate`` is a record-level Poisson rate hidden from the server; client
        participation is not one (the server sees who takes part; see :mod:`.accountant`).
        """
        releases = _count("releases", releases, 1)
        require_dp_accounting()  # the clear ImportError, cached figures or not
        z = _calibrated(self.epsilon, self.delta, releases, sampling_rate, self.accountant)
        return Calibration(self.epsilon, self.delta, releases, z, sampling_rate,
                           self.accountant)


@lru_cache(maxsize=256)
def _calibrated(epsilon: float, delta: float, releases: int, q: float | None,
                accountant: str) -> float:
    """The calibration is a pure function of the plan: every client of a fit (and every fit
    of a study) computes the same one."""
    return calibrate_noise_multiplier(epsilon, delta, releases, sampling_rate=q,
                                      accountant=accountant)


@lru_cache(maxsize=4096)
def _epsilon(z: float, k: int, delta: float, q: float | None, accountant: str) -> float:
    return composed_epsilon(z, k, delta, sampling_rate=q, accountant=accountant)


@dataclass(frozen=True)
class Calibration:
    """The noise a fit uses, fixed before its first release.

    Attributes
    ----------
    epsilon, delta : float
        The budget.
    releases : int
        Releases planned.
    noise_multiplier : float
        Noise standard deviation per unit of L2 sensitivity.
    sampling_rate : float or None
        Record-level Poisson sampling rate accounted for, if any.
    accountant : str
    """

    epsilon: float
    delta: float
    releases: int
    noise_multiplier: float
    sampling_rate: float | None = None
    accountant: str = "pld"

    def epsilon_after(self, k: int) -> float:
        """Epsilon at ``delta`` after ``k`` releases: the accountant's own figure."""
        k = _count("k", k, 0)
        return _epsilon(self.noise_multiplier, k, self.delta, self.sampling_rate,
                        self.accountant)

    def to_dict(self) -> dict:
        """JSON-ready fields (for checkpoints and fitted-model metadata; no pickle)."""
        return {"epsilon": self.epsilon, "delta": self.delta, "releases": self.releases,
                "noise_multiplier": self.noise_multiplier, "sampling_rate": self.sampling_rate,
                "accountant": self.accountant}

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        """Inverse of :meth:`to_dict`, checking every field."""
        expected = {"epsilon", "delta", "releases", "noise_multiplier", "sampling_rate",
                    "accountant"}
        if not isinstance(data, dict) or set(data) != expected:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"a privacy calibration needs exactly the fields {sorted(expected)}, "
                             f"got {got}; the checkpoint is damaged or from another version")
        q = data["sampling_rate"]
        if q is not None and not (isinstance(q, numbers.Real) and 0.0 < q <= 1.0):
            raise ValueError(f"privacy calibration: sampling_rate must be in (0, 1] or null, "
                             f"got {q!r}")
        if data["accountant"] not in ACCOUNTANTS:
            raise ValueError(f"privacy calibration: accountant must be one of {ACCOUNTANTS}, "
                             f"got {data['accountant']!r}")
        delta = data["delta"]
        if not (isinstance(delta, numbers.Real) and 0.0 < delta < 1.0):
            raise ValueError(f"privacy calibration: delta must be in (0, 1), got {delta!r}")
        pre = "privacy calibration: "
        return cls(_positive("epsilon", data["epsilon"], pre), float(delta),
                   _count("releases", data["releases"], 1),
                   _positive("noise_multiplier", data["noise_multiplier"], pre),
                   None if q is None else float(q), data["accountant"])

    def noise_std(self, sensitivity: float, n_parties: int = 1) -> float:
        """Standard deviation each of ``n_parties`` adds so that their sum carries
        ``noise_multiplier * sensitivity`` (``n_parties=1``: local noise)."""
        n_parties = _count("n_parties", n_parties, 1)
        return self.noise_multiplier * float(sensitivity) / math.sqrt(n_parties)


class PrivacyBudget:
    """Releases made so far against a :class:`Calibration`.

    Parameters
    ----------
    calibration : Calibration
    releases : int
        Releases already made (when a fit resumes from a checkpoint).
    """

    def __init__(self, calibration: Calibration, releases: int = 0):
        self.calibration = calibration
        self.releases = _count("releases", releases, 0)

    def would_exceed(self, k: int = 1) -> bool:
        """Whether ``k`` more releases would spend more than ``epsilon`` (at ``delta``)."""
        k = _count("k", k, 1)
        return self.calibration.epsilon_after(self.releases + k) > self.calibration.epsilon

    def spend(self, k: int = 1) -> tuple[float, float]:
        """Record ``k`` releases; refuse (and record nothing) if they would exceed the budget.

        Returns the ``(epsilon, delta)`` spent after them.
        """
        if self.would_exceed(k):
            c = self.calibration
            raise PrivacyBudgetExceeded(
                f"{k} more release(s) after {self.releases} would spend epsilon="
                f"{c.epsilon_after(self.releases + k):.4g} > budget {c.epsilon:g} "
                f"(delta={c.delta:g}, {c.releases} releases planned); stop before this round "
                f"or plan more releases when calibrating")
        self.releases += k
        return self.spent

    @property
    def spent(self) -> tuple[float, float]:
        """``(epsilon, delta)`` spent so far (``(0.0, 0.0)`` before any release)."""
        if self.releases == 0:
            return 0.0, 0.0
        return self.calibration.epsilon_after(self.releases), self.calibration.delta

    def state(self) -> dict:
        """JSON-ready state: the calibration and the releases made (a checkpoint resumes it)."""
        return {"calibration": self.calibration.to_dict(), "releases": self.releases}

    @classmethod
    def from_state(cls, state: dict) -> PrivacyBudget:
        """Inverse of :meth:`state`."""
        if not isinstance(state, dict) or set(state) != {"calibration", "releases"}:
            raise ValueError("a privacy budget state needs exactly the fields ['calibration', "
                             "'releases']; the checkpoint is damaged or from another version")
        return cls(Calibration.from_dict(state["calibration"]), state["releases"])

    @property
    def remaining(self) -> int:
        """Releases that can still be made within the budget (the plan's remainder)."""
        return max(self.calibration.releases - self.releases, 0)
