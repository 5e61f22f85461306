"""The sparse codec: how one bucket of a new version travels against the version a receiver holds
(new values at changed positions, never additive deltas), on the host and on CUDA tensors."""
