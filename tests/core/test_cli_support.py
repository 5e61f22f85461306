"""The shared command-line behaviour: a RoseError is one line ``PROGRAM: error: ...`` and exit 2."""

from __future__ import annotations

import click
from click.testing import CliRunner

from rose_core.support.cli_support import EXIT_USAGE, RoseCommand, RoseGroup
from rose_core.support.errors import ConfigError


@click.group(cls=RoseGroup, program="prog")
def group() -> None:
    """A group."""


@group.command()
def broken() -> None:
    raise ConfigError("`x` must be > 0: fix it")


@click.command(cls=RoseCommand, program="single")
@click.option("--fail", is_flag=True)
def single(fail: bool) -> None:
    if fail:
        raise ConfigError("no shared secret: set ROSE_SECRET_FILE")
    click.echo("ok")


def test_a_subcommand_error_is_one_line_naming_the_program() -> None:
    result = CliRunner().invoke(group, ["broken"])
    assert result.exit_code == EXIT_USAGE == 2
    assert result.output == "prog: error: `x` must be > 0: fix it\n"


def test_a_single_command_error_is_one_line_naming_the_program() -> None:
    assert CliRunner().invoke(single, []).output == "ok\n"
    result = CliRunner().invoke(single, ["--fail"])
    assert result.exit_code == 2
    assert result.output == "single: error: no shared secret: set ROSE_SECRET_FILE\n"
