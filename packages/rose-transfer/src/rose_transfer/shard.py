"""Shard-aware transfer, one import: specs, their inference, pipeline stages, and the copy plans that
give each receiver (tensor-parallel degree d, rank r) exactly the bytes of its slice."""

from rose_transfer.pipeline_layout import PipelineLayout
from rose_transfer.shard_inference import ModelShape, infer_shard_spec
from rose_transfer.shard_plan import CopySegment, assemble, needed_buckets, plan_tensor, receiver_segments
from rose_transfer.shard_spec import KINDS, Section, ShardSpec, local_shape, rank_intervals

__all__ = [
    "KINDS",
    "CopySegment",
    "ModelShape",
    "PipelineLayout",
    "Section",
    "ShardSpec",
    "assemble",
    "infer_shard_spec",
    "local_shape",
    "needed_buckets",
    "plan_tensor",
    "rank_intervals",
    "receiver_segments",
]
