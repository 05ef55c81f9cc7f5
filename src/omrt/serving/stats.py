"""What a server has done, for the `stats` and `health` requests: counters and request latencies."""

from __future__ import annotations

import threading
import time

import numpy as np

LATENCY_WINDOW = 10_000
"""Latencies of this many recent requests make the percentiles."""


class Counters:
    """Counters shared by a server's readers and workers (each update under one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.requests = 0
        """RUN requests answered with a result."""
        self.runs = 0
        """Session runs (a batch of requests is one run)."""
        self.batches = 0
        """Runs that served more than one request."""
        self.batched_requests = 0
        self.bytes_copied = 0
        """Bytes the server copied: tensors sent as bytes (both ways), batch gathers and scatters,
        and every copy a session counted."""
        self.copied_requests = 0
        self.busy = 0
        self.errors = 0
        self.running = 0
        """Requests being run by a worker now."""
        self._latencies = np.zeros(LATENCY_WINDOW)
        """A ring of the latest latencies, allocated once: a server's memory does not grow with requests."""

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def answered(self, latency: float, copied: int) -> None:
        """A request answered with a result, `latency` seconds after it arrived."""
        with self._lock:
            self.requests += 1
            self.bytes_copied += copied
            self.copied_requests += copied > 0
            self._latencies[(self.requests - 1) % LATENCY_WINDOW] = latency

    def snapshot(self, **extra: object) -> dict:
        """Every counter, the p50/p99 latency in ms over recent requests, and `extra` figures."""
        with self._lock:
            latencies = self._latencies[:min(self.requests, LATENCY_WINDOW)] * 1e3
            figures = {k: getattr(self, k) for k in ("requests", "runs", "batches", "batched_requests",
                                                     "bytes_copied", "copied_requests", "busy", "errors",
                                                     "running")}
        p50, p99 = (np.percentile(latencies, [50, 99]).tolist() if latencies.size else (None, None))
        return {**figures, "latency_ms": {"p50": p50, "p99": p99, "over": int(latencies.size)},
                "uptime_s": time.monotonic() - self.started, **extra}
