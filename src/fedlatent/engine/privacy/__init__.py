"""Privacy by measure (differential privacy with accounting) and by construction (disclosure
control), as engine building blocks every model shares.

- :mod:`.dp`: ``DifferentialPrivacy`` settings, the noise ``Calibration`` fixed up front and the
  ``PrivacyBudget`` tracker;
- :mod:`.accountant`: composed epsilon and noise calibration on ``dp-accounting`` (optional extra
  ``fedlatent[privacy]``, imported only when an epsilon is computed);
- :mod:`.mechanisms`: the Gaussian mechanism on named arrays (local or distributed noise);
- :mod:`.clipping`: bounding one record's contribution and the sensitivity of each model
  family's statistics;
- :mod:`.disclosure`: ``DisclosurePolicy`` (thresholds anchored on DataSHIELD's defaults) and
  its pure checks;
- :mod:`.attacks`: the reconstructions the policy defeats.

Nothing here imports ``dp_accounting`` at import time, so ``import fedlatent`` works without
the extra.
"""

from fedlatent.engine.privacy.accountant import calibrate_noise_multiplier, composed_epsilon
from fedlatent.engine.privacy.attacks import (
    record_from_regression_block,
    rows_from_one_record,
    rows_from_two_records,
)
from fedlatent.engine.privacy.clipping import (
    REPLACE_ONE_FACTOR,
    center_from_sums,
    center_sensitivity,
    clip_rows,
    clip_targets,
    logistic_sensitivity,
    regression_sensitivity,
)
from fedlatent.engine.privacy.disclosure import (
    DisclosurePolicy,
    check_aggregate,
    check_counts,
    check_learner,
    check_level_counts,
    check_levels,
    check_reply_numbers,
    check_saturation,
    check_tree_leaves,
    effective,
    free_numbers,
)
from fedlatent.engine.privacy.dp import (
    Calibration,
    DifferentialPrivacy,
    PrivacyBudget,
    PrivacyBudgetExceeded,
    planned_releases,
)
from fedlatent.engine.privacy.mechanisms import gaussian_mechanism, joint_sensitivity, noise_stds

__all__ = [
    "REPLACE_ONE_FACTOR",
    "Calibration",
    "DifferentialPrivacy",
    "DisclosurePolicy",
    "PrivacyBudget",
    "PrivacyBudgetExceeded",
    "calibrate_noise_multiplier",
    "center_from_sums",
    "center_sensitivity",
    "check_aggregate",
    "check_counts",
    "check_learner",
    "check_level_counts",
    "check_levels",
    "check_reply_numbers",
    "check_saturation",
    "check_tree_leaves",
    "clip_rows",
    "clip_targets",
    "composed_epsilon",
    "effective",
    "free_numbers",
    "gaussian_mechanism",
    "joint_sensitivity",
    "logistic_sensitivity",
    "noise_stds",
    "planned_releases",
    "record_from_regression_block",
    "regression_sensitivity",
    "rows_from_one_record",
    "rows_from_two_records",
]
