"""The engines of this host and what they are made of: the ``Engine`` protocol every consumer is typed
against, ``VllmEngine`` (``vllm_engine``, the only module of ROSE that imports vllm) with the worker extension
vLLM loads inside its workers, the ``FakeEngine`` twin for tests on a virtual clock, start-up latency
profiles, model and weight-file facts read from disk, and the orphan guard of vLLM's engine-core processes.
Nothing here decides anything; it must not import vllm (the worker extension and the twin import this package).
"""
