"""Bursty production traffic against OpenAI-compatible `/v1/completions` endpoints (every serving executor's).

Arrivals follow a two-state (calm / burst) Markov-modulated Poisson process, open loop: a request's
latency counts from its scheduled arrival, so an overloaded endpoint shows up as TTFT, not as fewer
requests. TTFT and TPOT are measured client side from the token stream. Each arrival goes to one endpoint,
drawn with ``LoadConfig.endpoint_shares`` (equal shares when empty), so several serving executors see load
of different sizes.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from rose_core.app.config import LoadConfig
from rose_core.app.jobs.serving_window import ServingSample, ServingWindow, summarize

log = logging.getLogger(__name__)


def arrivals(config: LoadConfig, start: float = 0.0) -> Iterator[float]:
    """Arrival times of a calm/burst Markov-modulated Poisson process (pure; seeded)."""
    rng = random.Random(config.seed)
    t, burst = start, False
    state_end = t + rng.expovariate(1.0 / config.mean_calm_s)
    while True:
        rate = config.burst_rps if burst else config.base_rps
        t += rng.expovariate(rate)
        while t > state_end:
            burst = not burst
            t = state_end + rng.expovariate(config.burst_rps if burst else config.base_rps)
            state_end += rng.expovariate(1.0 / (config.mean_burst_s if burst else config.mean_calm_s))
        yield t


class LoadGenerator:
    """Runs on its own threads until ``stop()``; ``window(t0, t1)`` summarises what it saw."""

    def __init__(self, endpoints: list[str], config: LoadConfig, vocab_size: int = 128) -> None:
        if not endpoints:
            raise ValueError("the load generator needs at least one serving endpoint")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.shares = endpoint_shares(config, len(self.endpoints))
        self.config = config
        self._vocab = vocab_size
        self._rng = random.Random(config.seed + 1)
        self._samples: list[ServingSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(config.max_in_flight, thread_name_prefix="rose-load")
        self._thread = threading.Thread(target=self._run, name="rose-load", daemon=True)
        self._models: list[str] = []

    def start(self) -> None:
        self._models = [self._first_model(e) for e in self.endpoints]
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def samples(self) -> list[ServingSample]:
        with self._lock:
            return list(self._samples)

    def window(self, t0: float, t1: float, slo_ttft_ms: float, slo_tpot_ms: float) -> ServingWindow:
        return summarize([s for s in self.samples() if t0 <= s.arrived < t1], slo_ttft_ms, slo_tpot_ms)

    def _run(self) -> None:
        start = time.monotonic()
        for at in arrivals(self.config, start):
            if self._stop.wait(max(0.0, at - time.monotonic())):
                return
            self._pool.submit(self._one, at, self._pick())

    def _pick(self) -> int:
        return self._rng.choices(range(len(self.endpoints)), weights=self.shares)[0]

    def _one(self, arrived: float, index: int = 0) -> None:
        prompt = [self._rng.randrange(4, self._vocab) for _ in range(self.config.prompt_tokens)]
        body = {"model": self._models[index], "prompt": prompt, "max_tokens": self.config.max_tokens, "stream": True,
                "temperature": 1.0, "ignore_eos": True}
        try:
            stamps = self._stream(self.endpoints[index], body)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            log.debug("serving request to %s failed: %s", self.endpoints[index], exc)
            stamps = []
        sample = _to_sample(arrived, stamps, index)
        with self._lock:
            self._samples.append(sample)

    @staticmethod
    def _stream(endpoint: str, body: dict[str, object]) -> list[float]:
        url = urlsplit(endpoint)
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=60)
        try:
            conn.request("POST", f"{url.path}/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {resp.read(200)!r}")
            stamps = []
            for line in resp:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    stamps.append(time.monotonic())
            return stamps
        finally:
            conn.close()

    @staticmethod
    def _first_model(endpoint: str) -> str:
        url = urlsplit(endpoint)
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=30)
        try:
            conn.request("GET", f"{url.path}/models")
            data = json.loads(conn.getresponse().read())
            return str(data["data"][0]["id"])
        finally:
            conn.close()


def endpoint_shares(config: LoadConfig, endpoints: int) -> list[float]:
    """Each endpoint's share of the arrivals: ``config.endpoint_shares`` (one per endpoint) or equal."""
    shares = list(config.endpoint_shares) or [1.0] * endpoints
    if len(shares) != endpoints:
        raise ValueError(f"[load] endpoint_shares has {len(shares)} entries for {endpoints} serving endpoints: "
                         "give one share per serving executor, or none for equal shares")
    return shares


def _to_sample(arrived: float, stamps: list[float], endpoint: int = 0) -> ServingSample:
    if not stamps:
        return ServingSample(arrived, 0.0, 0.0, 0, ok=False, endpoint=endpoint)
    ttft = stamps[0] - arrived
    tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else 0.0
    return ServingSample(arrived, ttft, tpot, len(stamps), ok=True, endpoint=endpoint)
