"""A real S3 API on loopback, shaped like a WAN: a SIMULATION of a remote object store, for tests and benchmarks.

moto's S3 server (`moto[server]`) runs in this process on 127.0.0.1, on a free port, behind a WSGI
middleware that
- counts requests: the method, bucket, key and Range of each, so a test can assert that each object
  was fetched once per node, or not at all;
- shapes responses like a WAN link to the store: every request waits a first-byte latency (default
  20 ms), and the response bodies of all connections together pass one token bucket (default 100 MB/s).

What the simulation leaves out: the latency and bandwidth are sleeps in this process, not a network
(no loss, no TCP slow start, no per-connection limit); request bodies (uploads) are not shaped; moto
keeps the objects in this process's memory and is CPU-bound (uploads ~55 MB/s on this machine).
moto's backends are global to a process, so one ObjectStore runs at a time and starting one resets
moto's state (and that of any `moto.mock_aws` running in the same process).

    with ObjectStore() as store:
        fs = s3fs.S3FileSystem(**store.storage_options)
        bars = write_synthetic_bars("s3://mkt/bars", 64 * 2**20, storage_options=store.storage_options)
        ...
        assert all(count == 1 for count in Counter(r.key for r in store.gets("bars/")).values())
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, NamedTuple

import fsspec

SLICE = 128 * 2**10  # bytes of a response body sent per token-bucket grant
KEY, SECRET = "cellscale", "cellscale"  # moto accepts any credentials
BAR_BYTES = 36.75  # Parquet bytes per bar, measured: random prices do not compress, volumes to 4.5 bytes
SYMBOLS = 64
FIRST_DAY = date(2024, 1, 2)
ROW_GROUP = 2**17  # bars per Parquet row group


class S3Request(NamedTuple):
    method: str
    bucket: str | None
    key: str | None  # None for a bucket-level request (a listing, a bucket's creation)
    range: str | None  # the Range header ("bytes=0-99"), None for the whole object


class TokenBucket:
    """One link's bandwidth shared by all connections. `take(n)` reserves n bytes and says how long to
    wait before sending them: a debt, not a refusal, so concurrent takers queue in arrival order and
    together get `rate` bytes per second, after a burst of at most `burst` bytes from idle."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._at = burst, clock()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> float:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate) - nbytes
            self._at = now
            return max(0.0, -self._tokens / self.rate)


class _Wan:
    """WSGI middleware: records each S3 request, then delays and paces its response."""

    def __init__(self, app: Callable, bucket: TokenBucket | None, latency_s: float):
        self.app, self.bucket, self.latency_s = app, bucket, latency_s
        self.requests: list[S3Request] = []
        self.lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ["PATH_INFO"].startswith("/moto-api"):  # moto's own controls, not S3
            return self.app(environ, start_response)
        with self.lock:
            self.requests.append(_s3_request(environ))
        time.sleep(self.latency_s)
        body = self.app(environ, start_response)
        return body if self.bucket is None else self._paced(body)

    def _paced(self, body: Iterable[bytes]) -> Iterator[bytes]:
        try:
            for chunk in body:
                for start in range(0, len(chunk), SLICE):
                    piece = chunk[start : start + SLICE]
                    time.sleep(self.bucket.take(len(piece)))
                    yield piece
        finally:
            if hasattr(body, "close"):
                body.close()


def _s3_request(environ: Mapping[str, Any]) -> S3Request:
    # WSGI gives the decoded path as latin-1 characters; S3 keys are UTF-8
    path = environ["PATH_INFO"].encode("latin-1").decode("utf-8").lstrip("/")
    bucket, _, key = path.partition("/")
    return S3Request(environ["REQUEST_METHOD"], bucket or None, key or None, environ.get("HTTP_RANGE"))


class ObjectStore:
    """moto's S3 on 127.0.0.1 behind the WAN simulation; `rate_mb_s=None`: responses unpaced."""

    _running = False

    def __init__(self, rate_mb_s: float | None = 100.0, latency_ms: float = 20.0):
        self.rate_mb_s, self.latency_ms = rate_mb_s, latency_ms
        self._bucket = TokenBucket(rate_mb_s * 1e6, SLICE) if rate_mb_s is not None else None
        self._wan: _Wan | None = None
        self._server = None
        self._thread: threading.Thread | None = None

    def start(self) -> ObjectStore:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        if ObjectStore._running:
            raise RuntimeError("an ObjectStore is already running in this process (moto's state is global)")
        self._wan = _Wan(DomainDispatcherApplication(create_backend_app), self._bucket, self.latency_ms / 1000)
        self._server = make_server("127.0.0.1", 0, self._wan, threaded=True, request_handler=_quiet_handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="objectstore", daemon=True)
        self._thread.start()
        ObjectStore._running = True
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")).close()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()
        ObjectStore._running = False

    def __enter__(self) -> ObjectStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs keyword arguments for this store."""
        return {"key": KEY, "secret": SECRET, "endpoint_url": self.endpoint_url}

    @property
    def environment(self) -> dict[str, str]:
        """Environment variables that point a child process's botocore (s3fs included) at this store."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}

    @property
    def requests(self) -> list[S3Request]:
        with self._wan.lock:
            return list(self._wan.requests)

    def reset_requests(self) -> None:
        with self._wan.lock:
            self._wan.requests.clear()

    def gets(self, key_prefix: str | None = None) -> list[S3Request]:
        """The object GETs so far (listings excluded), of keys starting with `key_prefix` if given."""
        return [r for r in self.requests if r.method == "GET" and r.key and r.key.startswith(key_prefix or "")]


def _quiet_handler() -> type:
    """moto's request handler without werkzeug's line per request (errors are still logged)."""
    from moto.server import MotoRequestHandler

    class Quiet(MotoRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass

    return Quiet


# -- synthetic market data -------------------------------------------------------------------------
@dataclass(frozen=True)
class SyntheticBars:
    """What write_synthetic_bars wrote: (path relative to `url`, bytes) of each file."""

    url: str
    files: tuple[tuple[str, int], ...]
    bytes: int
    rows: int


def write_synthetic_bars(
    url: str,
    total_bytes: int,
    files: int = 16,
    storage_options: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> SyntheticBars:
    """A hive-partitioned Parquet dataset of about `total_bytes` of synthetic minute bars under `url`,
    one file per day (`day=2024-01-02/part-0.parquet`, ...): symbol, ts, open, high, low, close,
    volume. Deterministic for a seed; the prices are random floats, so the bytes do not compress away."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    rows = max(SYMBOLS, int(total_bytes / BAR_BYTES / files))
    days = [FIRST_DAY + timedelta(days=i) for i in range(files)]
    fs.makedirs(root, exist_ok=True)  # on S3: the bucket, once, before the threads race to make it
    with ThreadPoolExecutor(4) as pool:
        written = list(pool.map(lambda i: _write_day(fs, root, days[i], rows, (seed, i)), range(files)))
    return SyntheticBars(url, tuple(written), sum(size for _, size in written), rows * files)


def _write_day(
    fs: fsspec.AbstractFileSystem, root: str, day: date, rows: int, seed: tuple[int, int]
) -> tuple[str, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    relative = f"day={day.isoformat()}/part-0.parquet"
    sink = pa.BufferOutputStream()
    # a size that scales with rows; row groups of 128k bars (~5 MB), as data meant to be streamed is written
    pq.write_table(_bars(day, rows, seed), sink, use_dictionary=["symbol", "ts"], row_group_size=ROW_GROUP)
    data = sink.getvalue().to_pybytes()
    fs.makedirs(f"{root}/day={day.isoformat()}", exist_ok=True)
    fs.pipe_file(f"{root}/{relative}", data)
    return relative, len(data)


def _bars(day: date, rows: int, seed: tuple[int, int]):
    """`rows` minute bars of SYMBOLS symbols from the day's midnight UTC, a random walk per column."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    minutes = -(-rows // SYMBOLS)
    symbol = np.tile(np.arange(SYMBOLS, dtype=np.int32), minutes)[:rows]
    start = np.datetime64(day.isoformat(), "ns").astype(np.int64)
    ts = np.repeat(start + np.arange(minutes, dtype=np.int64) * 60_000_000_000, SYMBOLS)[:rows]
    open_ = 100 + rng.standard_normal(rows)
    close = open_ + rng.standard_normal(rows) * 0.1
    spread = np.abs(rng.standard_normal((2, rows))) * 0.05
    names = pa.array([f"S{i:03d}" for i in range(SYMBOLS)])
    return pa.table(
        {
            "symbol": pa.DictionaryArray.from_arrays(pa.array(symbol), names),
            "ts": pa.array(ts, pa.timestamp("ns", tz="UTC")),
            "open": open_,
            "high": np.maximum(open_, close) + spread[0],
            "low": np.minimum(open_, close) - spread[1],
            "close": close,
            "volume": rng.integers(1, 100_000, rows),
        }
    )
