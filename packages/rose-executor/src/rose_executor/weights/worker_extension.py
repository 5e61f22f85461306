"""Methods ROSE adds to every vLLM worker (``worker_extension_cls``); this module must not import vllm.

vLLM mixes ``RoseWorkerExtension`` into its worker class, so ``self`` is the worker and
``AsyncLLM.collective_rpc("rose_weights_stage", args=(...))`` runs in each worker process. The engine
core runs these calls between two engine steps; ``rose_weights_stage`` only starts a background pull
and returns, so the engine keeps stepping while a version arrives, and ``rose_weights_commit`` applies
it in place (``engine_weights.EngineWeights``). In a tensor-parallel engine each worker is one rank and
holds, pulls and checks only its shard; the engine calls ``rose_weights_pulled`` on every rank before any
commits (all or none). Arguments travel pickled: plain values only.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rose_core.protocol.messages import ShardView, WeightAnnounce
from rose_core.support.errors import RoseError
from rose_executor.host.cpu_priority import lower_engine_worker
from rose_executor.weights.engine_weights import EngineWeights, engine_shapes


class RoseWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    def _rose_weights(self) -> EngineWeights:
        weights: EngineWeights | None = getattr(self, "_rose_engine_weights", None)
        if weights is None:
            weights = EngineWeights(self.model_runner.get_model(), self._rose_view())  # type: ignore[attr-defined]
            self._rose_engine_weights = weights
        return weights

    def _rose_view(self) -> ShardView | None:
        """This worker's rank of a tensor-parallel engine; None when the engine is not sharded."""
        parallel: Any = self.parallel_config  # type: ignore[attr-defined]
        if parallel.pipeline_parallel_size > 1:
            raise RoseError(f"pipeline_parallel_size = {parallel.pipeline_parallel_size}: ROSE updates rollout "
                            "engines sharded by tensor parallelism only; run the rollout engine in one stage")
        tp = int(parallel.tensor_parallel_size)
        return None if tp == 1 else ShardView(tp=tp, rank=int(self.rank) % tp)  # type: ignore[attr-defined]

    def rose_weights_check(self, model_dir: str) -> None:
        """At the engine's start: raise unless every parameter can be patched from the policy in ``model_dir``."""
        weights = self._rose_weights()
        weights.check(engine_shapes(model_dir, weights.view), model_dir)

    def rose_weights_stage(self, announce: bytes, secret: bytes, receiver_id: str, relay: str) -> None:
        """Start pulling the announced version (msgpack ``WeightAnnounce``) in the background."""
        order = msgspec.msgpack.decode(announce, type=WeightAnnounce)
        self._rose_weights().stage(order, secret=secret, receiver_id=receiver_id, relay=relay)

    def rose_weights_pulled(self, version: int, timeout_s: float) -> None:
        """Wait until this rank has pulled the staged ``version`` whole; raises if its pull failed."""
        self._rose_weights().pulled(version, timeout_s)

    def rose_weights_commit(self, version: int, timeout_s: float) -> dict[str, Any]:
        """Apply the staged ``version`` to this worker's parameters in place; what it took."""
        return self._rose_weights().commit(version, timeout_s).as_dict()

    def rose_weights_discard(self) -> None:
        self._rose_weights().discard()

    def rose_weights_forget(self) -> None:
        self._rose_weights().forget()

    def rose_weights_digest(self) -> str:
        return self._rose_weights().digest()

    def rose_lower_priority(self, nice: int, frontend_pid: int) -> int:
        """This worker's process and its engine core's at CPU priority ``nice`` (rollout work); threads set."""
        return lower_engine_worker(nice, frontend_pid)
