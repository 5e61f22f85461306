"""``rose-executor bench [--json]``: the co-serving benchmark as a command (a table, or JSON)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

T = TypeVar("T")


def _with_stdout_on_stderr(work: Callable[[], T]) -> T:
    """Run ``work`` with file descriptor 1 pointing at stderr (vLLM and its engine processes log to stdout),
    so that stdout carries only the result."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        return work()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--seconds", default=8.0, show_default=True, type=click.FloatRange(1.0), help="Per configuration.")
@click.option(
    "--slo-multiple",
    default=1.5,
    show_default=True,
    type=click.FloatRange(1.0),
    help="SLOs = this multiple of the serving-alone p99 (median over 3 passes of the three levels).",
)
@click.option(
    "--repeats",
    default=3,
    show_default=True,
    type=click.IntRange(1),
    help="Runs of the whole sequence; every figure is the median over them (min / max under `spread`).",
)
@click.option(
    "--models-dir",
    default=str(Path.home() / ".cache" / "rose" / "bench-models"),
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the tiny models are generated (once).",
)
@click.option(
    "--device-model",
    default="batch",
    show_default=True,
    type=click.Choice(["cfs", "batch"]),
    help="How the engines' workers share their core: batch = SCHED_BATCH, no wakeup preemption (serving waits "
    "for the rollout worker's slice, like work on a time-sliced GPU); cfs = the kernel's default (a waking "
    "serving worker preempts the rollout at once, doing the guard's job).",
)
def bench(as_json: bool, seconds: float, slo_multiple: float, repeats: int, models_dir: str, device_model: str) -> None:
    """Serving alone / co-located without the guard / with the guard, at low, medium and high bursty load.

    The rollout engine (chunked prefill, 512-token chunks) runs 32 turns of 512-895-token prompts and 128
    output tokens. harvest_ratio = the rollout's share of the device time serving left in the same window
    (worker CPU time; both engines compute on the same cores, so 1.0 is the ceiling), for the guarded and
    the unguarded rollout."""
    logging.basicConfig(level="WARNING", stream=sys.stderr)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from rose_executor.bench.co_serving_bench import run_bench

    result = _with_stdout_on_stderr(lambda: asyncio.run(run_bench(Path(models_dir), seconds, slo_multiple, repeats, device_model)))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"SLO ({result['slo_multiple']}x serving-alone p99): TTFT {result['slo_ttft_ms']:.1f} ms, "
        f"TPOT {result['slo_tpot_ms']:.1f} ms; medians of {result['repeats']} repeats [min-max]"
    )
    click.echo(
        f"{'level':8} {'config':10} {'TTFT p99':>10} {'TPOT p99':>10} {'SLO att':>19} {'rollout tok/s':>14} "
        f"{'device share serving/rollout':>29}"
    )
    for level, rows in result["levels"].items():
        for config in ("alone", "unguarded", "guarded"):
            r, lo_hi = rows[config], result["spread"][level][config]["slo_attainment"]
            click.echo(
                f"{level:8} {config:10} {r['serving_ttft_p99_ms']:8.1f}ms {r['serving_tpot_p99_ms']:8.1f}ms "
                f"{r['slo_attainment']:6.3f} [{lo_hi[0]:.3f}-{lo_hi[1]:.3f}] {r['rollout_tokens_per_s']:14.0f} "
                f"{r['serving_device_share']:19.2f} / {r['rollout_device_share']:.2f}"
            )
        click.echo(
            f"{level:8} harvest_ratio guarded {rows['harvest_ratio']:.2f}, unguarded {rows['harvest_ratio_unguarded']:.2f}"
        )
    click.echo(
        f"rollout alone {result['rollout_alone_tokens_per_s']:.0f} tok/s, "
        f"device share {result['rollout_alone_device_share']:.2f}"
    )
    act = result["activation"]["activation_ms"]
    click.echo(f"activation (inactive -> first rollout token): median {act['median']:.1f} ms, max {act['max']:.1f} ms")
