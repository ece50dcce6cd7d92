"""The model's contract: FederatedModel and its Capabilities, the registry, the parameter table,
the mixture model and the starts (docs/architecture.md)."""
