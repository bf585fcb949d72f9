"""The PyTorch bar for bench_lm_step: what fast users run, not transformers' model classes.
GPT-2 124M as nanoGPT writes it (plain nn.Module, F.scaled_dot_product_attention with
is_causal, tied head, fused AdamW) at batch 16 x 1024, and a plain Llama of the SmolLM2-135M
shape (RMSNorm, rotary embeddings, grouped-query SDPA, SwiGLU, tied head) at batch 8 x 1024;
eager and torch.compile; TF32 or bf16 autocast (fp32 master weights, as meganeura's bf16).
Prints one BENCH line per configuration with the median step time and the peak device memory.

usage: python3 benchmarks/torch_nanogpt.py gpt2|smollm2 [--precision tf32,bf16]
                                          [--mode eager,compile] [--batch B] [--seq T]
                                          [--steps N] [--lora R] [--profile N]
--lora R: LoRA fine-tuning through peft (LoraConfig r=R, lora_alpha=2R, every linear layer
but the head, dropout 0), the base frozen and AdamW over the adapters only: the bar of
bench_lm_step --lora-rank R.
--profile N: after the timing, one step under torch.profiler, its N largest kernels by device
time (TORCH-PROFILE lines): where PyTorch's step goes, beside bench_lm_step --profile.
"""
import argparse
import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_timing import print_bench, time_steps


class GPT2Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, d=768, layers=12, heads=12, ctx=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(GPT2Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, labels):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden, eps):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(y.transpose(1, 2).contiguous().view(b, t, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, vocab=49152, d=576, layers=30, heads=9, kv_heads=3, hidden=1536,
                 eps=1e-5, theta=100000.0, ctx=1024):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaBlock(d, heads, kv_heads, hidden, eps)
                                    for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=eps)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight
        hd = d // heads
        inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
        ang = torch.outer(torch.arange(ctx).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos()[None, None], persistent=False)
        self.register_buffer("sin", ang.sin()[None, None], persistent=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, labels):
        t = ids.shape[1]
        cos, sin = self.cos[:, :, :t], self.sin[:, :, :t]
        x = self.embed_tokens(ids)
        for blk in self.layers:
            x = blk(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


LINEAR = {"gpt2": ["c_attn", "c_proj", "c_fc", "mlp_proj"],
          "smollm2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def profile_step(step, top):
    """One more step under torch.profiler: each kernel's device time, the largest first."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0)
        if us > 0 and e.key:
            rows.append((us / 1000.0, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"TORCH-PROFILE total_ms={total:.3f} kernels={sum(r[1] for r in rows)}")
    for ms, count, key in rows[:top]:
        print(f"TORCH-PROFILE {ms:8.3f} ms {count:5d}x {key[:150]}")


def run(name, mode, precision, batch, seq, steps, lora, profile=0):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    model = (GPT2() if name == "gpt2" else Llama(ctx=seq)).cuda().train()
    batch = batch or (16 if name == "gpt2" else 8)
    vocab = model.lm_head.weight.shape[0]
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=lora, lora_alpha=2 * lora, lora_dropout=0.0,
                                                 target_modules=LINEAR[name], bias="none"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    labels = torch.randint(0, vocab, (batch, seq), device="cuda")
    fwd = torch.compile(model) if mode == "compile" else model
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = fwd(ids, labels)
        loss.backward()
        opt.step()
        return loss

    ms, warm_s, peak, loss = time_steps(step, steps)
    assert math.isfinite(loss.item())
    if profile:
        profile_step(step, profile)
    tag = f"_lora{lora}" if lora else ""
    print_bench(f"torch_nanogpt_{name}{tag}_{precision}_{mode}", batch * seq, ms, warm_s, peak,
                loss)
    del model, opt, fwd
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["gpt2", "smollm2"])
    ap.add_argument("--precision", default="tf32,bf16")
    ap.add_argument("--mode", default="eager,compile")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lora", type=int, default=0)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after timing, one step under torch.profiler: its N largest kernels")
    a = ap.parse_args()
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for precision in a.precision.split(","):
        for mode in a.mode.split(","):
            run(a.model, mode, precision, a.batch, a.seq, a.steps, a.lora, a.profile)


if __name__ == "__main__":
    main()
