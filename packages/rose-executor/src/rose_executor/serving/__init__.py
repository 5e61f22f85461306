"""The production side of a serving host: vLLM's OpenAI-compatible endpoint on the serving engine
(``OpenAIServer``) and what the executor knows about serving latency from vLLM's stat logger
(``ServingMonitor`` over a rolling ``LatencyWindow``: p99s, SLO attainment, the p99 feedback verdict).
"""
