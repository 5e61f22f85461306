"""``rose-executor``: run this host's executor agent against a controller, or the co-serving benchmark.

``rose-executor --controller ADDR --role R --config F`` (what ``rose run`` and operators call) runs the agent,
as does ``rose-executor run ...`` with the same options; ``rose-executor bench`` runs the benchmark;
``rose-executor revoke ID`` takes a lent serving host back (``revoke_cli``). A
``RoseError`` ends as one line ``rose-executor: error: ...`` and exit status 2 (``rose_core.support.cli_support``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from rose_core.config.executor_config import load_executor_config
from rose_core.protocol.auth import executor_credential, load_secret
from rose_core.protocol.messages import Role
from rose_core.support.cli_support import LOG_FORMAT, RoseGroup
from rose_core.support.metrics import serve_metrics
from rose_core.support.quiet_teardown import silence_teardown
from rose_executor.bench.bench_cli import bench
from rose_executor.revoke_cli import revoke

PROGRAM = "rose-executor"
REQUIRED = ("controller", "role", "config_path")
F = TypeVar("F", bound=Callable[..., Any])


def agent_options(required: bool) -> Callable[[F], F]:
    """The agent's options; ``required`` only on ``run`` (the group checks them itself when it runs the agent,
    so that ``rose-executor bench`` needs none of them)."""

    def apply(f: F) -> F:
        options = [
            click.option("--controller", required=required, metavar="tcp://HOST:PORT",
                         help="The controller's control address."),
            click.option("--role", type=click.Choice(["dedicated", "serving"]), required=required,
                         help="What this host does."),
            click.option("--config", "config_path", required=required, type=click.Path(dir_okay=False),
                         help="Executor TOML config."),
            click.option("--executor-id", default=None, help="Unique id of this executor [default: HOSTNAME-ROLE]."),
            click.option("--secret-file", default=None, type=click.Path(dir_okay=False),
                         help="This executor's key file (executor-ID.key from its controller's run directory) or the "
                              "shared secret [default: $ROSE_SECRET_FILE or $ROSE_SECRET]."),
            click.option("--metrics-port", default=0, show_default=True, type=click.IntRange(0, 65535),
                         help="Prometheus port; 0 picks a free one."),
            click.option("--log-level", default="INFO", show_default=True,
                         type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"])),
            click.option("--parent-pid", default=None, type=int,
                         help="Stop when this process (the launcher, e.g. `rose run`) is gone."),
        ]  # fmt: skip
        for option in reversed(options):
            f = option(f)
        return f

    return apply


@click.group(
    cls=RoseGroup,
    program=PROGRAM,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@agent_options(required=False)
@click.pass_context
def cli(ctx: click.Context, /, **agent: Any) -> None:
    """Run the ROSE executor on this host until the controller or a signal stops it.

    `rose-executor bench --help`: the co-serving benchmark; `rose-executor revoke --help`: take a lent
    serving host back from its RL job."""
    given = [name for name in REQUIRED if agent[name] is not None]
    if ctx.invoked_subcommand is not None:
        if given:
            raise click.UsageError(
                f"the agent's options go without a subcommand, not before `{ctx.invoked_subcommand}`"
            )
        return
    for param in ctx.command.params:
        if param.name in REQUIRED and agent[param.name] is None:
            raise click.MissingParameter(ctx=ctx, param=param)
    run_agent(**agent)


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@agent_options(required=True)
def run(**agent: Any) -> None:
    """Run the ROSE executor on this host (the same as `rose-executor` with these options)."""
    run_agent(**agent)


cli.add_command(bench)
cli.add_command(revoke)


def run_agent(
    controller: str,
    role: Role,
    config_path: str,
    executor_id: str | None,
    secret_file: str | None,
    metrics_port: int,
    log_level: str,
    parent_pid: int | None = None,
) -> None:
    """Configure logging, load the config and the secret, serve metrics, run the agent; exit with its code."""
    silence_teardown()  # vLLM's imports load Triton, whose bindings report leaks at every exit
    logging.basicConfig(level=log_level, format=LOG_FORMAT, stream=sys.stderr)
    quiet = "WARNING" if log_level == "INFO" else log_level
    os.environ.setdefault("VLLM_LOGGING_LEVEL", quiet)
    logging.getLogger("vllm").setLevel(quiet)
    from rose_executor.agent import AgentOptions, ExecutorAgent

    config = load_executor_config(config_path)
    config.check_role(role)
    executor_id = executor_id or f"{socket.gethostname()}-{role}"
    credential = executor_credential(load_secret(secret_file), executor_id)
    metrics = serve_metrics(config.advertise_host, metrics_port)
    logging.getLogger(__name__).info("metrics on %s", metrics)
    options = AgentOptions(
        controller=controller,
        role=role,
        executor_id=executor_id,
        credential=credential,
        metrics_endpoint=metrics,
        parent_pid=parent_pid,
    )

    async def agent() -> int:
        return await ExecutorAgent(config, options).run()

    sys.exit(asyncio.run(agent()))


def main() -> None:
    cli(prog_name=PROGRAM)
