"""``rose-transfer bench``: the dense broadcast of today's systems against ROSE's shard-aware, sparse,
relayed transfer, over loopback on this host, with the slow inter-cluster link modelled.

Everything runs in one process: the publisher and each relay on their own event-loop threads, the
receivers as asyncio tasks on the main thread (hashing, decoding and copying release the GIL).
Cluster 0 holds the publisher. ``link_gbps`` rate-limits, per destination cluster, one shared link
that every connection crossing into that cluster passes through (a token bucket in the sender);
both systems cross the same links. Every receiver holds its weights in memory (``ResidentWeights``)
and neither system writes a file.

(a) baseline: every receiver pulls the whole new version dense from the publisher into memory, then
    trims its slice.
(b) ROSE: every receiver holds version 0 (fetched before timing) as its shard view: its rank's slice
    of every tensor, laid out as its engine's local tensors (``shard_view``). It pulls that view's
    buckets as patches against version 0, applied in place (``fetch_into``); clusters other than the
    publisher's pull through one relay each. Nothing to trim: what it holds is its engine's weights.
    (With ``--dest-tp 1`` it holds the whole version, pulls the buckets its plan needs, and trims.)
Both timings run from the announcement until every receiver holds its slice; every slice is then
compared with the publisher's version bit for bit. The two systems alternate ``repeat`` times on the
same version pair; ``speedup`` compares the medians. The publisher keeps what it built for a version
(signed dense frames; shard views and signed patches), so only the first run of each system pays for
it: ``first_speedup`` compares those first runs (what one RL step, whose version is always new, sees)."""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from rose_core.protocol.messages import ShardView, WeightAnnounce
from rose_core.support.errors import ConfigError
from rose_transfer.bench.codec_speed import CodecSpeed, codec_speed
from rose_transfer.bench.link_pacer import LinkPacer, open_link
from rose_transfer.bench.model import adam_versions, llama_shape, shard_specs
from rose_transfer.bench.progress import BenchProgress
from rose_transfer.bench.raw_ceiling import raw_tcp_gbps, raw_ucx_gbps
from rose_transfer.bench.receivers import ReceiverRun, Slicer, digests, fetch_and_trim
from rose_transfer.bench.transfer_plan import Receiver, SourceLayout, TransferPlan, plan_transfer
from rose_transfer.fetch.fetcher import WeightFetcher
from rose_transfer.plan.shard_plan import assemble
from rose_transfer.resident.resident_weights import ResidentWeights
from rose_transfer.serve.relay import Relay
from rose_transfer.serve.sparse_publisher import SparsePublisher

MIB = 1024 * 1024


@dataclass(slots=True, frozen=True)
class BenchConfig:
    params: int = 300_000_000
    receivers: int = 4
    clusters: int = 2
    source_tp: int = 1
    dest_tp: int = 2
    transport: str = "tcp"
    lr: float = 1e-6
    link_gbps: float | None = None
    bucket_bytes: int = 64 * MIB
    seed: int = 0
    repeat: int = 3

    def __post_init__(self) -> None:
        if self.receivers < 1 or self.clusters < 1 or self.receivers < self.clusters:
            raise ConfigError(f"need >= 1 receiver per cluster, got {self.receivers} in {self.clusters} clusters")
        if self.dest_tp not in (1, 2, 4, 8) or self.source_tp not in (1, 2, 4, 8):
            raise ConfigError("--source-tp and --dest-tp must be 1, 2, 4 or 8")
        if self.transport not in ("tcp", "ucx"):
            raise ConfigError(f"unknown transport {self.transport!r}: use tcp or ucx")
        if self.lr <= 0 or (self.link_gbps is not None and self.link_gbps <= 0):
            raise ConfigError("--lr and --link-gbps must be positive")
        if self.repeat < 1:
            raise ConfigError(f"--repeat must be >= 1, got {self.repeat}")

    def layout(self) -> list[Receiver]:
        """Receivers spread over clusters in contiguous groups; ranks cycle within a cluster."""
        out = []
        for i in range(self.receivers):
            cluster = i * self.clusters // self.receivers
            first = next(j for j in range(self.receivers) if j * self.clusters // self.receivers == cluster)
            out.append(Receiver(f"r{i}", cluster, self.dest_tp, (i - first) % self.dest_tp))
        return out


class _Setup:
    """The publisher, the links into other clusters, the receivers' slicers and held weights."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.secret = secrets.token_bytes(32)
        self.publisher = SparsePublisher(secret=self.secret, host="127.0.0.1", port=0, bucket_bytes=cfg.bucket_bytes)
        self.receivers = cfg.layout()
        self.pacers = {c: LinkPacer.from_gbps(cfg.link_gbps, f"c{c}") for c in range(1, cfg.clusters)}
        self.main = self.publisher.open_ucx() if cfg.transport == "ucx" else self.publisher.source
        self.links = {c: open_link(self.publisher, p, cfg.transport) for c, p in self.pacers.items()}
        self.slicers: dict[str, Slicer] = {}
        self.held = _Held()

    def source_for(self, receiver: Receiver) -> str:
        return self.links[receiver.cluster] if receiver.cluster else self.main

    def crossed(self) -> int:
        return sum(p.carried for p in self.pacers.values())

    def close(self) -> None:
        self.publisher.close()


def run_transfer_bench(cfg: BenchConfig, progress: BenchProgress | None = None) -> dict[str, Any]:
    bar = progress or BenchProgress(8, enabled=False)
    setup = _Setup(cfg)
    try:
        return _run(setup, bar)
    finally:
        setup.close()
        bar.finish()


@dataclass(slots=True)
class _Held:
    """What each receiver holds in memory: ROSE's (version 0 before each run) and the baseline's."""

    rose: dict[str, ResidentWeights] = field(default_factory=dict)
    dense: dict[str, ResidentWeights] = field(default_factory=dict)
    rose_base: dict[str, Any] = field(default_factory=dict)  # the manifest of version 0 as each holds it


def _run(setup: _Setup, bar: BenchProgress) -> dict[str, Any]:
    cfg = setup.cfg
    bar.stage("Adam step (fp32 master -> bf16)")
    shape = llama_shape(cfg.params, 8)
    v0, v1 = adam_versions(shape, cfg.lr, cfg.seed)
    shards = shard_specs(shape)
    a0 = setup.publisher.publish(0, 0, v0, shards=shards)
    started = time.perf_counter()
    a1 = setup.publisher.publish(1, 1, v1, shards=shards)
    publish_seconds = time.perf_counter() - started
    del v0, v1
    new, old = setup.publisher.stream(1), setup.publisher.stream(0)
    manifest = _manifest(setup, a1)
    setup.slicers = {r.name: Slicer.of(manifest.tensors, r.tp, r.rank) for r in setup.receivers}
    bar.stage("codec speed (one core)")
    speed = codec_speed(old, new, manifest)
    bar.stage("raw TCP ceiling")
    ceiling = raw_ucx_gbps(new) if cfg.transport == "ucx" else raw_tcp_gbps(new)
    bar.stage("dense fetch (transport speed)")
    transport = asyncio.run(_dense_speed(setup, msgspec.structs.replace(a0, source=setup.main)))
    bar.stage("receivers take version 0 (untimed)")
    fetchers = asyncio.run(_take_base(setup, a0, manifest))
    bar.stage(f"baseline and ROSE, alternating x{cfg.repeat}")
    baselines, roses = [], []
    for _ in range(cfg.repeat):
        baselines.append(_timed(setup, lambda: _baseline(setup, a1)))
        _restore_base(setup)
        roses.append(_rose_phase(setup, a1, fetchers, manifest))
    baseline, rose = _median(baselines), _median(roses)
    bar.stage("bit-exact check")
    expected = {r.name: setup.slicers[r.name].digests(_slices(setup.slicers[r.name], new)) for r in setup.receivers}
    exact = speed.exact and all(r.digests == expected[r.name] for phase in (*baselines, *roses) for r in phase.runs)
    plan = plan_transfer(manifest, setup.receivers, SourceLayout(cfg.source_tp), wire_bytes=speed.wire_bytes)
    measured = {"params": shape.params(), "dense_bytes": manifest.total_bytes, "ceiling_gbps": ceiling}
    measured |= {"transport_gbps": transport, "publish_seconds": publish_seconds, "bit_exact": exact}
    measured["repeats"] = {
        "baseline_seconds": [p.seconds for p in baselines],
        "rose_seconds": [p.seconds for p in roses],
    }
    return _result(cfg, measured, speed, plan, baseline, rose)


def _manifest(setup: _Setup, announce: WeightAnnounce) -> Any:
    async def get() -> Any:
        from rose_transfer.fetch.transfer_client import TransferClient

        client = await TransferClient.connect(announce.source, secret=setup.secret, receiver_id="bench", timeout=30)
        try:
            return await client.fetch_manifest(announce.version, -1, "bench")
        finally:
            client.close()

    return asyncio.run(get())


@dataclass(slots=True)
class _Phase:
    """One timed system: its receivers' runs, seconds, bytes over the slow links, bytes into relays."""

    runs: list[ReceiverRun]
    seconds: float
    crossed: int
    cpu_seconds: float
    relayed: int = 0


def _slices(slicer: Slicer, stream: np.ndarray) -> dict[str, np.ndarray]:
    """The slices ``slicer`` should hold, copied straight from the publisher's stream."""
    return {name: assemble(plan, [stream], np.empty_like(slicer.weights[name])) for name, plan in slicer.plans.items()}


def _median(phases: list[_Phase]) -> _Phase:
    return sorted(phases, key=lambda p: p.seconds)[len(phases) // 2]


def _rose_phase(setup: _Setup, a1: WeightAnnounce, fetchers: dict[str, WeightFetcher], manifest: Any) -> _Phase:
    """One timed ROSE transfer through fresh relays (so every run crosses the slow links itself)."""
    relays = _relays(setup)
    try:
        phase = _timed(setup, lambda: _rose(setup, a1, fetchers, relays, manifest), setup.held.rose)
        phase.relayed = sum(relay.upstream_bytes for relay in relays.values())
        return phase
    finally:
        for relay in relays.values():
            relay.close()


def _timed(setup: _Setup, make: Any, held: dict[str, ResidentWeights] | None = None) -> _Phase:
    """Run ``make()`` timed; then (untimed) digest what each receiver holds: its trimmed slices, or
    its shard view in ``held``."""
    crossed = setup.crossed()
    started, cpu = time.perf_counter(), time.process_time()
    runs = asyncio.run(make())
    phase = _Phase(runs, time.perf_counter() - started, setup.crossed() - crossed, time.process_time() - cpu)
    for run in runs:  # untimed: what each receiver holds now, before the next run overwrites it
        viewed = held[run.name] if held is not None and _view(setup, run.name) else None
        run.digests = digests(viewed.arrays()) if viewed is not None else setup.slicers[run.name].digests()
    return phase


async def _dense_speed(setup: _Setup, announce: WeightAnnounce) -> float:
    """One receiver's dense fetch into memory, warm (buffers touched, the publisher's frames signed),
    best of 3 like the ceiling. On version 0, so that the timed baseline still pays for signing
    version 1 as ROSE pays to encode it."""
    fetcher, held = WeightFetcher(setup.secret, "transport"), ResidentWeights()
    held.reserve(announce.total_bytes)
    seconds = []
    for _ in range(4):
        held.forget()
        seconds.append((await fetcher.fetch_into(announce, held)).seconds)
    return announce.total_bytes / min(seconds[1:]) / 1e9


async def _take_base(setup: _Setup, a0: WeightAnnounce, manifest: Any) -> dict[str, WeightFetcher]:
    plan = plan_transfer(manifest, setup.receivers)
    a0 = msgspec.structs.replace(a0, source=setup.main)
    fetchers = {r.name: WeightFetcher(setup.secret, r.name) for r in setup.receivers}
    setup.held.rose = {r.name: ResidentWeights() for r in setup.receivers}
    setup.held.dense = {r.name: ResidentWeights() for r in setup.receivers}
    for held in setup.held.dense.values():
        held.reserve(manifest.total_bytes)  # as warm as the ROSE receivers' memory
    await asyncio.gather(
        *(
            fetchers[r.name].fetch_into(a0, setup.held.rose[r.name], **_shard_of(setup, r, plan))
            for r in setup.receivers
        )
    )
    setup.held.rose_base = {name: held.manifest for name, held in setup.held.rose.items()}
    return fetchers


def _view(setup: _Setup, name: str) -> ShardView | None:
    """The shard view receiver ``name`` holds (None: the whole version, with ``--dest-tp 1``)."""
    receiver = next(r for r in setup.receivers if r.name == name)
    return ShardView(tp=receiver.tp, rank=receiver.rank) if receiver.tp > 1 else None


def _shard_of(setup: _Setup, receiver: Receiver, plan: TransferPlan) -> dict[str, Any]:
    """How ``receiver`` pulls its shard: as a view, or (``--dest-tp 1``) the buckets its plan needs."""
    view = _view(setup, receiver.name)
    return {"view": view} if view is not None else {"buckets": plan.needed[_ep(receiver)]}


def _restore_base(setup: _Setup) -> None:
    """Untimed: every ROSE receiver holds version 0 again (its buckets), as before the first run."""
    for name, held in setup.held.rose.items():
        if held.version != 0:
            held.stream[:] = setup.publisher.stream(0, _view(setup, name))
            held.set_version(setup.held.rose_base[name], held.valid)


def _ep(receiver: Receiver) -> str:
    return f"c{receiver.cluster}/{receiver.name}"


async def _baseline(setup: _Setup, a1: WeightAnnounce) -> list[ReceiverRun]:
    tasks = []
    for r in setup.receivers:
        announce = msgspec.structs.replace(a1, source=setup.source_for(r))
        fetcher, held = WeightFetcher(setup.secret, f"dense-{r.name}"), setup.held.dense[r.name]
        held.forget()  # today's systems hold no base: every version is a full broadcast
        fetch = functools.partial(fetcher.fetch_into, announce, held)
        tasks.append(fetch_and_trim(r.name, fetch, held, setup.slicers[r.name]))
    return list(await asyncio.gather(*tasks))


def _relays(setup: _Setup) -> dict[int, Relay]:
    counts: dict[int, int] = {}
    for r in setup.receivers:
        counts[r.cluster] = counts.get(r.cluster, 0) + 1
    return {
        c: Relay(secret=setup.secret, upstream=setup.links[c], relay_id=f"relay-c{c}")
        for c, n in counts.items()
        if c != 0 and n >= 2
    }


async def _rose(
    setup: _Setup, a1: WeightAnnounce, fetchers: dict[str, WeightFetcher], relays: dict[int, Relay], manifest: Any
) -> list[ReceiverRun]:
    plan = plan_transfer(manifest, setup.receivers)
    tasks = []
    for r in setup.receivers:
        announce = msgspec.structs.replace(a1, source=setup.source_for(r))
        relay = relays[r.cluster].source if r.cluster in relays else None
        held, shard = setup.held.rose[r.name], _shard_of(setup, r, plan)
        fetch = functools.partial(fetchers[r.name].fetch_into, announce, held, relay=relay, **shard)
        slicer = None if "view" in shard else setup.slicers[r.name]  # a view is the engine's weights
        tasks.append(fetch_and_trim(r.name, fetch, held, slicer))
    return list(await asyncio.gather(*tasks))


def _result(
    cfg: BenchConfig, measured: dict[str, Any], speed: CodecSpeed, plan: TransferPlan, base: _Phase, rose: _Phase
) -> dict[str, Any]:
    return {
        "config": {name: getattr(cfg, name) for name in _CONFIG_KEYS},
        "params": measured["params"],
        "changed_fraction": speed.changed_fraction,
        "dense_bytes": measured["dense_bytes"],
        "cross_cluster_bytes": rose.crossed,
        "baseline_cross_cluster_bytes": base.crossed,
        "plan_cross_cluster_bytes": plan.cross_cluster_bytes,
        "total_wire_bytes": sum(r.bytes_received for r in rose.runs) + rose.relayed,
        "baseline_wire_bytes": sum(r.bytes_received for r in base.runs),
        "baseline_seconds": base.seconds,
        "rose_seconds": rose.seconds,
        "speedup": base.seconds / rose.seconds,
        "baseline_first_seconds": measured["repeats"]["baseline_seconds"][0],
        "rose_first_seconds": measured["repeats"]["rose_seconds"][0],
        "first_speedup": measured["repeats"]["baseline_seconds"][0] / measured["repeats"]["rose_seconds"][0],
        "baseline_receiver_seconds": {r.name: round(r.seconds, 3) for r in base.runs},
        "rose_receiver_seconds": {r.name: round(r.seconds, 3) for r in rose.runs},
        "baseline_cpu_seconds": base.cpu_seconds,
        "rose_cpu_seconds": rose.cpu_seconds,
        "baseline_link_floor_seconds": _floor(cfg, base.crossed),
        "rose_link_floor_seconds": _floor(cfg, rose.crossed),
        "encode_gbps": speed.encode_gbps,
        "decode_gbps": speed.decode_gbps,
        "transport_gbps": measured["transport_gbps"],
        "ceiling_gbps": measured["ceiling_gbps"],
        "transport_vs_ceiling": measured["transport_gbps"] / measured["ceiling_gbps"],
        "publish_seconds": measured["publish_seconds"],
        "bit_exact": measured["bit_exact"],
        "repeats": measured["repeats"],
        "plan": plan.as_dict(),
    }


def _floor(cfg: BenchConfig, crossed: int) -> float | None:
    """Seconds the crossed bytes need on the modelled links (all links equally loaded: a lower bound)."""
    if cfg.link_gbps is None or cfg.clusters < 2:
        return None
    return crossed / (cfg.clusters - 1) / (cfg.link_gbps * 1e9 / 8)


_CONFIG_KEYS = (
    "params",
    "receivers",
    "clusters",
    "source_tp",
    "dest_tp",
    "transport",
    "lr",
    "link_gbps",
    "bucket_bytes",
    "repeat",
)
