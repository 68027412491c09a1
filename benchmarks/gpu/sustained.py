"""Sustained against burst throughput on one CUDA GPU: matrix products run back to back for ``SECONDS`` each, in
BF16 and in FP8, with the SM clock and power read from NVML every window; the throughput of the first window (what
a short microbenchmark such as kernels.py sees) against that of the last windows (what a training step that keeps
the GPU busy for seconds sees); then one Llama-style block's F and backward the same way. Writes one JSON
document; needs torch and nvidia-ml-py.

Usage: python benchmarks/gpu/sustained.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import pynvml
import torch

SECONDS = 25.0
"""How long each product runs back to back."""
WINDOW = 0.5
"""Seconds of one measurement window."""
SHAPES = ((8192, 8192, 8192), (8192, 7168, 8192), (8192, 8192, 7168), (4096, 28672, 8192))
"""(m, n, k): a square product and the Llama-3-70B TP-4 rank's MLP products at one 8192-token microbatch."""
FP8 = torch.float8_e4m3fn


def product(m: int, n: int, k: int, dtype: str):
    """A function running one (m x k) @ (k x n) product in ``dtype`` on random data."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if dtype == "bf16":
        return lambda: a @ b.t()
    sa, sb = a.abs().max().float() / 448, b.abs().max().float() / 448
    a8, b8 = (a.float() / sa).to(FP8), (b.float() / sb).to(FP8)
    return lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def run(m: int, n: int, k: int, dtype: str, handle) -> dict:
    """TFLOP/s, SM clock (MHz) and power (W) per window over ``SECONDS`` of back-to-back products."""
    fn = product(m, n, k, dtype)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    t0 = torch.cuda.Event(enable_timing=True)
    t0.record()
    per = max(1, int(WINDOW / max(2 * m * n * k / 1.2e15, 1e-5)))  # products a window, roughly
    windows = []
    while time.perf_counter() - start < SECONDS:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(per):
            fn()
        end.record()
        end.synchronize()
        ms = begin.elapsed_time(end)
        windows.append({"tflops": 2 * m * n * k * per / (ms * 1e-3) / 1e12,
                        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3})
    last = windows[len(windows) // 2:]
    return {"m": m, "n": n, "k": k, "dtype": dtype, "windows": windows, "first_tflops": windows[0]["tflops"],
            "sustained_tflops": statistics.median(w["tflops"] for w in last),
            "sustained_sm_mhz": statistics.median(w["sm_mhz"] for w in last),
            "sustained_power_w": statistics.median(w["power_w"] for w in last)}


def block_run(handle) -> dict:
    """Seconds of one F and whole backward of the Llama-3-70B TP-4 rank's block (``llama_block``, eager BF16) per
    window, back to back over ``SECONDS``."""
    import llama_block

    block = llama_block.llama3_70b_tp4(1)[0].block_0
    x = torch.randn(1, llama_block.SEQ_LEN, 8192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)

    def step() -> None:
        block(x).backward(grad)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, windows = time.perf_counter(), []
    while time.perf_counter() - start < SECONDS:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(20):
            step()
        end.record()
        end.synchronize()
        windows.append({"ms": begin.elapsed_time(end) / 20,
                        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3})
    last = windows[len(windows) // 2:]
    return {"windows": windows, "first_ms": windows[0]["ms"], "sustained_ms": statistics.median(w["ms"] for w in last),
            "sustained_sm_mhz": statistics.median(w["sm_mhz"] for w in last)}


def main() -> None:
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "seconds": SECONDS,
           "window_s": WINDOW, "max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
           "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3, "runs": []}
    for dtype in ("bf16", "fp8"):
        for m, n, k in SHAPES:
            r = run(m, n, k, dtype, handle)
            doc["runs"].append(r)
            print(f"{dtype} {m}x{n}x{k}: first window {r['first_tflops']:.0f} TFLOP/s, sustained "
                  f"{r['sustained_tflops']:.0f} TFLOP/s at {r['sustained_sm_mhz']:.0f} MHz, "
                  f"{r['sustained_power_w']:.0f} W", flush=True)
    doc["block"] = block_run(handle)
    b = doc["block"]
    print(f"llama3_70b_tp4 block F+B+W: first window {b['first_ms']:.2f} ms, sustained {b['sustained_ms']:.2f} ms at "
          f"{b['sustained_sm_mhz']:.0f} MHz", flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
