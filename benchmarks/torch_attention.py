"""PyTorch's bar for benchmarks/attention.c: F.scaled_dot_product_attention(is_causal=True)
on the flash backend, forward alone and forward + backward, at the same shapes (GPT-2 124M:
B 16, T 1024, 12 heads of 64; SmolLM2-135M: B 8, T 1024, 9 query heads over 3 kv heads of 64),
in bf16 (or f16). Median of CUDA-event timings. One TORCH-ATTN line per shape and pass, with
TFLOP/s counted as benchmarks/attention.c does: B H T^2 d multiply-adds (two FLOPs each) per
product over the causal triangle, two products forward and five backward (scores, dP, dV, dK,
dQ).

usage: python3 benchmarks/torch_attention.py [gpt2|smollm2|all] [--precision bf16|f16]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

SHAPES = {"gpt2": (16, 1024, 12, 12, 64), "smollm2": (8, 1024, 9, 3, 64)}


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def attend(q, k, v, group):
    # The flash backend takes GQA through enable_gqa on recent PyTorch; older ones get K and V
    # repeated per query head (a copy inside the timing, as a GQA model without it would pay).
    if group == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    except (TypeError, RuntimeError):
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="?", default="all", choices=["all", *SHAPES])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        backend = torch.backends.cuda.sdp_kernel(
            enable_flash=True, enable_math=False, enable_mem_efficient=False
        )
    names = SHAPES if args.shape == "all" else [args.shape]
    with backend:
        for name in names:
            b, t, h, kvh, d = SHAPES[name]
            gen = torch.Generator(device="cuda").manual_seed(0)

            def rnd(heads):
                x = torch.rand(b, heads, t, d, device="cuda", dtype=torch.float32, generator=gen)
                return (x * 3 - 1.5).to(dtype).requires_grad_()

            q, k, v = rnd(h), rnd(kvh), rnd(kvh)
            dy = torch.randn(b, h, t, d, device="cuda", dtype=dtype, generator=gen)
            unit = b * h * t * t * d

            def fwd():
                with torch.no_grad():
                    attend(q, k, v, h // kvh)

            def fwd_bwd():
                y = attend(q, k, v, h // kvh)
                y.backward(dy)

            for label, fn, products in (("forward", fwd, 2), ("forward+backward", fwd_bwd, 7)):
                ms = timed(fn, args.reps)
                print(
                    f"TORCH-ATTN {name} {args.precision} B={b} T={t} H={h} KVH={kvh} d={d} "
                    f"pass={label} ms={ms:.3f} tflops={products * unit / (ms * 1e-3) / 1e12:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
