"""What the interpreter's teardown writes to stderr (a third-party extension's leak report) stays off the
terminal; what the command wrote before, and an uncaught exception's traceback, do not."""

from __future__ import annotations

import os
import subprocess
import sys

PROGRAM = """
import os
import sys
from rose_core.support.quiet_teardown import silence_teardown


class Leaky:  # like an extension module's bindings: it reports on stderr when the interpreter tears it down
    def __del__(self, write=os.write):
        write(2, b"nanobind: leaked 64 types!\\n")


sys.modules["leaky_extension"] = type(sys)("leaky_extension")
sys.modules["leaky_extension"].bindings = Leaky()
if "--silence" in sys.argv:
    silence_teardown()
print("learning curve", flush=True)
print("a warning before exit", file=sys.stderr)
if "--fail" in sys.argv:
    raise RuntimeError("the run failed")
"""


def run(*args: str, keep: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROSE_TEARDOWN_STDERR"}
    if keep:
        env["ROSE_TEARDOWN_STDERR"] = "1"
    return subprocess.run([sys.executable, "-c", PROGRAM, *args], check=False, capture_output=True, text=True,
                          env=env, timeout=60)


def test_the_teardown_report_is_dropped_and_nothing_else() -> None:
    loud = run()
    assert "nanobind: leaked" in loud.stderr  # the noise this module exists for
    quiet = run("--silence")
    assert quiet.stdout == "learning curve\n" and quiet.stderr == "a warning before exit\n" and quiet.returncode == 0
    failed = run("--silence", "--fail")
    assert "RuntimeError: the run failed" in failed.stderr and failed.returncode == 1
    assert "nanobind" not in failed.stderr
    assert "nanobind: leaked" in run("--silence", keep=True).stderr  # ROSE_TEARDOWN_STDERR=1 keeps it
