#!/usr/bin/env python3
"""PyTorch's decode speed on the shapes of bench_decode (benchmarks/decode.c), same GPU.

Two bars, both greedy from random weights, prompt --prompt tokens, --new new tokens:
  generate  transformers' LlamaForCausalLM / GPT2LMHeadModel .generate(do_sample=False,
            use_cache=True), bf16 and fp32, every new token forced (min_new_tokens).
            ms/token = (time of generate(new) - time of generate(1)) / (new - 1), so the
            prefill stays out, as in bench_decode.
  graph     a hand-written decoder (plain nn.Module) with static KV caches preallocated for
            prompt + new rows, one token per forward, the whole decode step (embedding,
            layers, head, argmax feeding the next step's input) captured once in a CUDA graph
            (torch.cuda.CUDAGraph) and replayed per token; bf16.
Times are CUDA events around the decode, medians over --repeats after a warm-up. One
BENCH-TORCH-DECODE line per configuration and, with --json FILE, one JSON object a line (the
fields of bench_decode's) for scripts/decode_summary.py.

usage: python3 benchmarks/torch_decode.py [smollm2|gpt2] [--batch 1,8] [--prompt 128]
                                          [--new 256] [--repeats 3] [--impl generate,graph]
                                          [--precision bf16,f32] [--json FILE]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch import nn

SMOLLM2 = dict(model_type="llama", vocab_size=49152, hidden_size=576, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
               max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
               tie_word_embeddings=True, hidden_act="silu")
GPT2 = dict(model_type="gpt2", vocab_size=50257, n_embd=768, n_layer=12, n_head=12,
            n_positions=1024, activation_function="gelu_new")


def hf_model(name, dtype):
    import transformers
    if name == "smollm2":
        cfg = transformers.LlamaConfig(**{k: v for k, v in SMOLLM2.items() if k != "model_type"})
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(**{k: v for k, v in GPT2.items() if k != "model_type"})
        model = transformers.GPT2LMHeadModel(cfg)
    return model.to("cuda", dtype).eval()


def cuda_ms(fn):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


@torch.inference_mode()
def time_generate(name, dtype, batch, prompt, new, repeats):
    model = hf_model(name, dtype)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    mask = torch.ones_like(ids)

    def gen(n):
        return lambda: model.generate(ids, attention_mask=mask, do_sample=False, use_cache=True,
                                      max_new_tokens=n, min_new_tokens=n, pad_token_id=0)

    gen(8)()
    one = statistics.median(cuda_ms(gen(1)) for _ in range(repeats))
    full = statistics.median(cuda_ms(gen(new)) for _ in range(repeats))
    del model
    torch.cuda.empty_cache()
    return one, (full - one) / (new - 1)


# ---- the static-cache decoder


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype))


class Layer(nn.Module):
    def __init__(self, c, batch, max_seq, dtype):
        super().__init__()
        h, self.heads, self.kv_heads = c["hidden"], c["heads"], c["kv_heads"]
        self.hd, self.llama, self.eps = h // c["heads"], c["llama"], c["eps"]
        kv = self.kv_heads * self.hd
        self.qkv = nn.Linear(h, h + 2 * kv, bias=not self.llama)
        self.o = nn.Linear(h, h, bias=not self.llama)
        if self.llama:
            self.gate_up = nn.Linear(h, 2 * c["inter"], bias=False)
            self.n1, self.n2 = nn.Parameter(torch.ones(h)), nn.Parameter(torch.ones(h))
        else:
            self.ln1, self.ln2 = nn.LayerNorm(h, eps=self.eps), nn.LayerNorm(h, eps=self.eps)
            self.fc = nn.Linear(h, c["inter"])
        self.down = nn.Linear(c["inter"], h, bias=not self.llama)
        shape = (batch, self.kv_heads, max_seq, self.hd)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype), persistent=False)

    def norm(self, x, i):
        if self.llama:
            return rms_norm(x, self.n1 if i == 1 else self.n2, self.eps)
        return (self.ln1 if i == 1 else self.ln2)(x)

    def forward(self, x, pos, cos, sin, mask):
        b = x.shape[0]
        kv = self.kv_heads * self.hd
        q, k, v = self.qkv(self.norm(x, 1)).split([self.heads * self.hd, kv, kv], -1)
        q = q.view(b, 1, self.heads, self.hd).transpose(1, 2)
        k = k.view(b, 1, self.kv_heads, self.hd).transpose(1, 2)
        v = v.view(b, 1, self.kv_heads, self.hd).transpose(1, 2)
        if self.llama:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        # One query row per head: the query heads of a kv head become its query rows, so GQA
        # reads each cache once (no repeated copy).
        q = q.reshape(b, self.kv_heads, self.heads // self.kv_heads, self.hd)
        a = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask)
        x = x + self.o(a.reshape(b, 1, -1))
        y = self.norm(x, 2)
        if self.llama:
            g, u = self.gate_up(y).chunk(2, -1)
            y = F.silu(g) * u
        else:
            y = F.gelu(self.fc(y), approximate="tanh")
        return x + self.down(y)


def rope(x, cos, sin):
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat((-b, a), -1) * sin


class Decoder(nn.Module):
    """One token per sequence per forward; the caches hold max_seq rows."""

    def __init__(self, name, batch, max_seq, dtype):
        super().__init__()
        llama = name == "smollm2"
        m = SMOLLM2 if llama else GPT2
        c = dict(llama=llama,
                 hidden=m["hidden_size"] if llama else m["n_embd"],
                 heads=m["num_attention_heads"] if llama else m["n_head"],
                 kv_heads=m["num_key_value_heads"] if llama else m["n_head"],
                 inter=m["intermediate_size"] if llama else 4 * m["n_embd"],
                 eps=m["rms_norm_eps"] if llama else 1e-5)
        layers = m["num_hidden_layers"] if llama else m["n_layer"]
        self.llama, self.eps, self.max_seq = llama, c["eps"], max_seq
        self.emb = nn.Embedding(m["vocab_size"], c["hidden"])
        if not llama:
            self.wpe = nn.Embedding(m["n_positions"], c["hidden"])
            self.lnf = nn.LayerNorm(c["hidden"])
        else:
            self.nf = nn.Parameter(torch.ones(c["hidden"]))
            hd = c["hidden"] // c["heads"]
            inv = 1.0 / (m["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
            ang = torch.outer(torch.arange(max_seq).float(), inv)
            ang = torch.cat((ang, ang), -1)
            self.register_buffer("cos", ang.cos().to(dtype), persistent=False)
            self.register_buffer("sin", ang.sin().to(dtype), persistent=False)
        self.layers = nn.ModuleList(Layer(c, batch, max_seq, dtype) for _ in range(layers))
        self.register_buffer("steps", torch.arange(max_seq), persistent=False)

    def forward(self, tok, pos):
        x = self.emb(tok)
        cos = sin = None
        if self.llama:
            cos, sin = self.cos[pos].view(1, 1, 1, -1), self.sin[pos].view(1, 1, 1, -1)
        else:
            x = x + self.wpe(pos).view(1, 1, -1)
        mask = (self.steps <= pos).view(1, 1, 1, -1)
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        x = rms_norm(x, self.nf, self.eps) if self.llama else self.lnf(x)
        return F.linear(x, self.emb.weight)


@torch.inference_mode()
def time_graph(name, dtype, batch, prompt, new, repeats):
    torch.manual_seed(0)
    model = Decoder(name, batch, prompt + new, dtype)
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
    model = model.to("cuda", dtype)
    tok = torch.randint(0, model.emb.num_embeddings, (batch, 1), device="cuda")
    pos = torch.zeros(1, dtype=torch.long, device="cuda")

    def step():
        nxt = model(tok, pos).argmax(-1)
        tok.copy_(nxt)
        pos.add_(1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def prefill():
        pos.zero_()
        for _ in range(prompt):
            graph.replay()

    def decode():
        for _ in range(new):
            graph.replay()

    prefill()
    decode()
    times, fills = [], []
    for _ in range(repeats):
        fills.append(cuda_ms(prefill))
        times.append(cuda_ms(decode) / new)
    del graph, model
    torch.cuda.empty_cache()
    return statistics.median(fills), statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2", choices=["smollm2", "gpt2"])
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--impl", default="generate,graph")
    ap.add_argument("--precision", default="bf16,f32",
                    help="for generate; the CUDA-graph decoder runs bf16 only")
    ap.add_argument("--json")
    a = ap.parse_args()
    import transformers
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, CUDA "
          f"{torch.version.cuda}, {torch.cuda.get_device_name()}", flush=True)
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    out = open(a.json, "a") if a.json else None
    for impl in a.impl.split(","):
        precs = a.precision.split(",") if impl == "generate" else ["bf16"]
        for prec in precs:
            for batch in map(int, a.batch.split(",")):
                fn = time_generate if impl == "generate" else time_graph
                fill, ms = fn(a.model, dtypes[prec], batch, a.prompt, a.new, a.repeats)
                tps = 1e3 / ms
                tag = f"torch_{impl}_{a.model}_b{batch}_{prec}"
                print(f"BENCH-TORCH-DECODE {tag} prefill {fill:.2f} ms  {ms:.3f} ms/token  "
                      f"{tps:.1f} tokens/s/seq  {tps * batch:.1f} tokens/s total", flush=True)
                if out:
                    out.write(json.dumps(dict(
                        impl=f"torch_{impl}", model=a.model, batch=batch, precision=prec,
                        quant="none", backend="cuda", prompt=a.prompt, new=a.new,
                        prefill_ms=round(fill, 4), ms_per_token=round(ms, 5),
                        tokens_per_s_seq=round(tps, 2), tokens_per_s=round(tps * batch, 2),
                        gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                        transformers=transformers.__version__)) + "\n")
                    out.flush()
    if out:
        out.close()


if __name__ == "__main__":
    main()
