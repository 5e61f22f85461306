"""The environments the RL job can play, by name (``[rl] env``).

Built-ins first, then the entry-point group ``rose.environments``: a package registers a factory there
(``corridor = "my_pkg.corridor:make_corridor"`` under ``[project.entry-points."rose.environments"]``) and
``pip install``-ing it makes the name available; nothing in ROSE imports the package. ``frozenlake`` is built
in, so it resolves whether or not rose-core's own entry points are installed (an editable install of another
checkout, a source tree on ``PYTHONPATH``); a plugin cannot shadow a built-in name.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points

from rose_core.app.rl.environments.environment import EnvironmentFactory
from rose_core.app.rl.environments.frozenlake import make_frozenlake
from rose_core.support.errors import RoseError

ENTRY_POINT_GROUP = "rose.environments"
BUILTIN_ENVIRONMENTS: Mapping[str, EnvironmentFactory] = {"frozenlake": make_frozenlake}


def installed_environments() -> list[str]:
    """Every name ``load_environment`` resolves: the built-ins and the installed plugins, sorted."""
    return sorted({*BUILTIN_ENVIRONMENTS, *_plugins()})


def load_environment(name: str) -> EnvironmentFactory:
    """The factory registered as ``name``; ``RoseError`` naming the fix when there is none or it fails to load."""
    if name in BUILTIN_ENVIRONMENTS:
        return BUILTIN_ENVIRONMENTS[name]
    plugin = _plugins().get(name)
    if plugin is None:
        raise RoseError(
            f"no environment {name!r} in the entry-point group {ENTRY_POINT_GROUP} (installed: "
            f"{', '.join(installed_environments())}): pip install the package that provides it, or fix `rl.env`"
        )
    return _load(plugin)


def _plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _load(plugin: EntryPoint) -> EnvironmentFactory:
    where = f"environment {plugin.name!r} ({plugin.value}, entry-point group {ENTRY_POINT_GROUP})"
    try:
        factory = plugin.load()
    except Exception as exc:
        raise RoseError(
            f"{where} failed to load: {type(exc).__name__}: {exc}; fix or reinstall the package that provides it"
        ) from exc
    if not callable(factory):
        raise RoseError(
            f"{where} is a {type(factory).__name__}, not callable: point the entry point at a factory "
            "`(seed: int, rl: RLConfig) -> Environment`"
        )
    return factory  # type: ignore[no-any-return]
