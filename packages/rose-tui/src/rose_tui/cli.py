"""``rose-tui --connect tcp://HOST:PORT``: the live dashboard of a ROSE controller."""

from __future__ import annotations

import click

from rose_core.protocol.auth import as_observer, load_secret
from rose_core.support.cli_support import RoseCommand
from rose_tui import __version__

PROGRAM = "rose-tui"


@click.command(cls=RoseCommand, program=PROGRAM, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--connect",
    "address",
    required=True,
    metavar="tcp://HOST:PORT",
    help="The controller's control address.",
)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The observer key file `rose run` writes (.rose/run/observer.key), or the shared secret, from which "
    "the dashboard derives the observer key and holds nothing more (default: $ROSE_SECRET_FILE, else $ROSE_SECRET).",
)
@click.option(
    "--stall-after",
    type=click.FloatRange(min=0.5),
    default=3.0,
    show_default=True,
    help="Seconds without a status before the controller is shown as unreachable.",
)
@click.option("--encrypt", is_flag=True, help="The controller encrypts its control socket ([controller] encrypt).")
@click.version_option(__version__, prog_name=PROGRAM)
def main(address: str, secret_file: str | None, stall_after: float, encrypt: bool) -> None:
    """Live dashboard of a ROSE controller: executors, the RL step, serving latency against the SLO."""
    from rose_tui.app import RoseTui
    from rose_tui.status_feed import StatusFeed

    # read-only: it can watch, nothing else
    feed = StatusFeed(address, as_observer(load_secret(secret_file)), encrypt=encrypt)
    RoseTui(feed, stall_after_s=stall_after).run()
