"""PyTorch timings of the same training steps as bench_mlp_step and bench_block_step,
eager and with the whole step captured in a torch.cuda.CUDAGraph, on the same GPU in
the same run. Prints one BENCH line per configuration for scripts/gpu-test.sh.

usage: python3 benchmarks/torch_steps.py [--tf32]
"""
import statistics
import sys

import torch
import torch.nn.functional as F


def time_ms(fn, warmup, reps, batch):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        for _ in range(batch):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / batch)
    return statistics.median(times)


def graphed(step, opt):
    """Captures step() (forward, backward, optimizer) into one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def mlp(dev):
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10)).to(dev)
    x = torch.rand(128, 784, device=dev)
    y = torch.randint(0, 10, (128,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step, opt, (50, 21, 100)


class Block(torch.nn.Module):
    def __init__(self, d=576, heads=9, kv_heads=3, hd=64, ff=1536, theta=10000.0, t=512):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, hd
        self.ln1 = torch.nn.Parameter(torch.ones(d))
        self.ln2 = torch.nn.Parameter(torch.ones(d))
        self.q = torch.nn.Linear(d, heads * hd, bias=False)
        self.k = torch.nn.Linear(d, kv_heads * hd, bias=False)
        self.v = torch.nn.Linear(d, kv_heads * hd, bias=False)
        self.o = torch.nn.Linear(heads * hd, d, bias=False)
        self.gate = torch.nn.Linear(d, ff, bias=False)
        self.up = torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)
        inv = theta ** (-torch.arange(0, hd, 2).float() / hd)
        ang = torch.arange(t).float()[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())

    def rope(self, x):
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rot * self.sin

    def forward(self, h):
        b, t, d = h.shape
        x = F.rms_norm(h, (d,), self.ln1, 1e-5)
        q = self.rope(self.q(x).view(b, t, self.heads, self.hd).transpose(1, 2))
        k = self.rope(self.k(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2))
        v = self.v(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + self.o(a.transpose(1, 2).reshape(b, t, -1))
        x = F.rms_norm(h, (d,), self.ln2, 1e-5)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


def block(dev):
    model = Block().to(dev)
    x = torch.randn(8, 512, 576, device=dev)
    target = torch.randn(8, 512, 576, device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, capturable=True)

    def step():
        opt.zero_grad(set_to_none=False)
        F.mse_loss(model(x), target).backward()
        opt.step()

    return step, opt, (10, 11, 10)


def main():
    tf32 = "--tf32" in sys.argv
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    dev = torch.device("cuda")
    suffix = "_tf32" if tf32 else ""
    for name, make in (("mlp_step", mlp), ("block_step", block)):
        step, opt, (warmup, reps, batch) = make(dev)
        eager = time_ms(step, warmup, reps, batch)
        replay = graphed(step, opt)
        graph = time_ms(replay, warmup, reps, batch)
        print(f"BENCH {name}{suffix} torch_eager_ms={eager:.4f} torch_graph_ms={graph:.4f} "
              f"torch={torch.__version__} gpu={torch.cuda.get_device_name().replace(' ', '_')}",
              flush=True)


if __name__ == "__main__":
    main()
