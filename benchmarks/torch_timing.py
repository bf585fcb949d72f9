"""Timing shared by the PyTorch benchmark scripts: warm-up steps, then the median of CUDA-event
timed steps, with the peak device memory PyTorch allocated during them."""
import statistics
import time

import torch


def time_steps(step, steps, warmup=3):
    """Runs step() warmup times, then `steps` times between CUDA events. Returns the median
    milliseconds, the warm-up seconds, the peak MiB allocated while timed, and the last loss
    step() returned."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(steps):
        start.record()
        loss = step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times), warm_s, torch.cuda.max_memory_allocated() / 2**20, loss


def print_bench(name, tokens, ms, warm_s, peak, loss):
    """The BENCH line scripts/gpu_summary.py reads."""
    print(f"BENCH {name} step_ms={ms:.3f} tokens_per_s={tokens / (ms * 1e-3):.0f} "
          f"peak_mib={peak:.0f} warmup_s={warm_s:.1f} loss={loss.item():.4f}", flush=True)
