"""ROSE transfer: moves each weight version from the trainer to every rollout engine."""

from rose_transfer._version import __version__
from rose_transfer.errors import TransferError
from rose_transfer.fetch.fetcher import WeightFetcher
from rose_transfer.resident.resident_weights import ResidentWeights
from rose_transfer.serve.publisher import DensePublisher
from rose_transfer.serve.shard_publisher import ShardPublisher
from rose_transfer.serve.sparse_publisher import SparsePublisher
from rose_transfer.version.fetched_version import FetchedVersion, load_arrays
from rose_transfer.version.manifest import DEFAULT_BUCKET_BYTES, FlatVersion, flatten, tensor_views

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "DensePublisher",
    "FetchedVersion",
    "FlatVersion",
    "ResidentWeights",
    "ShardPublisher",
    "SparsePublisher",
    "TransferError",
    "WeightFetcher",
    "__version__",
    "flatten",
    "load_arrays",
    "tensor_views",
]
