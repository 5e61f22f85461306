"""Validate the deployment examples under deploy/ (run by `nox -s lint`).

A KubeRay ``RayCluster`` is a custom resource, which kubernetes-validate has no schema for, so this checks it in
two parts: the RayCluster's own fields that ROSE relies on (a head, worker groups with sane replica bounds,
string-valued ``rayStartParams``, and a serving group that declares the ``rose_serving_gpu`` resource), and every
pod template in it as a standalone ``Pod`` with kubernetes-validate in strict mode (unknown or misspelt fields
fail). Exit status 1 with one line per problem.

    python tools/check_deploy.py [deploy/*.yaml]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

SERVING_RESOURCE = "rose_serving_gpu"


def check_raycluster(doc: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    if doc.get("apiVersion") != "ray.io/v1" or doc.get("kind") != "RayCluster":
        return [f"expected apiVersion ray.io/v1, kind RayCluster; got {doc.get('apiVersion')} {doc.get('kind')}"]
    if not doc.get("metadata", {}).get("name"):
        problems.append("metadata.name is missing")
    spec = doc.get("spec", {})
    head = spec.get("headGroupSpec")
    if not isinstance(head, dict):
        return [*problems, "spec.headGroupSpec is missing"]
    problems += _start_params("headGroupSpec", head) + _pod("headGroupSpec", head)
    groups = spec.get("workerGroupSpecs") or []
    if not groups:
        problems.append("spec.workerGroupSpecs is empty: ROSE needs a serving group (and usually a rollout group)")
    serving = 0
    for group in groups:
        name = f"workerGroupSpecs[{group.get('groupName', '?')}]"
        if not group.get("groupName"):
            problems.append(f"{name}: groupName is missing")
        low, count, high = group.get("minReplicas", 0), group.get("replicas", 0), group.get("maxReplicas", 0)
        if not all(isinstance(v, int) for v in (low, count, high)) or not 0 <= low <= count <= high:
            problems.append(f"{name}: need 0 <= minReplicas <= replicas <= maxReplicas (got {low}, {count}, {high})")
        problems += _start_params(name, group) + _pod(name, group)
        serving += _serving_units(name, group, problems)
    if groups and not serving:
        problems.append(f"no worker group declares the {SERVING_RESOURCE} resource (rayStartParams.resources)")
    return problems


def _start_params(name: str, group: dict[str, Any]) -> list[str]:
    params = group.get("rayStartParams")
    if not isinstance(params, dict):
        return [f"{name}: rayStartParams must be a mapping"]
    return [f"{name}: rayStartParams.{k} must be a string (KubeRay passes them to `ray start`), got {v!r}"
            for k, v in params.items() if not isinstance(v, str)]


def _serving_units(name: str, group: dict[str, Any], problems: list[str]) -> int:
    raw = (group.get("rayStartParams") or {}).get("resources")
    if not isinstance(raw, str):
        return 0
    try:  # KubeRay's form: a quoted JSON string, '"{\"rose_serving_gpu\": 8}"'
        resources = json.loads(json.loads(raw) if raw.startswith('"') else raw)
    except (json.JSONDecodeError, TypeError) as exc:
        problems.append(f"{name}: rayStartParams.resources is not JSON ({exc})")
        return 0
    units = resources.get(SERVING_RESOURCE, 0)
    if SERVING_RESOURCE in resources and not (isinstance(units, int | float) and units > 0):
        problems.append(f"{name}: {SERVING_RESOURCE} must be a positive number (one per serving GPU)")
    return int(units) if isinstance(units, int | float) else 0


def _pod(name: str, group: dict[str, Any]) -> list[str]:
    template = group.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        return [f"{name}: template.spec is missing"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "template"}, "spec": template["spec"]}
    try:
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{name}: pod template: {exc.message} at {'.'.join(map(str, exc.path))}"]
    return []


def main(paths: list[str]) -> int:
    files = [Path(p) for p in paths] or sorted(Path("deploy").glob("*.yaml"))
    problems = []
    for path in files:
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            problems += [f"{path}[{index}]: {p}" for p in check_raycluster(doc or {})]
    for problem in problems:
        print(problem)
    if not problems:
        print(f"deploy examples valid: {', '.join(map(str, files))}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
