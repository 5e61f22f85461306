"""The trainer's resumable state: fp32 policy parameters, optimizer state by parameter name, torch RNG.

Invariant: after ``load_trainer_state`` into a model and optimizer built the same way as the saved ones, the
next optimizer step is bit-identical to the step the saving process would have taken next. ``policy.safetensors``
holds ``model.named_parameters()`` as they are (buffers come from the model directory); ``optimizer.safetensors``
holds each parameter's state tensors as ``state/<name>/<key>`` (AdamW: ``step``, ``exp_avg``, ``exp_avg_sq``),
the torch generators as ``rng/<device>``, and in its metadata (``rose.optimizer``, JSON) the optimizer class,
its parameter groups by name with their hyperparameters, and any non-tensor state. No pickle anywhere.

``save_checkpoint`` and ``load_checkpoint`` put that together with ``rose_core.app.rl.trainer.checkpoint_dir`` (the
folder layout, atomic writes, keep-last-K) and ``rose_core.app.rl.trainer.host_rng`` (Python and NumPy generators).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from itertools import chain
from pathlib import Path
from typing import Any

from rose_core.app.rl.trainer.checkpoint_dir import (
    OPTIMIZER_FILE,
    POLICY_FILE,
    CheckpointError,
    CheckpointState,
    read_state,
    resolve,
    write_checkpoint,
)
from rose_core.app.rl.trainer.host_rng import capture_host_rng, restore_host_rng
from rose_core.support.errors import require_extra

with require_extra("torch and safetensors (trainer checkpoints)", "rose-core[train]"):
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

log = logging.getLogger(__name__)

_LAYOUT_KEY = "rose.optimizer"
_FIX_MODEL = "resume with the model and optimizer it was trained with, or start without --resume"


def save_checkpoint(
    root: Path,
    *,
    step: int,
    weight_version: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: Mapping[str, Any],
    keep: int,
    trainer_steps: int | None = None,
    rl: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``root/step-NNNNNN`` atomically (the trainer's tensors, every generator, ``extra`` and ``rl`` as
    JSON) and keep the newest ``keep`` checkpoints; returns the new folder. ``trainer_steps`` defaults to
    ``step``."""
    state = CheckpointState(
        step=step,
        weight_version=weight_version,
        trainer_steps=step if trainer_steps is None else trainer_steps,
        rl=dict(rl or {}),
        extra=dict(extra),
        rng=capture_host_rng(),
    )
    rng = torch_rng_state()
    return write_checkpoint(root, state, lambda folder: save_trainer_state(model, optimizer, rng, folder), keep=keep)


def load_checkpoint(path_or_root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> CheckpointState:
    """Restore a checkpoint folder (or the newest one under a directory) into ``model`` and ``optimizer``,
    and set the torch, Python and NumPy generators; returns what ``state.json`` holds."""
    folder = resolve(path_or_root)
    state = read_state(folder, verify=True)
    rng = load_trainer_state(model, optimizer, folder)
    set_torch_rng_state(rng)
    restore_host_rng(state.rng)
    log.info("resumed from %s (step %d, weight version %d)", folder, state.step, state.weight_version)
    return state


def save_trainer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, rng: Mapping[str, torch.Tensor], target_dir: Path
) -> None:
    """Write ``policy.safetensors`` and ``optimizer.safetensors`` into ``target_dir``; ``rng`` is
    ``torch_rng_state()`` (taken by the caller, before anything else draws from it)."""
    names = _names_by_id(model)
    policy = {name: param.detach().contiguous() for name, param in model.named_parameters()}
    save_file(policy, str(target_dir / POLICY_FILE), metadata={"format": "pt"})
    tensors, layout = _optimizer_tensors(optimizer, names)
    tensors.update({f"rng/{device}": state.contiguous() for device, state in rng.items()})
    save_file(tensors, str(target_dir / OPTIMIZER_FILE), metadata={"format": "pt", _LAYOUT_KEY: json.dumps(layout)})


def load_trainer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, source_dir: Path
) -> dict[str, torch.Tensor]:
    """Copy the saved parameters into ``model`` and load the saved state into ``optimizer`` (both checked
    before either is touched); returns the saved torch generator states for ``set_torch_rng_state``."""
    policy, _ = _read_safetensors(source_dir / POLICY_FILE)
    tensors, metadata = _read_safetensors(source_dir / OPTIMIZER_FILE)
    _check_policy(model, policy, source_dir)
    names = _names_by_id(model)
    state_dict = _optimizer_state_dict(optimizer, names, tensors, _layout(metadata, source_dir), source_dir)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(policy[name])
    optimizer.load_state_dict(state_dict)
    return {key.removeprefix("rng/"): value for key, value in tensors.items() if key.startswith("rng/")}


def torch_rng_state() -> dict[str, torch.Tensor]:
    """The CPU generator's state, and each CUDA device's once CUDA is initialised."""
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states.update({f"cuda:{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())})
    return states


def set_torch_rng_state(states: Mapping[str, torch.Tensor]) -> None:
    """Set the generators ``torch_rng_state`` captured (CUDA ones only where they were captured)."""
    torch.set_rng_state(states["cpu"])
    cuda = sorted((int(key.removeprefix("cuda:")), state) for key, state in states.items() if key != "cpu")
    if cuda:
        if len(cuda) != torch.cuda.device_count():
            raise CheckpointError(
                f"the checkpoint holds {len(cuda)} CUDA generator states and this process sees "
                f"{torch.cuda.device_count()} devices: resume with the same CUDA_VISIBLE_DEVICES"
            )
        torch.cuda.set_rng_state_all([state for _, state in cuda])


def _names_by_id(model: torch.nn.Module) -> dict[int, str]:
    return {id(param): name for name, param in model.named_parameters()}


def _name(names: Mapping[int, str], param: torch.Tensor) -> str:
    try:
        return names[id(param)]
    except KeyError:
        raise CheckpointError(
            f"the optimizer holds a {tuple(param.shape)} tensor that is not a parameter of the model: "
            "build the optimizer from model.parameters()"
        ) from None


def _optimizer_tensors(
    optimizer: torch.optim.Optimizer, names: Mapping[int, str]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The optimizer's state tensors by ``state/<name>/<key>``, and the JSON layout that says the rest."""
    groups = [
        {"params": [_name(names, p) for p in group["params"]],
         "hyper": {k: _json_value(k, v) for k, v in group.items() if k != "params"}}
        for group in optimizer.param_groups
    ]
    tensors: dict[str, torch.Tensor] = {}
    state: dict[str, Any] = {}
    for param, values in optimizer.state.items():
        name = _name(names, param)
        entry: dict[str, Any] = {"tensors": [], "scalars": {}}
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state/{name}/{key}"] = value.detach().contiguous()
                entry["tensors"].append(key)
            else:
                entry["scalars"][key] = _json_value(key, value)
        state[name] = entry
    return tensors, {"class": type(optimizer).__name__, "groups": groups, "state": state}


def _optimizer_state_dict(
    optimizer: torch.optim.Optimizer,
    names: Mapping[int, str],
    tensors: Mapping[str, torch.Tensor],
    layout: Mapping[str, Any],
    source: Path,
) -> dict[str, Any]:
    """The saved layout in ``optimizer.load_state_dict``'s form, numbered like this optimizer's parameters."""
    if layout["class"] != type(optimizer).__name__:
        raise CheckpointError(
            f"checkpoint {source} holds {layout['class']} state, not {type(optimizer).__name__}: {_FIX_MODEL}"
        )
    current = [[_name(names, p) for p in group["params"]] for group in optimizer.param_groups]
    saved = [group["params"] for group in layout["groups"]]
    if current != saved:
        raise CheckpointError(f"checkpoint {source} has other optimizer parameter groups than this one: {_FIX_MODEL}")
    index = {name: i for i, name in enumerate(chain.from_iterable(current))}
    groups = [
        {**_like(group, saved_group["hyper"]), "params": [index[n] for n in saved_group["params"]]}
        for group, saved_group in zip(optimizer.param_groups, layout["groups"], strict=True)
    ]
    state = {
        index[name]: {**entry["scalars"], **{key: tensors[f"state/{name}/{key}"] for key in entry["tensors"]}}
        for name, entry in layout["state"].items()
    }
    return {"state": state, "param_groups": groups}


def _check_policy(model: torch.nn.Module, saved: Mapping[str, torch.Tensor], source: Path) -> None:
    params = dict(model.named_parameters())
    problems = [f"{n} missing" for n in sorted(set(params) - set(saved))][:3]
    problems += [f"{n} unexpected" for n in sorted(set(saved) - set(params))][:3]
    problems += [
        f"{n} is {saved[n].dtype}{list(saved[n].shape)}, the model's {p.dtype}{list(p.shape)}"
        for n, p in params.items()
        if n in saved and (saved[n].shape != p.shape or saved[n].dtype != p.dtype)
    ][:3]
    if problems:
        raise CheckpointError(f"checkpoint {source} is of another model ({'; '.join(problems)}): {_FIX_MODEL}")


def _layout(metadata: Mapping[str, str] | None, source: Path) -> dict[str, Any]:
    try:
        layout: dict[str, Any] = json.loads((metadata or {})[_LAYOUT_KEY])
    except (KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{source / OPTIMIZER_FILE} has no readable {_LAYOUT_KEY} metadata ({exc!r}): "
            "delete that folder to resume from the previous checkpoint"
        ) from exc
    return layout


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: pass a complete checkpoint folder (see rose_core.app.rl.trainer.checkpoint_dir)")
    with safe_open(str(path), framework="pt") as data:
        return {key: data.get_tensor(key) for key in data.keys()}, data.metadata()  # noqa: SIM118


def _json_value(key: str, value: Any) -> Any:
    """A hyperparameter or state scalar as JSON (tuples become lists; ``_like`` turns them back)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [_json_value(key, v) for v in value]
    raise CheckpointError(
        f"optimizer setting {key}={value!r} ({type(value).__name__}) cannot be saved as JSON: "
        "give the optimizer plain numbers (e.g. lr as a float, not a tensor)"
    )


def _like(current: Mapping[str, Any], saved: Mapping[str, Any]) -> dict[str, Any]:
    """``saved`` with lists back as tuples where this optimizer's group holds tuples (AdamW's ``betas``)."""
    return {
        key: tuple(value) if isinstance(current.get(key), tuple) and isinstance(value, list) else value
        for key, value in saved.items()
    }
