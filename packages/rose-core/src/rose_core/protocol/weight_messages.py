"""The weight channels' messages (rose-transfer): a version's manifest and buckets as receivers fetch them, and
the shard intake through which an outside trainer's ranks publish. Rules: ``rose_core.protocol.messages``."""

from __future__ import annotations

import msgspec
import numpy as np

from rose_core.protocol.message_base import Message

# ---------------------------------------------------------------- weight transfer channel (rose-transfer)


class TensorEntry(msgspec.Struct, kw_only=True):
    """One tensor of a weight version: where its bytes sit in the version's flat byte stream."""

    name: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int
    shard: str = "replicated"


class BucketInfo(msgspec.Struct, kw_only=True):
    """A contiguous byte range of the flat stream, moved and checked as one unit."""

    index: int
    offset: int
    nbytes: int
    checksum: str
    encoding: str = "dense"
    wire_bytes: int = 0


class ShardView(msgspec.Struct, frozen=True, kw_only=True):
    """Rank ``rank`` of tensor-parallel degree ``tp``: a receiver that holds only its shard of each
    tensor, laid out as its engine's local tensors (a version's view for it has its own buckets)."""

    tp: int
    rank: int


class WeightManifest(Message, tag="weight_manifest"):
    version: int
    base_version: int
    total_bytes: int
    bucket_bytes: int
    tensors: list[TensorEntry]
    buckets: list[BucketInfo]
    digest: str
    view: ShardView | None = None  # set: this is the version as ``view`` holds it (local tensors)
    source_digest: str = ""  # of a view: the digest of the whole version (what announces carry)


class FetchManifest(Message, tag="fetch_manifest"):
    version: int
    have_version: int = -1
    receiver_id: str = ""
    view: ShardView | None = None  # only this shard of every tensor


class FetchBucket(Message, tag="fetch_bucket"):
    version: int
    index: int
    have_version: int = -1
    receiver_id: str = ""
    view: ShardView | None = None  # a bucket of the version's view for this shard


class BucketData(Message, tag="bucket_data"):
    version: int
    index: int
    encoding: str
    checksum: str
    data: np.ndarray


# ---------------------------------------------------------------- shard intake (trainer ranks -> publisher)


class ShardOffer(Message, tag="shard_offer"):
    """Rank ``rank`` of a tensor-parallel group of ``ranks`` offers its part of weight version
    ``version``: its local tensors (``TensorEntry`` of its own layout; ``shard``: the spec text, the
    same on every rank). No byte moves before every rank has offered a consistent layout."""

    version: int
    step: int
    rank: int
    ranks: int
    tensors: list[TensorEntry]


class ShardAccepted(Message, tag="shard_accepted"):
    """Every rank offered a consistent layout: send the local bytes of ``send``, in that order (the
    tensors this rank's bytes fill; a replicated tensor comes from one rank only), each tensor in
    ``ShardPart``s of ``part_bytes`` (the last one shorter)."""

    version: int
    rank: int
    send: list[str]
    part_bytes: int


class ShardPart(Message, tag="shard_part"):
    """Bytes ``[offset, offset + data.nbytes)`` of a rank's local tensor ``name`` (its travel form)."""

    version: int
    rank: int
    name: str
    offset: int
    data: np.ndarray
