"""What every ROSE command line shares (``rose``, ``rose-tui``, ``rose-executor``, ``rose-transfer``): a
``RoseError`` ends the program as one line ``PROGRAM: error: ...`` on stderr with exit status 2, never as a
traceback; ``-v`` counts become a log level.

    @click.group(cls=RoseGroup, program="rose")        # or @click.command(cls=RoseCommand, program=...)
"""

from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

import click

from rose_core.support.errors import RoseError

EXIT_USAGE = 2
"""Exit status of an error the user can fix (bad config, missing secret, port in use), as click's own."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def fail(program: str, message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``PROGRAM: error: MESSAGE`` on stderr and exit with ``code``."""
    click.echo(f"{program}: error: {message}", err=True)
    sys.exit(code)


class RoseCommand(click.Command):
    """A click command whose ``RoseError``s end as one line ``PROGRAM: error: ...`` and exit 2."""

    def __init__(self, *args: Any, program: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.program = program

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RoseError as exc:
            fail(self.program, str(exc))


class RoseGroup(RoseCommand, click.Group):
    """A click group whose ``RoseError``s, its subcommands' included, end as one line and exit 2."""


def setup_logging(verbose: int) -> None:
    """``-v`` count to log level: none WARNING, ``-v`` INFO, ``-vv`` DEBUG."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format=LOG_FORMAT)
