"""Device check, for a machine with an NVIDIA GPU, CUDA torch and nvidia-ml-py: does the
usage meter's NVML sampler see how busy a GPU really was?

CUDA device 0 runs matrix products for the first half of every wall-clock second and idles
for the second half, for --periods whole seconds, while a UsageMeter with an NvmlSampler of
that GPU (found by its UUID) samples every --interval seconds. The measured efficiency is
gpu_used_s / gpu_sampled_s; it should be 0.5. Each sample's busy share is kept too: NVML
reports utilization over its own last sample period (1/6 s to 1 s, by product), so readings
that swing between ~0 and ~1 mean it is aliasing against the square wave.

    python benchmarks/device/gpu_duty.py [OUT.json] [--periods 20] [--interval 1.0]

Writes OUT.json (default benchmarks/results/gpu_duty.json); exits 1 when the efficiency is
off 0.5 by more than 0.05, 2 when there is no GPU or NVML to measure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from pathlib import Path

from cellscale.runtime.usage import NvmlSampler, UsageMeter

DUTY = 0.5
TOLERANCE = 0.05
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "gpu_duty.json"


def busy_half_of_each_second(torch, a, out, start: int, periods: int) -> None:
    """From `start` (a whole second): products for DUTY of each second, then nothing until the next."""
    for period in range(periods):
        busy_until = start + period + DUTY
        while time.time() < busy_until:
            for _ in range(4):
                torch.mm(a, a, out=out)
            torch.cuda.synchronize()
        time.sleep(max(0.0, start + period + 1 - time.time()))


def sample_every(meter: UsageMeter, interval: float, stop: threading.Event, shares: list[float]) -> None:
    while not stop.wait(interval):
        used, sampled = meter.gpu_used_s or 0.0, meter.gpu_sampled_s
        meter.sample()
        shares.append((meter.gpu_used_s - used) / (meter.gpu_sampled_s - sampled))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--periods", type=int, default=20, help="seconds of the half-busy loop")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("needs torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    sampler = NvmlSampler.open(uuid)
    if sampler is None:
        print(f"NVML cannot sample {uuid} (nvidia-ml-py installed? a driver?)", file=sys.stderr)
        return 2

    a = torch.randn(4096, 4096, device="cuda")
    out = torch.empty_like(a)
    torch.mm(a, a, out=out)  # CUDA's start-up, before the meter's
    torch.cuda.synchronize()
    start = math.ceil(time.time())
    time.sleep(start - time.time())
    meter, stop, shares = UsageMeter(1, sampler, since=start), threading.Event(), []
    thread = threading.Thread(target=sample_every, args=(meter, args.interval, stop, shares), daemon=True)
    thread.start()
    busy_half_of_each_second(torch, a, out, start, args.periods)
    stop.set()
    thread.join()
    meter.sample()
    usage = meter.record()
    efficiency = usage.gpu_used_s / usage.gpu_sampled_s
    ok = abs(efficiency - DUTY) <= TOLERANCE
    print(f"{torch.cuda.get_device_name(0)} ({uuid}): efficiency {efficiency:.3f}, expected {DUTY} ± {TOLERANCE}")
    print("per-sample busy shares: " + " ".join(f"{share:.2f}" for share in shares))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "check": "gpu_duty",
        "at": time.time(),
        "gpu": torch.cuda.get_device_name(0),
        "uuid": uuid,
        "duty": DUTY,
        "periods": args.periods,
        "interval_s": args.interval,
        "efficiency": efficiency,
        "ok": ok,
        "sample_shares": shares,
        "usage": usage.model_dump(),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
