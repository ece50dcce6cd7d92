"""Reproductions of the papers' tables and figures. Each returns a DataFrame and writes plots.

Every function takes ``quick`` (a small size that runs in tests), ``out`` (where plots go) and
``random_state``.
"""

from .fedem_toy import fedem_toy
from .hlcr import hlcr_figure3

__all__: list[str] = ["fedem_toy"]
__all__ += ["hlcr_figure3"]
from .sec import sec_attack, sec_fairness, sec_simulation1, sec_simulation2  # noqa: E402

__all__ += ["sec_attack", "sec_fairness", "sec_simulation1", "sec_simulation2"]
from .fedgmm import (  # noqa: E402
    fedgmm_nongaussian,
    fedgmm_novelty,
    fedgmm_synthetic,
    fedgmm_unseen_clients,
)

__all__ += ["fedgmm_nongaussian", "fedgmm_novelty", "fedgmm_synthetic", "fedgmm_unseen_clients"]
