#!/usr/bin/env python3
"""Greedy generation of mn_generator against transformers' generate, in fp32 (issue 18).

For GPT-2 and a Llama with 9 query heads over 3 kv heads, a randomly initialized transformers
model with weights drawn wider than the default (initializer_range WIDE, so the logits are
not flat and the greedy choice is not a near tie) is saved with save_pretrained; transformers'
generate(do_sample=False, max_new_tokens=N) runs from a fixed prompt on PyTorch's CPU in fp32,
and bench_generate_parity_driver (benchmarks/generate_parity_driver.c) generates N greedy
tokens from the saved files on each backend asked for. One PASS or FAIL line per model and
backend; a FAIL names the first differing position with both tokens. Each line also gives the
smallest gap between transformers' two largest logits along its path, which says how close
the nearest tie was.

usage: python3 scripts/hf_generate_parity.py --driver BUILD/bench_generate_parity_driver
                                             [--backend cpu|cuda|both] [--new 64] [--keep DIR]
Exit status 0 when every line is PASS.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers

WIDE = 0.3
PROMPT = [3, 141, 59, 26, 53, 58, 97, 93]


def models():
    gpt2 = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4,
                                   n_positions=128, activation_function="gelu_new",
                                   initializer_range=WIDE, bos_token_id=0, eos_token_id=0)
    llama = transformers.LlamaConfig(vocab_size=256, hidden_size=72, intermediate_size=160,
                                     num_hidden_layers=2, num_attention_heads=9,
                                     num_key_value_heads=3, max_position_embeddings=128,
                                     rms_norm_eps=1e-5, rope_theta=10000.0,
                                     tie_word_embeddings=False, initializer_range=WIDE)
    return [("gpt2", transformers.GPT2LMHeadModel, gpt2),
            ("llama_gqa_9_3", transformers.LlamaForCausalLM, llama)]


@torch.no_grad()
def reference(model, new):
    ids = torch.tensor([PROMPT])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                         output_scores=True, return_dict_in_generate=True)
    gap = min(float((lambda t: t[0] - t[1])(s[0].topk(2).values)) for s in out.scores)
    return out.sequences[0, len(PROMPT):].tolist(), gap


def ours(driver, folder, backend, new):
    env = dict(os.environ, MN_BACKEND=backend)
    r = subprocess.run([driver, "--model", folder, "--prompt", ",".join(map(str, PROMPT)),
                        "--new", str(new)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    line = next(l for l in r.stdout.splitlines() if l.startswith("tokens"))
    return [int(t) for t in line.split()[1:]], ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "both"])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--keep")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    root = a.keep or tempfile.mkdtemp(prefix="mn-generate-parity-")
    backends = ["cpu", "cuda"] if a.backend == "both" else [a.backend]
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, prompt "
          f"{len(PROMPT)} tokens, {a.new} new, fp32")
    failed = 0
    for name, cls, cfg in models():
        model = cls(cfg).eval()
        if hasattr(model.config, "_attn_implementation"):
            model.config._attn_implementation = "eager"
        folder = os.path.join(root, name)
        model.save_pretrained(folder, safe_serialization=True)
        want, gap = reference(model, a.new)
        for backend in backends:
            got, err = ours(a.driver, folder, backend, a.new)
            tag = f"generate {name} {backend}"
            if got is None:
                print(f"FAIL {tag}: the driver failed: {err}")
                failed += 1
                continue
            diff = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
            if diff is None and len(got) == len(want):
                print(f"PASS {tag}: {len(want)} greedy tokens equal transformers' generate "
                      f"({len(set(want))} distinct; smallest top-2 logit gap {gap:.3g})")
            else:
                diff = len(got) if diff is None else diff
                print(f"FAIL {tag}: first difference at new token {diff}: ours "
                      f"{got[diff] if diff < len(got) else None}, transformers "
                      f"{want[diff]} (smallest top-2 logit gap {gap:.3g})")
                failed += 1
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    print(f"GENERATE-PARITY {'passed' if not failed else f'FAILED ({failed})'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
