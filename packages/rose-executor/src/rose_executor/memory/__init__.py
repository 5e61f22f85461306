"""Serving-first memory, the mechanism: ``ServingFirstBudget`` turns this host's models and in-flight requests
into observations for rose-core's pure ``ServingFirstMemory`` policy (budget, emergency cut, freeze) and sizes
the budget from the config (``memory_budget``). The decision itself lives in ``rose_core.policy``.
"""
