"""Rollout work on the rollout engine: ``RolloutRunner`` admits turns (version, capacity, memory budget), starts
them (at once, or when the SLO guard releases them), replies ``TurnResult`` / ``TurnAborted`` and tracks warm
trajectories; ``WeightUpdater`` fetches announced weight versions and swaps them into the engine in place.
"""
