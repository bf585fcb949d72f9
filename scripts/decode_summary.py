#!/usr/bin/env python3
"""The decode table of scripts/gpu-test.sh --decode: reads the JSON lines that bench_decode
--json and benchmarks/torch_decode.py --json append, and prints one row per meganeura
configuration beside PyTorch's figures of the same model and batch: transformers' generate in
the same precision and the CUDA-graph static-cache decoder (bf16), total tokens/s, and the
ratio of ours to each. Markdown with --markdown (for README and docs/generation.md).

usage: python3 scripts/decode_summary.py DECODE.jsonl [--card NAME] [--markdown]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--card", default="")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.jsonl) if l.strip()]
    torch = {(r["impl"], r["model"], r["batch"], r["precision"]): r for r in rows
             if r["impl"].startswith("torch_")}
    ours = [r for r in rows if r["impl"] == "meganeura"]
    head = ["model", "batch", "prec", "quant", "ours tok/s", "ms/token", "prefill ms",
            "launches", "% bw", "generate tok/s", "graph tok/s", "ours/generate", "ours/graph"]
    table = []
    for r in ours:
        gen = torch.get(("torch_generate", r["model"], r["batch"], r["precision"]))
        graph = torch.get(("torch_graph", r["model"], r["batch"], "bf16"))
        ratio = lambda t: f"{r['tokens_per_s'] / t['tokens_per_s']:.2f}x" if t else "-"
        table.append([r["model"], str(r["batch"]), r["precision"], r["quant"],
                      f"{r['tokens_per_s']:.0f}", f"{r['ms_per_token']:.3f}",
                      f"{r['prefill_ms']:.1f}", str(r["launches_per_token"]),
                      f"{100 * r['bandwidth_fraction']:.1f}",
                      f"{gen['tokens_per_s']:.0f}" if gen else "-",
                      f"{graph['tokens_per_s']:.0f}" if graph else "-", ratio(gen), ratio(graph)])
    versions = next((f"torch {r['torch']}, transformers {r['transformers']}" for r in rows
                     if "torch" in r), "no PyTorch figures")
    bw = next((f"{r['bandwidth_gbs']:.0f} GB/s ({r['bandwidth_source']})" for r in ours
               if r.get("bandwidth_gbs")), "unknown")
    title = (f"decode, prompt {ours[0]['prompt'] if ours else '?'}, "
             f"{ours[0]['new'] if ours else '?'} new tokens, total tokens/s; {a.card}; "
             f"{versions}; bandwidth {bw}; graph = CUDA-graph static-cache decoder, bf16")
    print(title)
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for t in table:
            print("| " + " | ".join(t) + " |")
        return
    widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h)
              for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for t in table:
        print("  ".join(c.rjust(w) for c, w in zip(t, widths)))


if __name__ == "__main__":
    main()
