"""The FedEM settings, state and record: Federation, the server update, the history, checkpoints,
seeds and random streams."""
