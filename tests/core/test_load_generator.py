"""The bursty arrival process and the serving-window summary (pure parts of the load generator)."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rose_core.app.config import LoadConfig
from rose_core.app.jobs.serving_window import ServingSample, percentile, summarize
from rose_core.app.run.load_generator import LoadGenerator, arrivals


def test_arrivals_are_bursty_with_the_configured_rates() -> None:
    cfg = LoadConfig(base_rps=1.0, burst_rps=10.0, mean_calm_s=4.0, mean_burst_s=2.0, seed=3)
    times = list(itertools.takewhile(lambda t: t < 2000.0, arrivals(cfg)))
    assert times == sorted(times)
    mean_rate = len(times) / 2000.0
    expected = (1.0 * 4.0 + 10.0 * 2.0) / 6.0
    assert 0.8 * expected < mean_rate < 1.2 * expected
    per_second = [0] * 2000
    for t in times:
        per_second[int(t)] += 1
    assert max(per_second) / mean_rate > 3.0


def test_arrivals_are_deterministic_per_seed() -> None:
    a = list(itertools.islice(arrivals(LoadConfig(seed=5)), 50))
    b = list(itertools.islice(arrivals(LoadConfig(seed=5)), 50))
    c = list(itertools.islice(arrivals(LoadConfig(seed=6)), 50))
    assert a == b != c


def test_summary_counts_violations_and_failures() -> None:
    samples = [
        ServingSample(0, 0.1, 0.01, 10, True),
        ServingSample(1, 3.0, 0.01, 10, True),
        ServingSample(2, 0.1, 0.5, 10, True),
        ServingSample(3, 0, 0, 0, False),
    ]
    w = summarize(samples, slo_ttft_ms=2000, slo_tpot_ms=100)
    assert (w.requests, w.failed, w.slo_violations) == (4, 1, 3)
    assert w.ttft_p99_ms == pytest.approx(3000)
    assert percentile([], 0.99) == 0.0


class _Streamer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(3):
            self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Streamer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_generator_streams_against_a_real_http_server(endpoint: str) -> None:
    gen = LoadGenerator([endpoint], LoadConfig(base_rps=20, burst_rps=40, max_in_flight=4))
    gen.start()
    threading.Event().wait(0.6)
    gen.stop()
    samples = gen.samples()
    assert samples and all(s.ok and s.tokens == 3 and s.endpoint == 0 for s in samples)


def test_arrivals_spread_over_every_endpoint_by_their_shares(endpoint: str) -> None:
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Streamer)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        gen = LoadGenerator([endpoint, f"http://127.0.0.1:{other.server_address[1]}/v1"],
                            LoadConfig(base_rps=200, burst_rps=200, max_in_flight=8, endpoint_shares=[3, 1]))
        gen.start()
        threading.Event().wait(1.0)
        gen.stop()
    finally:
        other.shutdown()
    samples = gen.samples()
    counts = [sum(1 for s in samples if s.endpoint == i and s.ok) for i in (0, 1)]
    assert counts[1] > 0 and counts[0] > 1.5 * counts[1], counts  # 3:1 expected; far from 1:1


def test_endpoint_shares_must_match_the_endpoints() -> None:
    with pytest.raises(ValueError, match="one share per serving executor"):
        LoadGenerator(["http://a/v1", "http://b/v1"], LoadConfig(endpoint_shares=[1, 2, 3]))
    with pytest.raises(ValueError, match="positive sum"):
        LoadConfig(endpoint_shares=[0, 0])
    with pytest.raises(ValueError, match="at least one serving endpoint"):
        LoadGenerator([], LoadConfig())


def test_unreachable_endpoint_counts_failures() -> None:
    gen = LoadGenerator(["http://127.0.0.1:9/v1"], LoadConfig(base_rps=50, burst_rps=50))
    gen._models = ["m"]
    gen._one(0.0)
    assert gen.samples()[0].ok is False
