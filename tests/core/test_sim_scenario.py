"""Scenario files, traffic statistics and the trace loader of `rose sim`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rose_core.app.sim import load_scenario, shipped_scenarios
from rose_core.app.sim.harvest_curve import HarvestCurve
from rose_core.app.sim.traffic import load_azure_trace, synthetic_traffic
from rose_core.support.errors import ConfigError


def test_shipped_scenarios_load_with_the_papers_setups() -> None:
    assert {"paper-8b", "paper-32b", "scale-1024"} <= set(shipped_scenarios())
    small, big = load_scenario("paper-8b"), load_scenario("paper-32b")
    assert (small.cluster.training_gpus, small.cluster.dedicated_rollout_gpus, small.cluster.borrowable_gpus) == (8, 8, 16)
    assert (big.cluster.training_gpus, big.cluster.dedicated_rollout_gpus, big.cluster.borrowable_gpus) == (32, 16, 64)
    assert (small.workload.group_size, small.workload.batch, big.workload.batch) == (16, 256, 1024)
    scale = load_scenario("scale-1024")
    c = scale.cluster
    assert c.training_gpus + c.dedicated_rollout_gpus + c.borrowable_gpus == 1024 and scale.workload.steps == 50


@pytest.mark.parametrize(("text", "field"), [
    ("[workload]\nbatch = 100\n", "workload"),
    ("[gpu]\npeak_tflops = -1\n", "gpu"),
    ("[cluster]\nborrowable_gpus = 7\n[rollout_model]\ntp = 4\n", "borrowable_gpus"),
    ("systems = [\"fixed\", \"warp-drive\"]\n", "systems"),
    ("[serving]\nbogus = 1\n", "bogus"),
])
def test_bad_user_scenarios_fail_in_one_line_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_scenario(str(path))
    message = str(err.value)
    assert field in message and "\n" not in message


def test_unknown_scenario_names_the_shipped_ones() -> None:
    with pytest.raises(ConfigError, match="paper-8b"):
        load_scenario("no-such-scenario")


def test_synthetic_traffic_matches_the_azure_observations() -> None:
    t = synthetic_traffic(3, 4.22, 1.7, 1000, 200)
    assert t.per_second.mean() == pytest.approx(1.0)
    assert t.peak_to_mean(1) == pytest.approx(4.22, rel=0.01)
    assert t.peak_to_mean(60) == pytest.approx(1.7, rel=0.03)


def test_azure_trace_csv_is_binned_per_second(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:46.9,100,10\n"
                    "2023-11-16 18:15:48.1,226,6\n")
    t = load_azure_trace(path)
    assert list(t.per_second) == pytest.approx([2.0, 0.0, 1.0])
    assert (t.prompt_tokens_mean, t.output_tokens_mean) == (700 / 3, 20.0)
    path.write_text("when,what\n1,2\n")
    with pytest.raises(ConfigError, match="TIMESTAMP"):
        load_azure_trace(path)


def test_harvest_curve_inverts_its_integral() -> None:
    curve = HarvestCurve(np.array([1.0, 0.0, 0.5, 0.25]))
    assert curve.finish_time(0.0, 1.0) == pytest.approx(1.0)
    assert curve.finish_time(0.5, 1.0) == pytest.approx(3.0)  # 0.5 in s0, nothing in s1, 0.5 in s2
    assert curve.finish_time(0.0, 3.5) == pytest.approx(8.0)  # two full periods of 1.75
    for t0, work in ((0.3, 0.7), (2.2, 5.0), (9.9, 0.01)):
        end = curve.finish_time(t0, work)
        assert curve.integral(end) - curve.integral(t0) == pytest.approx(work)
