"""The `rose-transfer` command line: serve, relay, fetch and benchmark weight versions."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import click
import numpy as np

from rose_core.protocol.auth import as_weights_key, load_secret
from rose_core.protocol.messages import WeightAnnounce
from rose_core.support.cli_support import RoseGroup, setup_logging
from rose_transfer._version import __version__

MIB = 1024 * 1024


_KEY_HELP = ("The shared secret or an executor key file (else $ROSE_SECRET_FILE): the weight channel's key is "
             "derived from it.")


def _weights_key(secret_file: str | None) -> bytes:
    """The weight channel's key (``rose_core.protocol.auth.weights_key``) from a secret or executor key file."""
    return as_weights_key(load_secret(secret_file))


@click.group(cls=RoseGroup, program="rose-transfer")
@click.version_option(__version__, prog_name="rose-transfer")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """ROSE weight transfer: move weight versions from a trainer to rollout engines."""
    setup_logging(verbose)


@main.command()
@click.argument("weights", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--version", "version", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0 picks a free port.")
@click.option("--bucket-mb", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--secret-file", type=click.Path(dir_okay=False), help=_KEY_HELP)
@click.option("--tls", is_flag=True, help="Serve tls://HOST:PORT (TLS 1.3, the key derived from the weights key).")
def serve(weights: Path, version: int, host: str, port: int, bucket_mb: int, secret_file: str | None,
          tls: bool) -> None:
    """Serve the arrays of a .npz file as one weight version until interrupted."""
    from rose_transfer.serve.publisher import DensePublisher

    with np.load(weights) as npz:
        tensors = {name: npz[name] for name in npz.files}
    with DensePublisher(secret=_weights_key(secret_file), host=host, port=port, bucket_bytes=bucket_mb * MIB,
                        tls=tls) as pub:
        announce = pub.publish(version, 0, tensors)
        click.echo(f"serving version {version} ({announce.total_bytes} bytes) at {announce.source}")
        click.echo(f"digest {announce.manifest_digest}")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


@main.command()
@click.option("--upstream", required=True,
              help="The publisher: tcp://HOST:PORT (`rose run`'s [controller] weights_port), or tls://HOST:PORT when it "
                   "encrypts ([controller] weights_tls; the relay then serves TLS too).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the cluster's receivers reach.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0 picks a free port.")
@click.option("--transport", type=click.Choice(["tcp", "ucx"]), default="tcp", show_default=True,
              help="ucx: serve over UCX too.")
@click.option("--ucx-port", type=click.IntRange(0, 65535), default=0, show_default=True)
@click.option("--relay-id", default="", help="Name in the publisher's logs (default relay@SOURCE).")
@click.option("--secret-file", type=click.Path(dir_okay=False), help=_KEY_HELP)
@click.option("--progress-every", type=click.FloatRange(min=0.05), default=5.0, show_default=True,
              help="Seconds between progress lines (printed when more bytes came from upstream).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event (started, progress, stopped).")
def relay(upstream: str, host: str, port: int, transport: str, ucx_port: int, relay_id: str,
          secret_file: str | None, progress_every: float, as_json: bool) -> None:
    """Relay weight versions from a publisher to the receivers of this cluster until SIGTERM / Ctrl-C."""
    from rose_transfer.serve.relay_process import RelaySettings, describe, serve_relay

    settings = RelaySettings(upstream, host, port, transport, ucx_port, relay_id, progress_every)
    secret = _weights_key(secret_file)
    serve_relay(secret, settings, lambda event: click.echo(json.dumps(event) if as_json else describe(event)))


@main.command()
@click.argument("source")
@click.argument("version", type=click.IntRange(min=0))
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--digest", default="", help="Expected manifest digest (from the announcement).")
@click.option("--secret-file", type=click.Path(dir_okay=False), help=_KEY_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def fetch(source: str, version: int, dest: Path, digest: str, secret_file: str | None, as_json: bool) -> None:
    """Fetch weight VERSION from SOURCE (tcp://HOST:PORT or tls://HOST:PORT) into the file DEST."""
    from rose_transfer.fetch.fetcher import WeightFetcher

    announce = WeightAnnounce(version=version, step=0, source=source, manifest_digest=digest)
    fetched = asyncio.run(WeightFetcher(_weights_key(secret_file), "rose-transfer-cli").fetch(announce, -1, dest))
    row = {
        "version": fetched.version,
        "path": str(fetched.path),
        "tensors": len(fetched.entries),
        "bytes_received": fetched.bytes_received,
        "seconds": round(fetched.seconds, 4),
        "digest": fetched.digest,
    }
    click.echo(json.dumps(row) if as_json else "\n".join(f"{k:>15}  {v}" for k, v in row.items()))


@main.command()
@click.option("--params", type=float, default=300e6, show_default=True, help="Model parameters (Llama-shaped).")
@click.option("--receivers", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--clusters", type=click.IntRange(min=1), default=2, show_default=True, help="Cluster 0 holds the source."
)
@click.option("--source-tp", type=click.Choice(["1", "2", "4", "8"]), default="1", show_default=True)
@click.option("--dest-tp", type=click.Choice(["1", "2", "4", "8"]), default="2", show_default=True)
@click.option("--transport", type=click.Choice(["tcp", "ucx"]), default="tcp", show_default=True)
@click.option("--lr", type=float, default=1e-6, show_default=True, help="Adam learning rate of the step.")
@click.option("--link-gbps", type=float, default=None, help="Rate of the link into each other cluster (Gbit/s).")
@click.option("--bucket-mb", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True, help="Timed runs of each system.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench(
    params: float,
    receivers: int,
    clusters: int,
    source_tp: str,
    dest_tp: str,
    transport: str,
    lr: float,
    link_gbps: float | None,
    bucket_mb: int,
    repeat: int,
    as_json: bool,
) -> None:
    """Dense broadcast (today's systems) against ROSE's shard-aware, sparse, relayed transfer."""
    from rose_transfer.bench.progress import BenchProgress
    from rose_transfer.bench.transfer_bench import BenchConfig, run_transfer_bench

    cfg = BenchConfig(
        params=int(params),
        receivers=receivers,
        clusters=clusters,
        source_tp=int(source_tp),
        dest_tp=int(dest_tp),
        transport=transport,
        lr=lr,
        link_gbps=link_gbps,
        bucket_bytes=bucket_mb * MIB,
        repeat=repeat,
    )
    result = run_transfer_bench(cfg, BenchProgress(8))
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        if key not in ("plan", "config", "repeats"):
            click.echo(f"{key:>30}  {value:.4g}" if isinstance(value, float) else f"{key:>30}  {value}")


@main.command("bench-fetch")
@click.option("--size-mb", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--bucket-mb", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--window", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--dest-dir", type=click.Path(file_okay=False, path_type=Path), help="Default: /dev/shm.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_fetch(size_mb: int, bucket_mb: int, window: int, runs: int, dest_dir: Path | None, as_json: bool) -> None:
    """Fetch a dense version between two local processes; compare with raw TCP in the same run."""
    from rose_transfer.bench.loopback_bench import run_loopback_bench

    result = run_loopback_bench(size_mb * 1_000_000, bucket_mb * MIB, window, runs, dest_dir)
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    click.echo(f"{'model bytes':>22}  {result.size_bytes / 1e6:.0f} MB in {bucket_mb} MiB buckets, window {window}")
    click.echo(f"{'publish (flatten)':>22}  {result.publish_seconds:.3f} s")
    click.echo(f"{'raw TCP ceiling':>22}  {result.raw_tcp_gbps:.2f} GB/s")
    click.echo(f"{'fetch, first':>22}  {result.cold_gbps:.2f} GB/s  ({result.fetch_seconds[0]:.3f} s)")
    click.echo(f"{'fetch, best later':>22}  {result.warm_gbps:.2f} GB/s  ({min(result.fetch_seconds):.3f} s)")


@main.command("bench-codec")
@click.option("--size-mb", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True)
@click.option("--changed", type=click.FloatRange(0, 1), default=0.01, show_default=True, help="Fraction changed.")
@click.option("--bucket-mb", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_codec(size_mb: int, dtype: str, changed: float, bucket_mb: int, runs: int, as_json: bool) -> None:
    """Encode/decode speed of the sparse codec against the naive numpy patch (one core)."""
    from rose_transfer.bench.codec_bench import run_codec_bench

    result = run_codec_bench(size_mb * 1_000_000, dtype, changed, bucket_mb * MIB, runs)
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    click.echo(
        f"{size_mb} MB of {dtype}, {changed:.2%} changed, {bucket_mb} MiB buckets: "
        f"{result.wire_bytes / 1e6:.2f} MB on the wire ({result.size_bytes / max(result.wire_bytes, 1):.0f}x)"
    )
    click.echo(f"{'GB/s of model bytes':>22}  {'first':>7}  {'best':>7}")
    for name in result.seconds:
        click.echo(f"{name:>22}  {result.gbps(name, 'first'):7.2f}  {result.gbps(name):7.2f}")
