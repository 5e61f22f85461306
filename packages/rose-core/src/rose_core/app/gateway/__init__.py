"""The rollout gateway: an OpenAI-compatible endpoint per session through which any agent's turns are routed
by the elastic scheduler and recorded token for token for training (``docs/gateway.md``).

``session_history`` (pure token bookkeeping) <- ``session_table`` (sessions and groups) <- ``gateway`` (the
requests) <- ``http_server`` (the socket); ``turn_bridge`` hands turns to the controller thread and
``chat_template`` renders the policy's chat template. ``rose_core.app.jobs.gateway_job`` runs the RL job on it.
"""
