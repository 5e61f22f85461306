from __future__ import annotations

import re
from pathlib import Path

import pytest

from rose_core.app.config import RLConfig, RunConfig, load_config
from rose_core.app.rl.algorithm.loss_settings import LossSettings
from rose_core.config.sections import dump_toml, parse_toml
from rose_core.support.errors import ConfigError


def test_defaults_round_trip_through_toml(tmp_path: Path) -> None:
    path = tmp_path / "rose.toml"
    path.write_text(dump_toml(RunConfig()))
    assert load_config(path) == RunConfig()


def test_partial_config_overrides_only_what_it_names() -> None:
    cfg = parse_toml(b"[rl]\nsteps = 7\n", RunConfig)
    assert cfg.rl.steps == 7 and cfg.rl.group_size == RunConfig().rl.group_size


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        (b"[rl]\nsteps = 'three'\n", "field `rl.steps`: Expected `int`, got `str`"),
        (b"[rl]\nsteps = 0\n", "`steps` must be > 0"),
        (b"[rl]\ngroup_size = 1\n", "`group_size` must be >= 2"),
        (b"[schedular]\nx = 1\n", "unknown field `schedular`"),
        (b"[controller]\nport = 70000\n", "`port` must be in 0..65535"),
        (b"[slo]\nheadroom_fraction = 2.0\n", "headroom_fraction"),
        (b"[executors]\ndedicated = 0\nserving = 0\n", "need at least one executor"),
        (b"[load]\nmean_calm_s = 0\n", "`mean_calm_s` must be > 0"),
        (b"[load]\nmean_burst_s = -1.0\n", "`mean_burst_s` must be > 0"),
        (b"[load]\nprompt_tokens = 0\n", "`prompt_tokens` must be > 0"),
        (b"[controller]\nstatus_interval_s = 0\n", "`status_interval_s` must be > 0"),
        (b"[controller]\nmetrics_port = -1\n", "`metrics_port` must be in 0..65535"),
        (b"[controller]\nweights_port = 70000\n", "`weights_port` must be in 0..65535"),
        (b"[executors]\nstart_timeout_s = 0\n", "`start_timeout_s` must be > 0"),
        (b"[rl]\nweight_sync_timeout_s = 0\n", "`weight_sync_timeout_s` must be > 0"),
        (b"[rl]\nmax_context_tokens = 0\n", "`max_context_tokens` must be > 0"),
        (b"[rl.sampling]\ntemperature = -0.5\n", "`temperature` must be >= 0"),
        (b"steps = [", "not valid TOML"),
        (b"[rl.loss]\nclip_low = 0.3\nclip_high = 0.2\n", "`clip_high` 0.2 must be >= `clip_low` 0.3"),
        (b"[rl]\nalgorithm = 'dapo'\nloss.clip_low = 0.3\n", "`clip_high` 0.28 must be >= `clip_low` 0.3"),
        (b"[rl.loss]\nclip_low = 1.0\n", "`clip_low` 1.0 must be in (0, 1)"),
        (b"[rl]\nalgorithm = 'ppo'\n", "`algorithm` 'ppo' is not one of ['grpo', 'dapo']"),
        (b"[rl.loss]\nloss_agg = 'sum'\n", "`loss_agg` 'sum' is not one of ['token_mean', 'seq_mean_token_mean'"),
        (b"[rl.loss]\nkl_coef = -0.1\n", "`kl_coef` -0.1 must be >= 0"),
        (b"[rl.loss]\ntis_cap = 0.5\n", "`tis_cap` 0.5 must be >= 1"),
        (b"[rl.loss]\noverlong_buffer_tokens = 9\n", "`overlong_buffer_tokens` 9 must be <= `max_tokens_per_turn` 8"),
        (b"[rl.loss]\noverlong_penalty = -1.0\n", "`overlong_penalty` must be >= 0"),
        (b"[rl]\nenv = ''\n", "`env` '' is not an entry-point name"),
        (b"[rl]\nenv = 'frozen lake'\n", "`env` 'frozen lake' is not an entry-point name"),
    ],
)
def test_bad_configs_name_the_field_and_the_fix(toml: bytes, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_toml(toml, RunConfig, "my.toml")
    text = str(err.value)
    assert needle in text and "my.toml" in text
    assert "\n" not in text


def test_the_algorithm_fills_the_loss_fields_left_unset() -> None:
    grpo = parse_toml(b"[rl]\nalgorithm = 'grpo'\n", RunConfig).rl
    assert (grpo.loss.clip_low, grpo.loss.clip_high, grpo.loss.loss_agg, grpo.sampling.dynamic_sampling) == (
        0.2, 0.2, "seq_mean_token_mean", False)
    assert (grpo.loss.kl_coef, grpo.loss.tis_cap, grpo.loss.advantage_std_norm, grpo.loss.overlong_buffer_tokens) == (
        0.0, 2.0, True, 0)
    dapo = parse_toml(b"[rl]\nalgorithm = 'dapo'\n", RunConfig)
    assert (dapo.rl.loss.clip_low, dapo.rl.loss.clip_high, dapo.rl.loss.loss_agg, dapo.rl.sampling.dynamic_sampling) == (
        0.2, 0.28, "token_mean", True)
    assert RunConfig().rl.algorithm == "dapo"  # the demo's default (docs/rl_sweep.md)
    off = parse_toml(b"[rl]\nalgorithm = 'dapo'\nsampling.dynamic_sampling = false\n", RunConfig)
    assert off.rl.sampling.dynamic_sampling is False
    assert parse_toml(dump_toml(dapo), RunConfig) == dapo
    mine = parse_toml(b"[rl]\nalgorithm = 'dapo'\n[rl.loss]\nclip_high = 0.3\nloss_agg = 'seq_mean_token_sum_norm'\n", RunConfig)
    assert (mine.rl.loss.clip_low, mine.rl.loss.clip_high, mine.rl.loss.loss_agg) == (0.2, 0.3, "seq_mean_token_sum_norm")


def test_loss_settings_come_from_the_rl_section() -> None:
    rl = parse_toml(b"[rl]\nalgorithm = 'dapo'\nloss.kl_coef = 0.01\nloss.tis_cap = 3.0\n", RunConfig).rl
    settings = LossSettings.from_config(rl)
    assert settings == LossSettings(clip_low=0.2, clip_high=0.28, loss_agg="token_mean", kl_coef=0.01, tis_cap=3.0,
                                    max_response_tokens=rl.max_tokens_per_turn)
    grpo = RLConfig(algorithm="grpo")
    assert LossSettings.from_config(grpo) == LossSettings(max_response_tokens=grpo.max_tokens_per_turn)


@pytest.mark.parametrize(
    ("old", "new"),
    [("temperature = 0.7", "`temperature` under [rl.sampling]"), ("eval_every = 2", "`every` under [rl.eval]"),
     ('trainer = "external"', "`kind` under [rl.trainer]"), ("kl_coef = 0.1", "`kl_coef` under [rl.loss]"),
     ("checkpoint_every = 1", "`every` under [rl.checkpoint]"), ("lr = 1e-4", "`lr` under [rl.trainer]")],
)
def test_an_old_flat_rl_setting_names_its_new_place(tmp_path: Path, old: str, new: str) -> None:
    path = tmp_path / "old.toml"
    path.write_text(f"[rl]\n{old}\n")
    with pytest.raises(ConfigError, match=re.escape(f"has moved: write it as {new}")):
        load_config(path)
    path.write_text('[rl.trainer]\nkind = "external"\n')
    assert load_config(path).rl.trainer.external  # the section itself is not mistaken for the old name


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.toml")


CLUSTERS = b"""
[[clusters]]
name = "near"
executors = ["dedicated-0"]
relay = "none"

[[clusters]]
name = "far"
executors = ["serving-0"]
transport = "ucx"
"""


def test_clusters_place_executors_and_default_to_a_started_tcp_relay() -> None:
    config = parse_toml(CLUSTERS, RunConfig)
    near, far = config.clusters
    assert (near.name, near.executors, near.relay) == ("near", ["dedicated-0"], "none")
    assert (far.relay, far.transport) == ("start", "ucx")
    assert parse_toml(dump_toml(config), RunConfig) == config


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        (b'[[clusters]]\nname = "x"\nexecutors = ["serving-7"]\n', "this job runs ['dedicated-0', 'serving-0']"),
        (b'[[clusters]]\nname = "x"\nexecutors = []\n', "lists no `executors`"),
        (b'[[clusters]]\nexecutors = ["serving-0"]\n', "needs a `name`"),
        (b'[[clusters]]\nname = "x"\nexecutors = ["serving-0"]\nrelay = "udp://h:1"\n', "tcp:// / tls:// / ucx://"),
        (b'[[clusters]]\nname = "x"\nexecutors = ["serving-0"]\ntransport = "rdma"\n', "['tcp', 'ucx']"),
        (CLUSTERS + b'[[clusters]]\nname = "again"\nexecutors = ["serving-0"]\n', "in clusters 'far' and 'again'"),
        (CLUSTERS.replace(b'"far"', b'"near"'), "cluster names repeat"),
    ],
)
def test_bad_clusters_name_the_problem(toml: bytes, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_toml(toml, RunConfig)
    assert needle in str(err.value)


def test_the_model_section_names_local_directories_and_defaults_to_the_generated_ones() -> None:
    assert (RunConfig().model.policy, RunConfig().model.serving) == ("", "")
    config = parse_toml(b'[model]\npolicy = "/models/qwen2-0.5b"\n', RunConfig)
    assert (config.model.policy, config.model.serving) == ("/models/qwen2-0.5b", "")
    assert parse_toml(dump_toml(config), RunConfig) == config
    with pytest.raises(ConfigError, match="field `model`: Object contains unknown field `polcy`"):
        parse_toml(b'[model]\npolcy = "/models/x"\n', RunConfig)


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        (b"[ray]\nplacement_timeout_s = 0\n", "placement_timeout_s"),
        (b"[ray]\ndedicated_cpus = -1\n", "dedicated_cpus"),
        (b'[ray]\nserving_resource = ""\n', "names the custom resource on serving nodes"),
    ],
)
def test_bad_ray_settings_name_the_problem(toml: bytes, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_toml(toml, RunConfig)


def test_ray_is_off_unless_an_address_is_given() -> None:
    assert RunConfig().ray.address == ""
    assert parse_toml(b'[ray]\naddress = "10.0.0.1:6379"\n', RunConfig).ray.address == "10.0.0.1:6379"
