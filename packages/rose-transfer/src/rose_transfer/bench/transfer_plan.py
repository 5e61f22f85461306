"""``TransferPlan``: who sends which buckets of a version to whom, and how many bytes each hop carries.

Given the published version (its manifest, with shard specs), the trainer's layout (TP x PP, whose
ranks gather into the publisher inside the source cluster) and the receivers (cluster, TP degree,
rank), the plan routes: receivers in the source cluster pull from the publisher; each other cluster
with at least ``relay_min`` receivers gets one relay that pulls the union of its receivers' buckets
over the slow link and fans out locally; a lone receiver pulls directly. ``check`` proves the
invariant: the slow link into a cluster carries each bucket at most once, and every receiver gets
every bucket its shard needs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rose_core.protocol.messages import WeightManifest
from rose_core.support.errors import ConfigError, RoseError
from rose_transfer.bench.pipeline_layout import PipelineLayout
from rose_transfer.plan.shard_plan import needed_buckets, receiver_segments
from rose_transfer.plan.shard_spec import ShardSpec, local_shape
from rose_transfer.version.dtypes import storage_dtype

PUBLISHER = "publisher"


@dataclass(slots=True, frozen=True)
class Receiver:
    name: str
    cluster: int
    tp: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if self.tp < 1 or not 0 <= self.rank < self.tp or self.cluster < 0:
            raise ConfigError(
                f"receiver {self.name}: rank {self.rank} of TP {self.tp} in cluster {self.cluster} is invalid"
            )


@dataclass(slots=True, frozen=True)
class SourceLayout:
    tp: int = 1
    pp: int = 1
    cluster: int = 0
    num_layers: int = 0

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1 or self.cluster < 0:
            raise ConfigError(f"trainer layout TP {self.tp} x PP {self.pp} in cluster {self.cluster} is invalid")


@dataclass(slots=True, frozen=True)
class Hop:
    sender: str
    receiver: str
    buckets: tuple[int, ...]
    nbytes: int
    crosses: bool  # over the slow link between clusters


@dataclass(slots=True)
class TransferPlan:
    source: SourceLayout
    needed: dict[str, tuple[int, ...]]
    hops: list[Hop]
    route: dict[str, str]  # receiver -> where it pulls from
    trainer_rank_bytes: dict[str, int] = field(default_factory=dict)  # (tp, pp) rank -> bytes it gathers in

    @property
    def cross_cluster_bytes(self) -> int:
        return sum(h.nbytes for h in self.hops if h.crosses)

    @property
    def total_bytes(self) -> int:
        return sum(h.nbytes for h in self.hops)

    def check(self) -> None:
        """Raise ``RoseError`` unless each slow link carries each bucket at most once per destination
        cluster and each receiver's sender gets all the buckets it needs."""
        crossing: Counter[tuple[str, int]] = Counter()
        received: dict[str, set[int]] = {PUBLISHER: set().union(*self.needed.values()) if self.needed else set()}
        for hop in self.hops:
            received.setdefault(hop.receiver, set()).update(hop.buckets)
            if hop.crosses:
                crossing.update((_cluster_of(hop.receiver), b) for b in hop.buckets)
        repeated = [key for key, count in crossing.items() if count > 1]
        if repeated:
            raise RoseError(f"bucket {repeated[0][1]} crosses into {repeated[0][0]} {crossing[repeated[0]]} times")
        for name, needed in self.needed.items():
            if not set(needed) <= received.get(name, set()):
                raise RoseError(f"receiver {name} would miss buckets {sorted(set(needed) - received[name])[:5]}")

    def as_dict(self) -> dict[str, object]:
        return {
            "cross_cluster_bytes": self.cross_cluster_bytes,
            "total_bytes": self.total_bytes,
            "hops": [
                {"from": h.sender, "to": h.receiver, "buckets": len(h.buckets), "bytes": h.nbytes, "crosses": h.crosses}
                for h in self.hops
            ],
            "trainer_rank_bytes": self.trainer_rank_bytes,
        }


def _cluster_of(endpoint: str) -> str:
    return endpoint.split("/", 1)[0]


def endpoint(receiver: Receiver) -> str:
    return f"c{receiver.cluster}/{receiver.name}"


def relay_name(cluster: int) -> str:
    return f"c{cluster}/relay"


def plan_transfer(
    manifest: WeightManifest,
    receivers: Sequence[Receiver],
    source: SourceLayout | None = None,
    *,
    wire_bytes: Mapping[int, int] | None = None,
    relay_min: int = 2,
) -> TransferPlan:
    """Route ``manifest``'s version to ``receivers``; ``wire_bytes`` (bucket -> bytes on the wire, e.g.
    patch sizes) defaults to the dense bucket sizes."""
    source = source or SourceLayout()
    if len({r.name for r in receivers}) != len(receivers):
        raise ConfigError("receiver names must be unique")
    sizes = {b.index: (wire_bytes or {}).get(b.index, b.nbytes) for b in manifest.buckets}
    needed = {endpoint(r): tuple(_needed(manifest, r)) for r in receivers}
    hops: list[Hop] = []
    route: dict[str, str] = {}
    origin = f"c{source.cluster}/{PUBLISHER}"
    for cluster in sorted({r.cluster for r in receivers}):
        members = [endpoint(r) for r in receivers if r.cluster == cluster]
        remote = cluster != source.cluster
        sender = origin
        if remote and len(members) >= relay_min:
            union = tuple(sorted(set().union(*(needed[m] for m in members))))
            hops.append(Hop(origin, relay_name(cluster), union, sum(sizes[b] for b in union), True))
            sender = relay_name(cluster)
        for member in members:
            crosses = remote and sender == origin
            hops.append(Hop(sender, member, needed[member], sum(sizes[b] for b in needed[member]), crosses))
            route[member] = sender
    plan = TransferPlan(source, needed, hops, route, _trainer_rank_bytes(manifest, source))
    plan.check()
    return plan


def _needed(manifest: WeightManifest, receiver: Receiver) -> list[int]:
    return needed_buckets(manifest, receiver_segments(manifest.tensors, receiver.tp, receiver.rank))


def _trainer_rank_bytes(manifest: WeightManifest, source: SourceLayout) -> dict[str, int]:
    """Bytes each trainer rank (tp, pp) holds of the version, i.e. sends into the publisher."""
    layers = source.num_layers or _count_layers(manifest)
    stages = PipelineLayout(layers, source.pp)
    out: dict[str, int] = {}
    for entry in manifest.tensors:
        spec = ShardSpec.parse(entry.shard)
        stage = stages.stage_of(entry.name)
        itemsize = storage_dtype(entry.dtype).itemsize
        for rank in range(source.tp):
            count = 1
            for n in local_shape(spec, entry.shape, source.tp, rank):
                count *= n
            key = f"tp{rank}.pp{stage}"
            # replicated tensors are sent by tp rank 0 only
            if spec.sharded or rank == 0:
                out[key] = out.get(key, 0) + count * itemsize
    return out


def _count_layers(manifest: WeightManifest) -> int:
    import re

    found = [int(m.group(1)) for t in manifest.tensors if (m := re.search(r"layers\.(\d+)\.", t.name))]
    return max(found) + 1 if found else 1
