"""Federated data: containers, readers, partitioners and synthetic generators."""

from .dataset import ClientData, DataValidationError, FederatedDataset
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
    "partition_by_components",
    "partition_by_labels",
    "split_arrays",
]
