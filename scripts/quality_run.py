#!/usr/bin/env python3
"""Training quality in bf16: meganeura fp32, meganeura bf16 and PyTorch autocast bf16 train the
same small GPT-2 from the same initial weights on the same batches, and their loss curves are
compared.

The text is English prose that every Python install carries, so the run needs no network:
the help topics of pydoc_data/topics.py and the docstrings of the standard library's modules
(read with ast, nothing imported). It is tokenized with GPT-2's tokenizer when transformers
finds it in the local cache (HF_HUB_OFFLINE), else byte by byte (vocabulary 256).

The script writes, in a work folder: config.json and init.safetensors (transformers' GPT-2
names and layouts, initialized as transformers' _init_weights does: normal(0, 0.02), the two
c_proj weights normal(0, 0.02 / sqrt(2 * layers)), norms 1, biases 0; the head tied to wte),
the batches (every step's B windows of T + 1 token ids, drawn once from a seeded generator)
and the learning rates (linear warm-up, then a cosine down to 10%). benchmarks/quality_driver.c
(bench_quality_driver) trains meganeura on them in fp32 (no TF32) and in bf16 mixed precision;
the PyTorch side is a nanoGPT-style module with the same parameter names and layouts (Conv1D
weights [in, out] through addmm, scaled_dot_product_attention, tanh GELU, tied head), fp32
master weights under torch.autocast(dtype=torch.bfloat16). All three use AdamW (betas 0.9,
0.95, eps 1e-8, weight decay 0.1 on every parameter, as meganeura applies it) after global
gradient-norm clipping at 1.0.

Output: an SVG of the three loss curves, and below them each bf16 curve's difference to
meganeura fp32 (moving means over 50 steps, in percent), at --out (docs/quality-bf16.svg),
and a CSV beside it (same name, .csv): step, lr and the three losses. It prints the final
losses (the mean of the last 50 steps) and whether they are within 1% of each other; the exit
status is 0 when they are, 1 when not, 2 when a run failed.

usage: python3 scripts/quality_run.py [--steps 1000] [--device cuda|cpu] [--out FILE.svg]
           [--driver BUILD/bench_quality_driver] [--batch 16] [--seq 256] [--layers 6]
           [--width 384] [--heads 6] [--lr 1e-3] [--warmup 100] [--seed 0]
           [--tokenizer auto|gpt2|bytes] [--no-torch] [--work DIR] [--dry-run]
  --dry-run   a check of the machinery anywhere (no GPU, no PyTorch needed): a 2-layer model
              64 wide with 2 heads, context 32, batch 4, 30 steps (unless given), on the CPU
              backend, the help topics only, byte tokens, output in the work folder unless
              --out is given; the PyTorch curve only if torch imports.
"""
import argparse
import ast
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback

import numpy as np

from f32_safetensors import read_safetensors, write_safetensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY, GRAD_CLIP = 0.9, 0.95, 1e-8, 0.1, 1.0
FINAL_WINDOW = 50  # the final loss is the mean of this many last steps
WITHIN = 0.01      # the three final losses must be within 1% of each other
SERIES = [("meganeura_f32", "meganeura fp32", "#1f77b4"),
          ("meganeura_bf16", "meganeura bf16", "#d62728"),
          ("torch_autocast_bf16", "PyTorch autocast bf16", "#2ca02c")]


# ---------------------------------------------------------------- text and tokens

def fail(message):
    """Exit status 2: a run could not be made (1 is kept for losses not within 1%)."""
    print(f"quality_run: {message}", file=sys.stderr)
    sys.exit(2)


def help_topics():
    import pydoc_data.topics
    t = pydoc_data.topics.topics
    return [t[k] for k in sorted(t)]


def stdlib_docstrings():
    """Docstrings of the standard library's modules, classes and functions, read from their
    source with ast (no module is imported), in a fixed order."""
    root = sysconfig.get_paths()["stdlib"]
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
            "lib2to3", "turtledemo"}
    docs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            try:
                with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                    d = ast.get_docstring(node)
                    if d and len(d) >= 40:
                        docs.append(d)
    return docs


def gpt2_tokenizer():
    """GPT-2's tokenizer from the local Hugging Face cache, or None (with the reason)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
        transformers.logging.set_verbosity_error()
        why = ""
        for cls in ("GPT2TokenizerFast", "GPT2Tokenizer"):
            try:
                tok = getattr(transformers, cls).from_pretrained("gpt2", local_files_only=True)
            except Exception as e:  # not cached, or no tokenizers backend
                why = f"{cls}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                continue
            # Some versions hand back an empty tokenizer when the files are missing.
            ids = tok("Hello world", add_special_tokens=False)["input_ids"]
            if len(tok) == 50257 and tok.eos_token_id == 50256 and list(ids) == [15496, 995]:
                return tok, ""
            why = f"{cls} loaded a tokenizer that is not GPT-2's (vocabulary {len(tok)})"
        return None, why
    except ImportError as e:
        return None, f"transformers: {e}"


def tokenize(docs, which):
    """(token ids as uint32, vocabulary size, tokenizer name). Documents are separated by
    GPT-2's <|endoftext|>, or by a blank line in bytes."""
    if which in ("auto", "gpt2"):
        tok, why = gpt2_tokenizer()
        if tok is not None:
            eos = tok.eos_token_id
            ids = []
            for i in range(0, len(docs), 512):
                for d in tok(docs[i:i + 512], add_special_tokens=False)["input_ids"]:
                    ids.extend(d)
                    ids.append(eos)
            return np.asarray(ids, np.uint32), len(tok), "gpt2"
        if which == "gpt2":
            fail(f"GPT-2's tokenizer is not available offline ({why})")
        print(f"quality_run: GPT-2's tokenizer is not in the local cache ({why}); "
              "byte tokens (vocabulary 256)")
    data = "\n\n".join(docs).encode("utf-8")
    return np.frombuffer(data, np.uint8).astype(np.uint32), 256, "bytes"


# ---------------------------------------------------------------- the shared run

def gpt2_config(vocab, width, layers, heads, seq):
    return {"model_type": "gpt2", "vocab_size": vocab, "n_positions": seq, "n_embd": width,
            "n_layer": layers, "n_head": heads, "layer_norm_epsilon": 1e-5,
            "initializer_range": 0.02, "activation_function": "gelu_new",
            "tie_word_embeddings": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
            "attn_pdrop": 0.0}


def init_weights(cfg, seed):
    """transformers' GPT-2 initialization, under its names (prefix "transformer.")."""
    rng = np.random.default_rng(seed)
    d, v, n, p = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"], "transformer."
    std = cfg["initializer_range"]
    w = {}

    def normal(name, shape, s=std):
        w[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(s))

    normal(p + "wte.weight", (v, d))
    normal(p + "wpe.weight", (cfg["n_positions"], d))
    for i in range(n):
        q = f"{p}h.{i}."
        for ln in ("ln_1", "ln_2"):
            w[q + ln + ".weight"] = np.ones(d, np.float32)
            w[q + ln + ".bias"] = np.zeros(d, np.float32)
        for what, n_in, n_out, s in (("attn.c_attn", d, 3 * d, std),
                                     ("attn.c_proj", d, d, std / math.sqrt(2 * n)),
                                     ("mlp.c_fc", d, 4 * d, std),
                                     ("mlp.c_proj", 4 * d, d, std / math.sqrt(2 * n))):
            normal(q + what + ".weight", (n_in, n_out), s)
            w[q + what + ".bias"] = np.zeros(n_out, np.float32)
    w[p + "ln_f.weight"] = np.ones(d, np.float32)
    w[p + "ln_f.bias"] = np.zeros(d, np.float32)
    return w


def draw_windows(tokens, steps, batch, seq, seed):
    """[steps, batch, seq + 1] windows at uniformly drawn offsets."""
    rng = np.random.default_rng(seed + 1)
    off = rng.integers(0, len(tokens) - seq, size=(steps, batch))
    return tokens[off[..., None] + np.arange(seq + 1)].astype(np.uint32)


def schedule(steps, lr, warmup):
    """Linear warm-up over `warmup` steps, then a cosine to 10% of lr (meganeura train's)."""
    warmup = min(warmup, steps - 1)
    out = np.empty(steps, np.float64)
    for s in range(steps):
        if s < warmup:
            out[s] = lr * (s + 1) / warmup
        else:
            p = min(1.0, (s - warmup) / max(1, steps - warmup))
            out[s] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
    return out.astype(np.float32)


# ---------------------------------------------------------------- meganeura

def meganeura_curve(driver, work, args, precision, device):
    losses = os.path.join(work, f"losses-{precision}.txt")
    cmd = [driver, "--model", work, "--batches", os.path.join(work, "batches.u32"),
           "--lrs", os.path.join(work, "lrs.f32"), "--batch", str(args.batch),
           "--seq", str(args.seq), "--steps", str(args.steps), "--losses", losses,
           "--precision", precision, "--beta1", repr(BETA1), "--beta2", repr(BETA2),
           "--eps", repr(ADAM_EPS), "--weight-decay", repr(WEIGHT_DECAY),
           "--grad-clip", repr(GRAD_CLIP)]
    t0 = time.time()
    done = subprocess.run(cmd, env=dict(os.environ, MN_BACKEND=device))
    if done.returncode != 0:
        print(f"quality_run: meganeura {precision} failed (exit {done.returncode})")
        return None
    with open(losses) as f:
        head = f.readline().split()
        if head[:3] != ["#", "backend", device]:
            print(f"quality_run: meganeura {precision} ran on {' '.join(head[2:3])}, "
                  f"not {device}")
            return None
        vals = np.array([float(line.split()[1]) for line in f], np.float64)
    print(f"quality_run: meganeura {precision}: {len(vals)} steps in {time.time() - t0:.1f} s")
    return vals if len(vals) == args.steps else None


# ---------------------------------------------------------------- PyTorch

def torch_curve(work, cfg, windows, lrs, device):
    """nanoGPT-style GPT-2 with transformers' names and layouts, fp32 master weights, trained
    under torch.autocast(bfloat16) on the same windows and learning rates."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    d, heads, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]

    class Conv1D(nn.Module):  # transformers' Conv1D: weight [in, out], x @ w + b by addmm
        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(n_in, n_out))
            self.bias = nn.Parameter(torch.zeros(n_out))

        def forward(self, x):
            y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
            return y.view(*x.shape[:-1], y.shape[-1])

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = Conv1D(d, 3 * d), Conv1D(d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = Conv1D(d, 4 * d), Conv1D(4 * d, d)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(d, eps=eps), Attention()
            self.ln_2, self.mlp = nn.LayerNorm(d, eps=eps), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(cfg["vocab_size"], d), wpe=nn.Embedding(cfg["n_positions"], d),
                h=nn.ModuleList(Block() for _ in range(cfg["n_layer"])),
                ln_f=nn.LayerNorm(d, eps=eps)))

        def forward(self, ids, labels):
            tr = self.transformer
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = tr.wte(ids) + tr.wpe(pos)
            for blk in tr.h:
                x = blk(x)
            logits = F.linear(tr.ln_f(x), tr.wte.weight)  # the tied head
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))

    dev = torch.device(device)
    model = GPT()
    init = read_safetensors(os.path.join(work, "init.safetensors"))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()}, strict=True)
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=float(lrs[0]), betas=(BETA1, BETA2),
                            eps=ADAM_EPS, weight_decay=WEIGHT_DECAY,
                            fused=dev.type == "cuda")
    data = torch.from_numpy(windows.astype(np.int64)).to(dev)
    losses = []
    t0 = time.time()
    for s in range(len(lrs)):
        for g in opt.param_groups:
            g["lr"] = float(lrs[s])
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(data[s, :, :-1], data[s, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        losses.append(loss.detach())
        if (s + 1) % max(1, len(lrs) // 10) == 0:
            print(f"quality_run: torch step {s + 1}/{len(lrs)} loss {losses[-1].item():.4f}",
                  flush=True)
    vals = torch.stack(losses).float().cpu().numpy().astype(np.float64)
    print(f"quality_run: torch autocast bf16 ({torch.__version__}, "
          f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}): "
          f"{len(vals)} steps in {time.time() - t0:.1f} s")
    return vals


# ---------------------------------------------------------------- outputs

def moving_mean(x, n):
    c = np.cumsum(np.insert(np.asarray(x, np.float64), 0, 0.0))
    out = np.empty(len(x))
    for i in range(len(x)):
        lo = max(0, i + 1 - n)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def nice_ticks(lo, hi, n=5):
    span = hi - lo if hi > lo else 1.0
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 2.5, 5, 10):
        if span / (m * step) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def write_svg(path, steps, curves, title, subtitle):
    """Plain SVG: the loss curves, and below them the bf16 curves' difference to meganeura
    fp32 (moving means over FINAL_WINDOW steps, percent) with the 1% band."""
    W, H, L, R = 960, 640, 70, 20
    top = (50, 380)    # loss panel, y from .. to
    bot = (430, 590)   # difference panel
    x0, x1 = 1, max(steps[-1], 2)

    def X(s):
        return L + (s - x0) / (x1 - x0) * (W - L - R)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="15">{esc(title)}</text>',
           f'<text x="{W / 2}" y="38" text-anchor="middle" fill="#555">{esc(subtitle)}</text>']

    def panel(ytop, ybot, lo, hi, label, series, dashed=()):
        def Y(v):
            return ybot - (v - lo) / (hi - lo) * (ybot - ytop)
        out.append(f'<rect x="{L}" y="{ytop}" width="{W - L - R}" height="{ybot - ytop}" '
                   'fill="none" stroke="#888"/>')
        for t in nice_ticks(lo, hi):
            out.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(t):.1f}" y2="{Y(t):.1f}" '
                       'stroke="#eee"/>')
            out.append(f'<text x="{L - 6}" y="{Y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
        for v in dashed:
            out.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" '
                       'stroke="#999" stroke-dasharray="5,4"/>')
        for t in nice_ticks(x0, x1):
            out.append(f'<line x1="{X(t):.1f}" x2="{X(t):.1f}" y1="{ybot}" y2="{ybot + 4}" '
                       'stroke="#888"/>')
            out.append(f'<text x="{X(t):.1f}" y="{ybot + 16}" text-anchor="middle">{t:g}</text>')
        out.append(f'<text x="16" y="{(ytop + ybot) / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 16 {(ytop + ybot) / 2})">{esc(label)}</text>')
        for ys, color in series:
            pts = " ".join(f"{X(s):.1f},{Y(min(max(v, lo), hi)):.1f}" for s, v in zip(steps, ys))
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.2" '
                       f'stroke-opacity="0.85" points="{pts}"/>')

    present = [(key, name, color) for key, name, color in SERIES if curves.get(key) is not None]
    allv = np.concatenate([curves[k] for k, _, _ in present])
    lo, hi = float(np.min(allv)), float(np.max(allv))
    pad = 0.03 * (hi - lo if hi > lo else 1.0)
    panel(top[0], top[1], lo - pad, hi + pad, "training loss",
          [(curves[k], c) for k, _, c in present])
    base = curves.get("meganeura_f32")
    diffs = []
    if base is not None:
        ref = moving_mean(base, FINAL_WINDOW)
        for k, _, c in present:
            if k != "meganeura_f32":
                diffs.append((100.0 * (moving_mean(curves[k], FINAL_WINDOW) / ref - 1.0), c))
    if diffs:
        m = max(1.5, float(max(np.max(np.abs(d)) for d, _ in diffs)) * 1.05)
        panel(bot[0], bot[1], -m, m, "% vs fp32", diffs, dashed=(-100 * WITHIN, 0.0, 100 * WITHIN))
        out.append(f'<text x="{W - R - 4}" y="{bot[0] + 14}" text-anchor="end" fill="#555">'
                   f'difference to meganeura fp32, means over {FINAL_WINDOW} steps; dashed: '
                   f'&#177;{100 * WITHIN:g}%</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 8}" text-anchor="middle">step</text>')
    for i, (_, name, color) in enumerate(present):
        y = top[0] + 18 + 18 * i
        out.append(f'<line x1="{W - R - 210}" x2="{W - R - 185}" y1="{y - 4}" y2="{y - 4}" '
                   f'stroke="{color}" stroke-width="2.5"/>')
        out.append(f'<text x="{W - R - 180}" y="{y}">{esc(name)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_csv(path, lrs, curves):
    keys = [k for k, _, _ in SERIES]
    with open(path, "w") as f:
        f.write("step,lr," + ",".join(keys) + "\n")
        for s in range(len(lrs)):
            vals = ["" if curves.get(k) is None else f"{curves[k][s]:.6f}" for k in keys]
            f.write(f"{s + 1},{float(lrs[s]):.6g}," + ",".join(vals) + "\n")


# ---------------------------------------------------------------- main

def default_driver():
    for build in ("build-gpu", "build"):
        p = os.path.join(ROOT, build, "bench_quality_driver")
        if os.path.exists(p):
            return p
    return os.path.join(ROOT, "build-gpu", "bench_quality_driver")


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, help="training steps (1000; --dry-run 30)")
    ap.add_argument("--device", choices=["cuda", "cpu"],
                    help="meganeura's backend and PyTorch's device (cuda; --dry-run cpu)")
    ap.add_argument("--out", help="the SVG; the CSV goes beside it "
                                  "(docs/quality-bf16.svg; --dry-run: the work folder)")
    ap.add_argument("--driver", default=default_driver(), help="bench_quality_driver")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--width", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", choices=["auto", "gpt2", "bytes"],
                    help="auto: GPT-2's when cached, else bytes (--dry-run: bytes)")
    ap.add_argument("--no-torch", action="store_true", help="leave out the PyTorch curve")
    ap.add_argument("--work", help="work folder (kept); default a temporary one, removed")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny model, CPU, few steps: checks the machinery without a GPU")
    a = ap.parse_args()
    dry = a.dry_run
    defaults = dict(steps=30, device="cpu", batch=4, seq=32, layers=2, width=64, heads=2,
                    tokenizer="bytes") if dry else \
        dict(steps=1000, device="cuda", batch=16, seq=256, layers=6, width=384, heads=6,
             tokenizer="auto")
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if dry and a.warmup >= a.steps:
        a.warmup = max(1, a.steps // 10)
    if a.width % a.heads:
        ap.error("--width must be a multiple of --heads")
    if not os.path.exists(a.driver):
        fail(f"no driver at {a.driver}; build benchmarks/quality_driver.c "
             "(cmake --build BUILD) or pass --driver")

    work = a.work or tempfile.mkdtemp(prefix="mn_quality_")
    os.makedirs(work, exist_ok=True)
    out_svg = a.out or (os.path.join(work, "quality-bf16.svg") if dry
                        else os.path.join(ROOT, "docs", "quality-bf16.svg"))
    out_csv = os.path.splitext(out_svg)[0] + ".csv"
    try:
        return run(a, work, out_svg, out_csv, dry)
    except Exception:
        traceback.print_exc()
        return 2
    finally:
        if not a.work and not (dry and not a.out):
            shutil.rmtree(work, ignore_errors=True)
        elif dry and not a.out:
            print(f"quality_run: dry run's files are in {work}")


def run(a, work, out_svg, out_csv, dry):
    t0 = time.time()
    docs = help_topics() if dry else help_topics() + stdlib_docstrings()
    tokens, vocab, tok_name = tokenize(docs, a.tokenizer)
    chars = sum(len(d) for d in docs)
    print(f"quality_run: {len(docs)} documents, {chars} characters, {len(tokens)} {tok_name} "
          f"tokens (vocabulary {vocab}), {time.time() - t0:.1f} s")
    if len(tokens) <= a.seq + 1:
        fail("not enough text for one window")
    cfg = gpt2_config(vocab, a.width, a.layers, a.heads, a.seq)
    with open(os.path.join(work, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    init = init_weights(cfg, a.seed)
    write_safetensors(os.path.join(work, "init.safetensors"), init)
    n_params = sum(v.size for v in init.values())
    del init
    windows = draw_windows(tokens, a.steps, a.batch, a.seq, a.seed)
    windows.astype("<u4").tofile(os.path.join(work, "batches.u32"))
    lrs = schedule(a.steps, a.lr, a.warmup)
    lrs.astype("<f4").tofile(os.path.join(work, "lrs.f32"))
    print(f"quality_run: GPT-2 {a.layers} layers, width {a.width}, {a.heads} heads, context "
          f"{a.seq}, {n_params / 1e6:.1f} M parameters; {a.steps} steps of {a.batch} x {a.seq} "
          f"tokens ({a.steps * a.batch * a.seq / max(1, len(tokens)):.2f} passes over the text), "
          f"lr {a.lr:g} (warm-up {a.warmup}, cosine to 10%), on {a.device}")

    curves = {"meganeura_f32": meganeura_curve(a.driver, work, a, "f32", a.device),
              "meganeura_bf16": meganeura_curve(a.driver, work, a, "bf16", a.device)}
    failed = [k for k, v in curves.items() if v is None]
    curves["torch_autocast_bf16"] = None
    if not a.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
            if not dry:
                print("quality_run: PyTorch is not installed (--no-torch to run without it)")
                failed.append("torch_autocast_bf16")
            else:
                print("quality_run: PyTorch is not installed: no PyTorch curve in the dry run")
        if torch is not None and a.device == "cuda" and not torch.cuda.is_available():
            print("quality_run: PyTorch has no CUDA device")
            failed.append("torch_autocast_bf16")
        elif torch is not None:
            try:
                curves["torch_autocast_bf16"] = torch_curve(work, cfg, windows, lrs, a.device)
            except Exception:
                traceback.print_exc()
                print("quality_run: the PyTorch run failed")
                failed.append("torch_autocast_bf16")
    steps = np.arange(1, a.steps + 1)
    present = {k: v for k, v in curves.items() if v is not None}
    if not present:
        print("quality_run: no run finished")
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(out_svg)), exist_ok=True)
    write_csv(out_csv, lrs, curves)
    title = (f"bf16 training quality: GPT-2 {a.layers}x{a.width}, {a.heads} heads, context "
             f"{a.seq}, batch {a.batch}, {a.steps} steps")
    subtitle = (f"same init and batches; {tok_name} tokens of Python's help topics"
                f"{'' if dry else ' and stdlib docstrings'} ({len(tokens)}); AdamW lr {a.lr:g}; "
                f"{a.device}; {datetime.date.today().isoformat()}")
    write_svg(out_svg, steps, curves, title, subtitle)
    print(f"quality_run: wrote {out_svg} and {out_csv}")

    k = min(FINAL_WINDOW, a.steps)
    final = {key: float(np.mean(v[-k:])) for key, v in present.items()}
    ref = final.get("meganeura_f32")
    print(f"final loss (mean of the last {k} steps):")
    for key, name, _ in SERIES:
        if key in final:
            rel = f"  ({100 * (final[key] / ref - 1):+.2f}% vs meganeura fp32)" \
                if ref and key != "meganeura_f32" else ""
            print(f"  {name:24} {final[key]:.4f}{rel}")
        else:
            print(f"  {name:24} -")
    vals = list(final.values())
    spread = max(vals) / min(vals) - 1.0 if min(vals) > 0 else math.inf
    ok = spread <= WITHIN and not failed
    print(f"spread (largest / smallest - 1) {100 * spread:.2f}% over {len(vals)} curve(s): "
          f"{'within' if spread <= WITHIN else 'NOT within'} {100 * WITHIN:g}%"
          + (f"; missing: {', '.join(failed)}" if failed else ""))
    if failed:
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
