"""The per-host agent: ``ExecutorAgent`` (``agent``) runs a session with the controller (``session``) over the
host it builds (``host``)."""

from rose_executor.agent.agent import AgentOptions, ExecutorAgent

__all__ = ["AgentOptions", "ExecutorAgent"]
