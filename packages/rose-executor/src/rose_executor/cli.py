"""``rose-executor``: run this host's executor agent against a controller."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys

import click

from rose_core.auth import load_secret
from rose_core.errors import RoseError
from rose_core.metrics import serve_metrics
from rose_executor.config import load_executor_config


def main() -> None:
    """``rose-executor bench ...`` runs the co-serving benchmark; anything else runs the agent."""
    if sys.argv[1:2] == ["bench"]:
        from rose_executor.bench.bench_cli import bench

        bench(args=sys.argv[2:], prog_name="rose-executor bench")
    else:
        agent(prog_name="rose-executor")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--controller", required=True, metavar="tcp://HOST:PORT", help="The controller's control address.")
@click.option("--role", type=click.Choice(["dedicated", "serving"]), required=True, help="What this host does.")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False), help="Executor TOML config.")
@click.option("--executor-id", default=None, help="Unique id of this executor [default: HOSTNAME-ROLE].")
@click.option(
    "--secret-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Shared secret [default: $ROSE_SECRET_FILE or $ROSE_SECRET].",
)
@click.option(
    "--metrics-port",
    default=0,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Prometheus port; 0 picks a free one.",
)
@click.option(
    "--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"])
)
def agent(
    controller: str,
    role: str,
    config_path: str,
    executor_id: str | None,
    secret_file: str | None,
    metrics_port: int,
    log_level: str,
) -> None:
    """Run the ROSE executor on this host until the controller or a signal stops it.

    `rose-executor bench --help`: the co-serving benchmark."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    quiet = "WARNING" if log_level == "INFO" else log_level
    os.environ.setdefault("VLLM_LOGGING_LEVEL", quiet)
    logging.getLogger("vllm").setLevel(quiet)
    try:
        code = _run(
            controller, role, config_path, executor_id or f"{socket.gethostname()}-{role}", secret_file, metrics_port
        )
    except RoseError as exc:
        click.echo(f"rose-executor: error: {exc}", err=True)
        sys.exit(2)
    sys.exit(code)


def _run(
    controller: str, role: str, config_path: str, executor_id: str, secret_file: str | None, metrics_port: int
) -> int:
    from rose_executor.agent import AgentOptions, ExecutorAgent

    config = load_executor_config(config_path)
    config.check_role(role)  # type: ignore[arg-type]
    secret = load_secret(secret_file)
    metrics_endpoint = serve_metrics(config.advertise_host, metrics_port)
    options = AgentOptions(
        controller=controller,
        role=role,  # type: ignore[arg-type]
        executor_id=executor_id,
        secret=secret,
        metrics_endpoint=metrics_endpoint,
    )

    async def run() -> int:
        return await ExecutorAgent(config, options).run()

    return asyncio.run(run())
