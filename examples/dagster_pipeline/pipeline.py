"""Feature → train → backtest on cellscale, orchestrated by Dagster, partitioned by trading day.

    bars (CPU job) → features (CPU job) → model (2-rank torchrun) → backtest (ONE sweep over
    thresholds; a backfill of many days is still ONE sweep)

Every step's function runs on the cluster through cellscale (`cellscale.dagster`); the data
is synthetic, made by `bars` itself, and lives under DATA (CELLSCALE_EXAMPLE_DATA, default
~/cellscale-example-data), a folder the jobs' nodes share. Materialize one day:

    dagster asset materialize -m examples.dagster_pipeline.pipeline --select '*' --partition 2026-11-30

or from Python: `dagster.materialize(pipeline.assets, partition_key="2026-11-30",
resources=pipeline.resources)`. The same functions run from a notebook with `%%cluster`
give the same numbers (docs/dagster.md).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import dagster as dg

from cellscale.dagster import CellscaleResource, cellscale_asset

DATA = Path(os.environ.get("CELLSCALE_EXAMPLE_DATA", Path.home() / "cellscale-example-data"))
BACKEND = os.environ.get("CELLSCALE_EXAMPLE_BACKEND") or None
SYMBOLS, MINUTES = 16, 390
THRESHOLDS = [round(0.00001 * i, 5) for i in range(20)]
days = dg.DailyPartitionsDefinition(start_date="2026-01-01")


def _seed(day: str) -> int:
    return int.from_bytes(hashlib.sha256(day.encode()).digest()[:4], "little")


def _path(kind: str, day: str, suffix: str) -> Path:
    folder = DATA / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{day}{suffix}"


def make_bars(partition_key: str) -> dict:
    """One trading day of one-minute bars for SYMBOLS synthetic stocks (a seeded random walk)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(_seed(partition_key))
    returns = rng.normal(0, 0.001, size=(MINUTES, SYMBOLS)) + 0.0002 * np.sin(np.arange(MINUTES) / 15)[:, None]
    close = 100 * np.exp(np.cumsum(returns, axis=0))
    frame = pd.DataFrame(
        {
            "minute": np.repeat(np.arange(MINUTES), SYMBOLS),
            "symbol": np.tile([f"S{i:02d}" for i in range(SYMBOLS)], MINUTES),
            "close": close.ravel(),
            "volume": rng.integers(100, 10_000, size=MINUTES * SYMBOLS),
        }
    )
    frame.to_parquet(_path("bars", partition_key, ".parquet"), index=False)
    return {"rows": len(frame), "mean_close": round(float(frame.close.mean()), 6)}


def make_features(partition_key: str) -> dict:
    """Per symbol: last return, 5- and 30-minute momentum, 30-minute volatility; the label is
    the next minute's return."""
    import pandas as pd

    bars = pd.read_parquet(DATA / "bars" / f"{partition_key}.parquet").sort_values(["symbol", "minute"])
    by = bars.groupby("symbol").close
    feats = pd.DataFrame({"minute": bars.minute, "symbol": bars.symbol})
    feats["ret1"] = by.pct_change()
    feats["mom5"] = by.pct_change(5)
    feats["mom30"] = by.pct_change(30)
    feats["vol30"] = feats.groupby("symbol").ret1.transform(lambda r: r.rolling(30).std())
    feats["label"] = feats.groupby("symbol").ret1.shift(-1)
    feats = feats.dropna().reset_index(drop=True)
    feats.to_parquet(_path("features", partition_key, ".parquet"), index=False)
    return {"rows": len(feats), "checksum": round(float(feats[["mom5", "label"]].to_numpy().sum()), 9)}


FEATURES = ["ret1", "mom5", "mom30", "vol30"]


def train(partition_key: str) -> dict:
    """A linear model of the next return, data-parallel over the job's ranks (torchrun, gloo):
    each rank takes its share of rows, gradients are averaged; rank 0 saves the weights."""
    import pandas as pd
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    feats = pd.read_parquet(DATA / "features" / f"{partition_key}.parquet")
    x = torch.tensor(feats[FEATURES].to_numpy(), dtype=torch.float64)[rank::world]
    y = torch.tensor(feats.label.to_numpy(), dtype=torch.float64)[rank::world] * 1000
    center, scale = x.mean(dim=0), x.std(dim=0) + 1e-12
    dist.all_reduce(center)
    dist.all_reduce(scale)
    center, scale = center / world, scale / world  # every rank standardizes alike
    torch.manual_seed(_seed(partition_key))
    model = torch.nn.Linear(len(FEATURES), 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(200):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model((x - center) / scale).squeeze(1), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    weights = {"weight": model.weight.detach(), "bias": model.bias.detach(), "center": center, "scale": scale}
    if rank == 0:
        torch.save(weights, _path("model", partition_key, ".pt"))
    dist.destroy_process_group()
    coefficients = [round(float(w), 9) for w in weights["weight"].ravel()]
    return {"loss": round(float(total) / world, 9), "ranks": world, "weights": coefficients}


def run_backtest(partition_key: str, threshold: float) -> dict:
    """Trade each symbol's next minute when the model's |forecast| passes `threshold`."""
    import numpy as np
    import pandas as pd
    import torch

    feats = pd.read_parquet(DATA / "features" / f"{partition_key}.parquet")
    weights = torch.load(DATA / "model" / f"{partition_key}.pt")
    x = torch.tensor(feats[FEATURES].to_numpy(), dtype=torch.float64)
    forecast = (((x - weights["center"]) / weights["scale"]) @ weights["weight"].T).squeeze(1) + weights["bias"]
    forecast = forecast.numpy() / 1000
    position = np.sign(forecast) * (np.abs(forecast) > threshold)
    pnl = position * feats.label.to_numpy()
    trades = int((position != 0).sum())
    sharpe = float(pnl.mean() / pnl.std() * (MINUTES**0.5)) if pnl.std() > 0 else 0.0
    return {"pnl": round(float(pnl.sum()), 9), "trades": trades, "sharpe": round(sharpe, 6)}


@cellscale_asset(partitions_def=days, backend=BACKEND, time=10, group_name="market")
def bars(partition_key: str) -> dict:
    """Synthetic one-minute bars of the day."""
    return make_bars(partition_key)


@cellscale_asset(partitions_def=days, deps=[bars], backend=BACKEND, time=10, group_name="market")
def features(partition_key: str) -> dict:
    """Momentum and volatility features, labelled with the next minute's return."""
    return make_features(partition_key)


@cellscale_asset(
    partitions_def=days, deps=[features], gpus=2, launcher="torchrun", backend=BACKEND, time=15, group_name="market"
)
def model(partition_key: str) -> dict:
    """The day's model, trained on 2 ranks."""
    return train(partition_key)


@cellscale_asset(
    partitions_def=days,
    deps=[model],
    sweep={"threshold": THRESHOLDS},
    max_parallel=8,
    per_task=5,
    backend=BACKEND,
    time=10,
    group_name="market",
)
def backtest(partition_key: str, threshold: float) -> dict:
    """The day's backtest at every threshold: ONE sweep (a backfill of N days too)."""
    return run_backtest(partition_key, threshold)


assets = [bars, features, model, backtest]
resources = {"cellscale": CellscaleResource()}
defs = dg.Definitions(assets=assets, resources=resources, jobs=[dg.define_asset_job("market_day", selection=assets)])


def market_day():
    """The four steps of one day as a job (`dagster.reconstructable(market_day)` runs it in a
    run worker, and re-executes it from failure)."""
    return defs.resolve_job_def("market_day")
