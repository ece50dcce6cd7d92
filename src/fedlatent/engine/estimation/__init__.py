"""The base estimators (FederatedEstimator, FederatedMixture), their fit context, and inference on
a fitted model: the top of the engine."""
