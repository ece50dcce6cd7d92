"""Differential privacy where the data are: clipping, noise and the client's own budget.

A client under ``Federation(privacy=DifferentialPrivacy(...))`` receives the setting and the
fit's plan (how many Gaussian releases it will be asked for) in the setup message. It then

1. clips its own data once (the model's
   :meth:`~fedlatent.engine.contract.model.FederatedModel.dp_clip`:
   feature rows to the L2 ball of radius ``clip`` around the public centre, targets to
   ``target_range``), so one record's contribution to any statistic is bounded;
2. calibrates the noise itself from the setting and the plan (the server cannot talk it into
   less noise: a longer plan only means more noise per release);
3. adds Gaussian noise to every release (the round statistics, the initialization sums) with
   standard deviation ``z * Delta`` per unit of sensitivity, ``Delta`` the joint L2 sensitivity
   of the release under replace-one-record adjacency (client sizes are public), from the
   model's per-record bounds; with ``noise="distributed"`` it adds ``z * Delta / sqrt(t)``, ``t``
   the secure-aggregation threshold: at least ``t`` shares are in any sum the server can
   unmask, so the sum always carries at least the calibrated noise;
4. counts its releases in its private state and refuses one that would spend more than the
   budget (whatever the server asks).

The noise comes from the operating system's randomness (``noise_seed=None``): the server knows
the fit's seed, so noise drawn from it could be subtracted.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from fedlatent.engine.privacy.clipping import REPLACE_ONE_FACTOR
from fedlatent.engine.privacy.dp import DifferentialPrivacy, PrivacyBudget, PrivacyBudgetExceeded
from fedlatent.engine.privacy.mechanisms import joint_sensitivity, noise_stds

__all__ = ["ClientPrivacy", "matrix_noise_scale", "release_stds", "STATE_KEY"]

logger = logging.getLogger(__name__)

#: where a client keeps the number of releases it has made (in its private state)
STATE_KEY = "engine/dp_releases"
_P_NOISE = 4  # purpose of the per-(client, round) generator with a noise_seed


def release_stds(sensitivities: Mapping[str, float], noise_multiplier: float, *,
                 n_parties: int = 1) -> dict[str, float]:
    """Noise standard deviation per block of one release (sum scale).

    ``sensitivities`` are the model's per-record bounds ``Delta_b`` under add/remove (one per
    block, holding simultaneously); the release is private under replace-one adjacency, whose
    sensitivity is at most ``REPLACE_ONE_FACTOR`` times the add/remove bound. The budget of a
    release is split equally among its ``B`` blocks (as in DP-EM, Park et al. 2017): block
    ``b`` gets standard deviation ``z * 2 * sqrt(B) * Delta_b / sqrt(n_parties)``, which is
    the Gaussian mechanism with multiplier ``z`` on the statistic rescaled block by block by
    ``1 / Delta_b`` (joint sensitivity ``2 sqrt(B)``). A count (``Delta = 1``) is then not
    drowned in the noise a sum of squares (``Delta = R^2``) needs. Blocks of sensitivity 0
    get no noise.
    """
    scales = {k: float(v) for k, v in sensitivities.items() if float(v) > 0}
    delta = REPLACE_ONE_FACTOR * joint_sensitivity({k: 1.0 for k in scales})
    stds = noise_stds(list(scales), delta, noise_multiplier, n_parties=n_parties,
                      scales=scales)
    return {k: stds.get(k, 0.0) for k in sensitivities}



def matrix_noise_scale(sensitivities: Mapping[str, float], block: str, noise_multiplier: float,
                       noise: str, n_members: int, threshold: int | None, dim: int) -> float:
    """The spectral scale of the noise a round's summed ``dim x dim`` matrix block carries
    (sum scale): ``sd * sqrt(2 dim)``, about the spectral norm of the symmetrized noise, with
    ``sd`` the block's entry standard deviation over ``n_members`` parties (each one's local
    noise, or shares of the calibrated noise over the secure-aggregation ``threshold`` when
    distributed). Public quantities only (the setting and the plan): the level below which a
    private M-step lifts the matrix's eigenvalues (LCR's ``sxx``, HLCR's ``XtX``, FedGMM's
    learner Hessians)."""
    parties = 1 if noise == "local" or threshold is None else int(threshold)
    sd = release_stds(sensitivities, noise_multiplier, n_parties=parties)[block]
    return float(sd * math.sqrt(n_members) * math.sqrt(2.0 * dim))

class ClientPrivacy:
    """One client's differential-privacy state for a fit.

    Parameters
    ----------
    dp : DifferentialPrivacy
    releases : int
        Releases the fit plans (rounds x releases per round + initialization releases).
    client_id : str
    spent : int
        Releases already made (from the client's saved state, when a fit resumes).
    """

    def __init__(self, dp: DifferentialPrivacy, releases: int, client_id: str, spent: int = 0):
        self.dp = dp
        self.calibration = dp.calibrate(int(releases))
        self.budget = PrivacyBudget(self.calibration, int(spent))
        self.client_id = str(client_id)
        # the operating system's entropy (SeedSequence() draws it through ``secrets``)
        self._os_rng = (np.random.default_rng(np.random.SeedSequence())
                        if dp.noise_seed is None else None)

    @classmethod
    def from_message(cls, msg: Mapping, client_id: str, state: dict, *,
                     honour_seed: bool = True) -> ClientPrivacy | None:
        """The setting the setup message carries (None when the fit is not private).

        ``honour_seed=False`` (a site that is not a simulation): a server's ``noise_seed`` is
        dropped, the noise comes from the site's own randomness."""
        raw = str(msg.get("privacy") or "")
        if not raw:
            return None
        dp = DifferentialPrivacy.from_config(json.loads(raw))
        if dp.noise_seed is not None and not honour_seed:
            logger.warning("client %r: the server's noise_seed is ignored (this site is not a "
                           "simulation): the noise comes from the site's own randomness",
                           client_id)
            dp = replace(dp, noise_seed=None)
        spent = int(np.asarray(state.get(STATE_KEY, 0)).item())
        return cls(dp, int(msg["privacy_releases"]), client_id, spent)

    def rng(self, client_key: int, round_: int) -> np.random.Generator:
        if self._os_rng is not None:
            return self._os_rng
        ss = np.random.SeedSequence(entropy=int(self.dp.noise_seed),
                                    spawn_key=(int(client_key), int(round_), _P_NOISE))
        return np.random.default_rng(ss)

    def n_parties(self, secagg) -> int:
        """``1`` for local noise; the secure-aggregation threshold for distributed noise."""
        if self.dp.noise == "local":
            return 1
        if secagg is None:
            raise PrivacyBudgetExceeded(
                f"client {self.client_id!r}: noise='distributed' needs secure aggregation, "
                "and this exchange is not masked; refused")
        return int(secagg.config.threshold)

    def release(self, sums: Mapping[str, np.ndarray], sensitivities: Mapping[str, float], *,
                what: str, client_key: int, round_: int, secagg=None,
                state: dict | None = None) -> dict[str, np.ndarray]:
        """``sums`` with the calibrated noise added to the blocks of ``sensitivities`` (the
        others pass unchanged: they must be public, such as a client's row count); one release
        spent, or :class:`PrivacyBudgetExceeded` when it would exceed the budget."""
        missing = [k for k in sensitivities if k not in sums]
        if missing:
            raise ValueError(f"{what}: no blocks {missing} to add noise to (has {sorted(sums)})")
        if state is not None:  # the count lives in the client's state (checkpoints, Flower)
            self.budget.releases = int(np.asarray(state.get(STATE_KEY, 0)).item())
        if self.budget.would_exceed(1):
            c = self.calibration
            raise PrivacyBudgetExceeded(
                f"client {self.client_id!r}: {what} would be release {self.budget.releases + 1} "
                f"of a plan of {c.releases}, spending epsilon="
                f"{c.epsilon_after(self.budget.releases + 1):.4g} > budget {c.epsilon:g}; refused")
        stds = release_stds(sensitivities, self.calibration.noise_multiplier,
                            n_parties=self.n_parties(secagg))
        rng = self.rng(client_key, round_)
        out = dict(sums)
        for name, sd in stds.items():
            arr = np.asarray(sums[name], dtype=np.float64)
            out[name] = arr + sd * rng.standard_normal(arr.shape)
        self.budget.spend(1)
        if state is not None:
            state[STATE_KEY] = np.array(float(self.budget.releases))
        return out

    @property
    def noise_multiplier(self) -> float:
        return self.calibration.noise_multiplier

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"ClientPrivacy({self.client_id!r}, z={self.noise_multiplier:.4g}, "
                f"{self.budget.releases}/{self.calibration.releases} releases)")

