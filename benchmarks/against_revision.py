"""Run one benchmark command on this tree's packages and on a base revision's, alternating, in one invocation.

    python3 benchmarks/against_revision.py --base REV [--rounds 3] -- python3 benchmarks/gateway_overhead.py --json ...

The base revision is checked out (``git worktree``) into a temporary directory; each round runs the command
twice, once per tree, in alternating order (``base`` first in odd rounds), with ``PYTHONPATH`` naming that
tree's package sources: they come before the editable installs, so the command and every process it starts
(`rose run`, `rose-executor`) import that tree's code. The benchmark script itself is this tree's in both
runs, so both sides are measured the same way. The command must print one JSON object (alone, or as its last line);
what is printed is ``{"base": REV, "rounds": [{"base": {...}, "head": {...}}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rose-core", "rose-transfer", "rose-executor", "rose-tui")


def _pythonpath(tree: Path) -> str:
    return os.pathsep.join(str(tree / "packages" / p / "src") for p in PACKAGES)


def _run(command: list[str], tree: Path, label: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": _pythonpath(tree)}
    print(f"# {label}: {' '.join(command)}", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"{label}: the command ended rc {done.returncode}; run it alone to see why")
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        try:  # progress lines, then the JSON object on the last line
            result = json.loads(done.stdout.strip().splitlines()[-1])
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{label}: the command printed no JSON object ({exc}): give it --json") from exc
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the revision to compare against (a commit, tag or branch)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark command")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("give the benchmark command after --")
    rev = subprocess.run(["git", "rev-parse", "--short", args.base], check=False, cwd=ROOT, capture_output=True, text=True)
    if rev.returncode != 0:
        raise SystemExit(f"unknown revision {args.base!r}: {rev.stderr.strip()}")
    with tempfile.TemporaryDirectory(prefix="rose-base-") as tmp:
        base_tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base_tree), args.base], cwd=ROOT, check=True)
        try:
            rounds = []
            for r in range(args.rounds):
                order = [("base", base_tree), ("head", ROOT)]
                if r % 2:
                    order.reverse()
                rounds.append({label: _run(command, tree, f"round {r + 1} {label}") for label, tree in order})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)
    print(json.dumps({"base": rev.stdout.strip(), "command": command, "rounds": rounds}))


if __name__ == "__main__":
    main()
