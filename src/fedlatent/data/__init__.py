"""Federated data: containers, readers, partitioners and synthetic generators.

The generators are imported on first use (they pull in scikit-learn's datasets).
"""

from .._lazy import lazy_attributes
from .dataset import ClientData, DataValidationError, FederatedDataset

_WHERE = {
    "make_synthhlcr": "hlcr_data", "split_events": "hlcr_data",
    "dirichlet_partition": "partition", "partition_by_components": "partition",
    "partition_by_labels": "partition", "split_arrays": "partition",
    "make_sec_attack": "sec_data", "make_sec_fairness": "sec_data",
    "make_sec_simulation1": "sec_data", "make_sec_simulation2": "sec_data",
    "federated_pca": "fedgmm_data", "make_fedgmm_digits": "fedgmm_data",
    "make_fedgmm_nongaussian": "fedgmm_data", "make_fedgmm_synthetic": "fedgmm_data",
    "transform_digits": "fedgmm_data",
}

__all__ = ["ClientData", "DataValidationError", "FederatedDataset", *sorted(_WHERE)]


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)
