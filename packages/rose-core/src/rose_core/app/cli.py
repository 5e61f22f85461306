"""The `rose` command line."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import msgspec

from rose_core import __version__
from rose_core.app.config import RunConfig, load_config
from rose_core.config.sections import dump_toml
from rose_core.protocol.messages import StepStatus
from rose_core.support.cli_support import RoseGroup, setup_logging
from rose_core.support.quiet_teardown import silence_teardown

if TYPE_CHECKING:
    from rose_core.app.jobs.step_report import StepReport
    from rose_core.app.sim.scenario_run import Progress

PROGRAM = "rose"
INTERRUPTED_EXIT = 130
"""`rose run` / `rose controller` stopped by Ctrl-C or SIGTERM (the report is still written, with error "interrupted").
SIGUSR1 instead stops them cleanly after the step in flight (a checkpoint then if checkpointing is on): exit 0
when the steps run are ok, ``stopped_after_step`` in the report."""


@click.group(cls=RoseGroup, program=PROGRAM)
@click.version_option(__version__, prog_name=PROGRAM)
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """ROSE: agentic RL rollouts on the idle capacity of a serving fleet, without breaking its SLOs."""
    silence_teardown()  # third-party teardown reports stay off the terminal, after the command's last line
    setup_logging(verbose)


def job_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options `rose run` and `rose controller` share."""
    options = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML file over the defaults."),
        click.option("--steps", type=click.IntRange(min=1), help="RL steps to run (overrides rl.steps)."),
        click.option("--seed", type=int, help="Seed of the maps and the trainer (overrides rl.seed; docs/rl.md, Seeds)."),
        click.option("--resume", "resume_path", type=click.Path(exists=True),
                     help="Continue from this checkpoint (a step-NNNNNN folder, or the newest in a directory)."),
        click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the JSON report here."),
        click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
                     help="Draw reward, success and step phases into this PNG (needs rose-core[sim])."),
        click.option("--port", type=click.IntRange(0, 65535), help="Controller port (overrides controller.port)."),
        click.option("--env", help="The environment (overrides rl.env): frozenlake, a rose.environments plugin, or "
                                   "gateway (agents bring their turns; docs/gateway.md)."),
        click.option("--ray", "ray_address", metavar="ADDRESS",
                     help="Place the executors as actors of this Ray cluster (its head's HOST:PORT, or auto; "
                          "overrides ray.address; docs/deploy.md)."),
        click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of a table."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@dataclass(frozen=True, slots=True)
class JobOptions:
    config_path: str | None
    steps: int | None
    seed: int | None
    resume_path: str | None
    report_path: str | None
    plot_path: str | None
    port: int | None
    env: str | None
    ray_address: str | None
    as_json: bool


@main.command()
@job_options
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False),
              help="Use this shared secret (the one a `rose-transfer relay` elsewhere was given) instead of a new "
                   "one in run_dir.")
def run(secret_file: str | None, **options: Any) -> None:
    """Run the embedded job: controller, executors, production traffic and RL steps, on this machine.

    Ctrl-C or SIGTERM stops it now (exit 130); SIGUSR1 stops it cleanly after the step in flight."""
    _run_job(JobOptions(**options), spawn=True, secret_file=secret_file)


@main.command()
@job_options
@click.option("--secret-file", type=click.Path(dir_okay=False), help="Shared secret (else $ROSE_SECRET_FILE).")
def controller(secret_file: str | None, **options: Any) -> None:
    """Run the controller and trainer for executors started on their own hosts (a real fleet), or placed as
    actors of a Ray cluster (`--ray`).

    Ctrl-C or SIGTERM stops it now (exit 130); SIGUSR1 stops it cleanly after the step in flight."""
    _run_job(JobOptions(**options), spawn=False, secret_file=secret_file)


@main.command("executor-key")
@click.argument("executor_id")
@click.option("--secret-file", type=click.Path(dir_okay=False), help="Shared secret (else $ROSE_SECRET_FILE).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="Where to write it [default: executor-ID.key].")
def executor_key(executor_id: str, secret_file: str | None, out_path: str | None) -> None:
    """Write EXECUTOR_ID's key file, what its host gets instead of the shared secret: it speaks to the controller
    only as EXECUTOR_ID and fetches weights (docs/security.md). Start it with `rose-executor --executor-id
    EXECUTOR_ID --secret-file FILE`."""
    from rose_core.protocol.auth import load_secret, write_executor_key

    path = Path(out_path or f"executor-{executor_id}.key")
    write_executor_key(path, load_secret(secret_file), executor_id)
    click.echo(f"wrote {path} (mode 0600): executor {executor_id}'s key")


@main.command()
@click.argument("models_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the two model directories as JSON.")
def models(models_dir: str, as_json: bool) -> None:
    """Generate the embedded demo's tokenizer, policy and serving model into MODELS_DIR (once: a complete,
    unchanged cache is reused). Needs rose-core[train]."""
    from rose_core.app.rl.demo.models import ensure_models

    paths = ensure_models(Path(models_dir))
    found = {"policy": str(paths.policy), "serving": str(paths.serving)}
    click.echo(json.dumps(found) if as_json else f"policy {paths.policy}\nserving {paths.serving}")


def _job_config(opts: JobOptions) -> RunConfig:
    config = load_config(opts.config_path)
    if opts.steps is not None:
        config.rl.steps = opts.steps
    if opts.seed is not None:
        config.rl.seed = opts.seed
    if opts.port is not None:
        config.controller.port = opts.port
    if opts.env is not None:
        config.rl.env = opts.env
    if opts.ray_address is not None:
        config.ray.address = opts.ray_address
    return config


def _run_job(opts: JobOptions, *, spawn: bool, secret_file: str | None) -> None:
    # SIGUSR1 asks the run to stop after the step in flight (the run's own handler, decision 327); before the steps
    # (imports, start-up) and after them (the report being written) it is ignored, never its default (terminate)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    from rose_core.app.run.learning_curve import learning_curve
    from rose_core.app.run.rose_run import run as run_job
    from rose_core.app.run.run_plot import plot_run, pyplot
    from rose_core.app.run.run_report import format_table, step_row, sync_summary

    config = _job_config(opts)
    spawn = spawn or bool(config.ray.address)  # `rose controller --ray`: it places the executors too
    if opts.plot_path:
        pyplot()  # before the run: a missing extra fails first, not after the last step
    as_json = opts.as_json
    say = (lambda text: click.echo(text, err=True)) if as_json else click.echo
    live = sys.stderr.isatty() and not as_json
    progress = _progress_printer(live)
    printed_header = [False]

    def on_step(step: StepReport) -> None:
        if as_json:
            return
        table = format_table([step]).splitlines()
        if live:
            click.echo("\r" + " " * 100 + "\r", nl=False, err=True)
        if not printed_header[0]:
            click.echo("\n".join(table[:2]))
            printed_header[0] = True
        click.echo(table[2] if len(table) > 2 else "  ".join(step_row(step)))

    try:
        report = run_job(config, say, progress=progress, on_step=on_step, spawn=spawn, secret_file=secret_file,
                         resume=Path(opts.resume_path) if opts.resume_path else None)
    except KeyboardInterrupt:
        click.echo("rose: interrupted", err=True)
        sys.exit(INTERRUPTED_EXIT)
    data = report.to_dict()
    if opts.report_path:
        Path(opts.report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.report_path).write_text(json.dumps(data, indent=2))
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        _print_summary(data, opts.report_path, sync_summary(report.steps))
        if report.steps:
            click.echo("\n" + "\n".join(learning_curve(report.steps)))
    if opts.plot_path and report.steps:
        plot_run(report.steps, Path(opts.plot_path))
        say(f"plot: {opts.plot_path}")
    sys.exit(INTERRUPTED_EXIT if report.error == "interrupted" else 0 if report.ok else 1)


def _progress_printer(enabled: bool) -> Callable[[StepStatus], None]:
    def show(status: StepStatus) -> None:
        if enabled:
            line = (f"step {status.step} [{status.phase}] v{status.weight_version}  trajectories "
                    f"{status.trajectories_done}/{status.trajectories_total}  turns running {status.turns_in_flight}"
                    f" queued {status.turns_queued}")
            click.echo("\r" + line.ljust(100), nl=False, err=True)
    return show


def _print_summary(data: dict[str, Any], report_path: str | None, sync_line: str = "") -> None:
    click.echo(
        f"\nok={data['ok']}  lost_trajectories={data['lost_trajectories']}  "
        f"version_mismatches={data['version_mismatches']}  turns_rerouted={data['turns_rerouted']} "
        f"(overdue {data['turns_overdue']}, held moved {data['turns_held_moved']})  "
        f"serving requests={data['serving_requests']} (failed {data['serving_failed_requests']})"
    )
    if data["serving_slo"]:
        hosts = ", ".join(f"{eid} TTFT<={s['ttft_ms']:.1f}ms TPOT<={s['tpot_ms']:.1f}ms"
                          for eid, s in data["serving_slo"].items())
        held = ", ".join(f"{e['executor_id']} {e['guard_hold_seconds']:.1f} s" for e in data["executors"]
                         if e["role"] == "serving")
        click.echo(f"serving SLO violations {data['serving_slo_violations']} of {data['serving_slo_judged']} "
                   f"requests judged by their hosts ({hosts}; the guard's own budgets; by the load generator's "
                   f"clock, HTTP and its process included: {data['client_slo_violations']}); the guard held rollout "
                   f"turns {held}, turns served there {sum(s['turns_serving'] for s in data['steps'])}")
    if data["failed_trajectories"] or data["refused_results"]:
        click.echo(f"failed_trajectories={data['failed_trajectories']} (a turn failed past scheduler.turn_retries)  "
                   f"refused_results={data['refused_results']}")
    if sync_line:
        click.echo(sync_line)
    if data["error"]:
        click.echo(f"stopped early: {data['error']}")
    if report_path:
        click.echo(f"report: {report_path}")


@main.command()
@click.option("--scenario", "scenario_name", default="paper-8b", show_default=True,
              help="A shipped scenario (paper-8b, paper-32b, scale-1024) or a TOML file.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of tables.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Draw per-step figures into this PNG.")
@click.option("--bench-scheduler", is_flag=True, help="Benchmark the scheduler's routing decision instead.")
def sim(scenario_name: str, as_json: bool, plot_path: str | None, bench_scheduler: bool) -> None:
    """Simulate a cluster: ROSE against resource-fixed and resource-elastic baselines, in simulated time."""
    if bench_scheduler:
        from rose_core.app.sim.bench_scheduler import bench_scheduler as run_bench

        result = run_bench().to_dict()
        click.echo(json.dumps(result, indent=2) if as_json else
                   "  ".join(f"{k}={v}" for k, v in result.items()))
        return
    from rose_core.app.sim import load_scenario, run_scenario, to_json
    from rose_core.app.sim.scenario_run import critical_path
    from rose_core.app.sim.system_result import critical_path_line, format_table

    scenario = load_scenario(scenario_name)
    if plot_path:
        from rose_core.app.sim.plot import pyplot

        pyplot()
    results = run_scenario(scenario, _sim_progress(sys.stderr.isatty()))
    if plot_path:
        from rose_core.app.sim.plot import plot_results

        plot_results(plot_path, scenario, results)
    if as_json:
        click.echo(json.dumps(to_json(scenario, results), indent=2))
        return
    for algorithm, res in results.items():
        click.echo(format_table(f"\n{scenario.name} / {algorithm} ({scenario.workload.steps} steps)", res.systems))
        click.echo(critical_path_line(critical_path(res)))
    if plot_path:
        click.echo(f"\nplot: {plot_path}")


def _sim_progress(enabled: bool) -> Progress | None:
    if not enabled:
        return None

    def show(label: str, steps: int) -> None:
        click.echo("\r" + f"simulating {label}: step {steps}".ljust(60), nl=False, err=True)
    return show


@main.group()
def bench() -> None:
    """Benchmarks of the running system."""


@bench.command("e2e")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="The job, as a `rose run` TOML over the defaults [default: the demo with the bench's workload].")
@click.option("--steps", type=click.IntRange(min=2), default=10, show_default=True, help="RL steps per system.")
@click.option("--systems", default=",".join(("fixed", "fixed-async", "rose", "colocated")), show_default=True,
              help="Comma-separated systems to run after serving alone.")
@click.option("--slo-multiple", type=click.FloatRange(min=1.0, max=4.0), default=1.5, show_default=True,
              help="The SLO: this multiple of serving alone's p99 TTFT and TPOT.")
@click.option("--alone-s", type=click.FloatRange(min=1.0), default=30.0, show_default=True,
              help="Seconds of serving alone judged after its SLO is measured.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON ({\"systems\": {...}}).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Also write the JSON here.")
def bench_e2e(config_path: str | None, steps: int, systems: str, slo_multiple: float, alone_s: float,
              as_json: bool, report_path: str | None) -> None:
    """The same RL job under each system on this machine (the trainer and dedicated pool on some cores, the
    serving host on the others): samples/s, rollout time, serving SLO attainment, reward (docs/benchmarks.md)."""
    from rose_core.app.run.e2e_bench import bench_e2e as run_bench
    from rose_core.app.run.e2e_bench import format_e2e
    from rose_core.app.run.e2e_systems import base_config
    from rose_core.app.run.rose_run import require_extras

    require_extras()
    base = load_config(config_path) if config_path else base_config()
    say = (lambda text: click.echo(text, err=True)) if as_json else click.echo
    names = [s.strip() for s in systems.split(",") if s.strip()]
    try:
        result = run_bench(base, steps=steps, systems=names, slo_multiple=slo_multiple, alone_s=alone_s, say=say)
    except KeyboardInterrupt:
        click.echo("rose: interrupted", err=True)
        sys.exit(INTERRUPTED_EXIT)
    if report_path:
        Path(report_path).write_text(json.dumps(result, indent=2))
    click.echo(json.dumps(result, indent=2) if as_json else format_e2e(result))
    sys.exit(0 if all(f.get("ok") for f in result["systems"].values()) else 1)


@main.group()
def config() -> None:
    """Inspect configuration."""


@config.command("show")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Show this file merged over defaults.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of TOML.")
def config_show(config_path: str | None, as_json: bool) -> None:
    """Print every setting with its value (defaults unless --config)."""
    cfg = load_config(config_path) if config_path else RunConfig()
    click.echo(msgspec.json.format(msgspec.json.encode(cfg)).decode() if as_json else dump_toml(cfg))


if __name__ == "__main__":
    main()
