#!/usr/bin/env python3
"""LoRA parity of meganeura with peft, for the GPU machine (fp32, TF32 off).

For a Llama (SmolLM2 layout: 9 query heads over 3 kv heads, tied head) and a GPT-2 (Conv1D
layers, fan_in_fan_out) a randomly initialized transformers model is saved with
save_pretrained; bench_peft_parity_driver (benchmarks/peft_parity_driver.c) adds LoRA adapters
to it through mn_model_build_with, gives every lora_B random values, saves the adapter with
mn_lora_save, runs one AdamW step over the adapters and dumps logits, gradients and updated
adapters; then:
    peft                PeftModel.from_pretrained(transformers model, our adapter)
    logits              ||ours - peft|| / ||peft||                  < 1e-5
    loss                cross_entropy with ignore_index=-100        < 1e-5 relative
    every adapter grad  lora_A and lora_B, relative error           < 1e-4
    every adapter       after one torch AdamW step, relative error  < 1e-5 over the elements
                        whose first step the fp32 gradient determines (|g| above 1e-3 of the
                        tensor's largest; the count left out is printed)
    merged export       transformers' from_pretrained on our merged model.safetensors (no peft)
                        gives the logits our plain session computed from it (< 1e-5) and the
                        logits of peft with our stepped adapter (< 1e-5)
A quarter of the labels are -100 (the ignore label), so the masked loss is checked too.

usage: python3 scripts/peft_parity.py --driver BUILD/bench_peft_parity_driver [--keep DIR]
Exit status 0 when every check passes.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
IGNORE = 0xFFFFFF9C


def rel(a, b):
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class Checks:
    def __init__(self):
        self.failed = 0

    def __call__(self, what, err, tol):
        ok = err < tol
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {what}: {err:.3g} (< {tol:g})", flush=True)


def make_model(kind, path, seed):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=512, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=3, num_attention_heads=9, num_key_value_heads=3,
                          max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=100000.0,
                          tie_word_embeddings=True, initializer_range=0.05)
        model = LlamaForCausalLM(cfg)
    else:
        # GPT-2's dropouts off: meganeura has none, and peft's step runs in train mode.
        cfg = GPT2Config(vocab_size=512, n_embd=256, n_layer=3, n_head=4, n_positions=128,
                         initializer_range=0.05, resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg)
    model.save_pretrained(path, safe_serialization=True)
    return cfg


def run_case(kind, targets, driver, root, checks):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    base = os.path.join(root, kind)
    out = os.path.join(root, kind + "-out")
    cfg = make_model(kind, base, 7)
    batch, seq, rank, alpha = 2, 64, 8, 16
    rng = np.random.default_rng(3)
    ids = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.uint32)
    labels = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.uint32)
    labels[rng.random((batch, seq)) < 0.25] = IGNORE
    ids.tofile(os.path.join(base, "input_ids.u32"))
    labels.tofile(os.path.join(base, "labels.u32"))
    def drive(backend, where):
        subprocess.run([driver, "--model", base, "--out", where, "--batch", str(batch), "--seq",
                        str(seq), "--rank", str(rank), "--alpha", str(alpha), "--targets",
                        ",".join(targets), "--lr", str(LR), "--beta1", str(BETAS[0]), "--beta2",
                        str(BETAS[1]), "--eps", str(EPS), "--weight-decay", str(WD)],
                       check=True, env=dict(os.environ, MN_BACKEND=backend))

    backend = os.environ.get("MN_BACKEND", "cuda")
    drive(backend, out)
    # The step's output against an inference session of the same weights, and (on CUDA) the
    # CPU backend, the oracle: what separates a wrong kernel from a wrong reading of peft.
    step_logits = np.fromfile(os.path.join(out, "logits.f32"), dtype=np.float32)
    checks(f"{kind} step logits vs an inference session's",
           rel(step_logits, np.fromfile(os.path.join(out, "inference_logits.f32"),
                                        dtype=np.float32)), 1e-5)
    if backend == "cuda":
        drive("cpu", out + "-cpu")
        checks(f"{kind} logits CUDA vs CPU",
               rel(step_logits, np.fromfile(os.path.join(out + "-cpu", "logits.f32"),
                                            dtype=np.float32)), 1e-5)
    result = open(os.path.join(out, "result.txt")).read().split("\n")
    our_loss = float(next(l.split()[1] for l in result if l.startswith("loss ")))
    names = [l.split()[1] for l in result if l.startswith("lora ")]
    adapter_config = json.load(open(os.path.join(out, "adapter", "adapter_config.json")))
    print(f"# {kind}: backend {backend}, {len(names)} adapter tensors, adapter_config "
          f"r={adapter_config['r']} alpha={adapter_config['lora_alpha']} "
          f"targets={adapter_config['target_modules']} "
          f"fan_in_fan_out={adapter_config['fan_in_fan_out']}", flush=True)

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).to(dev)
    peft_model = PeftModel.from_pretrained(model, os.path.join(out, "adapter"), is_trainable=True)
    peft_model.train()
    tid = torch.from_numpy(ids.astype(np.int64)).to(dev)
    tlab = torch.from_numpy(labels.astype(np.int64)).to(dev)
    tlab[tlab == IGNORE] = -100
    logits = peft_model(input_ids=tid).logits
    V = logits.shape[-1]
    ours = np.fromfile(os.path.join(out, "logits.f32"), dtype=np.float32).reshape(batch, seq, V)
    checks(f"{kind} logits (peft, our adapter)", rel(ours, logits.detach().cpu().numpy()), 1e-5)
    loss = F.cross_entropy(logits.view(-1, V), tlab.view(-1), ignore_index=-100)
    checks(f"{kind} loss (ignore_index -100)", abs(our_loss - loss.item()) / abs(loss.item()), 1e-5)
    loss.backward()
    params = {n: p for n, p in peft_model.named_parameters() if p.requires_grad}
    assert len(params) == len(names), (len(params), len(names))

    def peft_name(ours_name):
        # model.layers.0.self_attn.q_proj.lora_A.weight -> base_model.model.<same with .default>
        head, kind_ab, w = ours_name.rsplit(".", 2)
        return f"base_model.model.{head}.{kind_ab}.default.{w}"

    grads = {}
    for name in names:
        p = params[peft_name(name)]
        g = np.fromfile(os.path.join(out, "grad", name + ".f32"), dtype=np.float32)
        grads[name] = p.grad.detach().cpu().numpy().ravel()
        checks(f"{kind} grad {name}", rel(g, grads[name]), 1e-4)
        if backend == "cuda":
            cpu = np.fromfile(os.path.join(out + "-cpu", "grad", name + ".f32"), dtype=np.float32)
            checks(f"{kind} grad {name} CUDA vs CPU", rel(g, cpu), 1e-4)
    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    opt.step()
    for name in names:
        after = params[peft_name(name)].detach().cpu().numpy().ravel()
        mine = np.fromfile(os.path.join(out, "param", name + ".f32"), dtype=np.float32)
        g = np.abs(grads[name])
        keep = g > 1e-3 * g.max() if g.max() > 0 else np.ones_like(g, dtype=bool)
        err = rel(mine[keep], after[keep])
        checks(f"{kind} AdamW {name} ({int((~keep).sum())} of {keep.size} left out)", err, 1e-5)

    # The merged export: transformers alone, from our file.
    merged_dir = os.path.join(out, "merged")
    shutil.copy(os.path.join(base, "config.json"), merged_dir)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, torch_dtype=torch.float32).to(dev)
    merged.eval()
    with torch.no_grad():
        ml = merged(input_ids=tid).logits.cpu().numpy()
    ours_merged = np.fromfile(os.path.join(out, "merged_logits.f32"),
                              dtype=np.float32).reshape(batch, seq, V)
    checks(f"{kind} merged: transformers vs our plain session", rel(ours_merged, ml), 1e-5)
    stepped = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).to(dev),
        os.path.join(out, "adapter_after"))
    stepped.eval()
    with torch.no_grad():
        sl = stepped(input_ids=tid).logits.cpu().numpy()
    checks(f"{kind} merged: transformers vs peft with the stepped adapter", rel(ml, sl), 1e-5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--keep", default=None)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import peft
    import transformers
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peft {peft.__version__}", flush=True)
    root = a.keep or tempfile.mkdtemp(prefix="peft_parity_")
    os.makedirs(root, exist_ok=True)
    checks = Checks()
    try:
        run_case("llama", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"], a.driver, root, checks)
        run_case("gpt2", ["c_attn", "c_proj", "c_fc"], a.driver, root, checks)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"PEFT-PARITY {'PASS' if not checks.failed else 'FAIL'} "
          f"({checks.failed} checks failed)", flush=True)
    sys.exit(1 if checks.failed else 0)


if __name__ == "__main__":
    main()
