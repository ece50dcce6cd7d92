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
