"""Apply a staged version to ``ResidentWeights`` whole or not at all.

Under the target's lock: every patch is written in place with an undo log (O(changes)), each patched
bucket's checksum is compared with the manifest's, and on any mismatch the log puts every old word
back and the failed buckets are returned (to be pulled again, dense). Only then are dense buckets
placed: checked on arrival, they cannot fail. A full sync of an unpinned target swaps buffers."""

from __future__ import annotations

import numpy as np

from rose_core.protocol.messages import WeightManifest
from rose_transfer.codec.sparse_patch import PatchError, overwritten_bytes
from rose_transfer.errors import TransferError
from rose_transfer.resident.in_place_patch import patch_in_place
from rose_transfer.resident.resident_weights import ResidentWeights
from rose_transfer.resident.undo_log import UndoLog


def commit(
    target: ResidentWeights,
    manifest: WeightManifest,
    patches: dict[int, np.ndarray],
    dense: set[int],
    staging: np.ndarray | None,
) -> list[int]:
    """Make ``target`` hold ``manifest.version``; returns the buckets that failed (nothing applied)."""
    with target.lock:
        failed = _patch_all(target, manifest, patches)
        if failed:
            return failed
        _place_dense(target, manifest, dense, staging, whole=not patches)
        target.set_version(manifest, frozenset(patches) | frozenset(dense))
    return []


def _patch_all(target: ResidentWeights, manifest: WeightManifest, patches: dict[int, np.ndarray]) -> list[int]:
    if patches and target.stream.nbytes != manifest.total_bytes:
        raise TransferError("patches came for weights of another size: the fetch must be a full sync")
    undo, failed = target.undo, []
    undo.start(sum(overwritten_bytes(payload) for payload in patches.values()))
    try:
        for index, payload in sorted(patches.items()):
            if not _patched(target, manifest, index, payload, undo):
                failed.append(index)
    except BaseException:
        undo.rollback()
        raise
    if failed:
        undo.rollback()
    undo.clear()
    return failed


def _patched(target: ResidentWeights, manifest: WeightManifest, index: int, payload: np.ndarray, undo: UndoLog) -> bool:
    """Patch bucket ``index`` in place; whether it now has the manifest's checksum."""
    info = manifest.buckets[index]
    bucket = target.stream[info.offset : info.offset + info.nbytes]
    try:
        return patch_in_place(payload, bucket, undo) == info.checksum
    except PatchError:
        return False


def _place_dense(
    target: ResidentWeights, manifest: WeightManifest, dense: set[int], staging: np.ndarray | None, *, whole: bool
) -> None:
    if not dense or staging is None:
        return
    if whole and not target.pinned:
        target.swap_in(staging)
        return
    if target.stream.nbytes != manifest.total_bytes:
        raise TransferError(
            f"the bound weights hold {target.stream.nbytes} bytes, version {manifest.version} has "
            f"{manifest.total_bytes}: bind a model of this version's shapes"
        )
    for index in sorted(dense):
        info = manifest.buckets[index]
        target.stream[info.offset : info.offset + info.nbytes] = staging[info.offset : info.offset + info.nbytes]
    target.keep_spare(staging)
