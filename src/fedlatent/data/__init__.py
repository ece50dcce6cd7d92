"""Federated data: containers, readers, partitioners and synthetic generators."""

from .dataset import ClientData, DataValidationError, FederatedDataset
from .hlcr_data import make_synthhlcr, split_events
from .partition import (
    dirichlet_partition,
    partition_by_components,
    partition_by_labels,
    split_arrays,
)

__all__ = [
    "ClientData",
    "DataValidationError",
    "FederatedDataset",
    "dirichlet_partition",
    "make_synthhlcr",
    "split_events",
    "partition_by_components",
    "partition_by_labels",
    "split_arrays",
]
from .sec_data import (  # noqa: E402
    make_sec_attack,
    make_sec_fairness,
    make_sec_simulation1,
    make_sec_simulation2,
)

__all__ += [
    "make_sec_attack",
    "make_sec_fairness",
    "make_sec_simulation1",
    "make_sec_simulation2",
]
from .fedgmm_data import (  # noqa: E402
    federated_pca,
    make_fedgmm_digits,
    make_fedgmm_nongaussian,
    make_fedgmm_synthetic,
    transform_digits,
)

__all__ += [
    "federated_pca",
    "make_fedgmm_digits",
    "make_fedgmm_nongaussian",
    "make_fedgmm_synthetic",
    "transform_digits",
]
