"""PyTorch timings of bench_lm_step's training steps with transformers' own models:
GPT-2 124M (batch 16, seq 1024) and the SmolLM2-135M shape (batch 8, seq 1024), AdamW,
fp32 or TF32, eager and torch.compile, with the peak device memory PyTorch allocated.
Prints one BENCH line per configuration for scripts/gpu-test.sh.

usage: python3 benchmarks/torch_lm.py gpt2|smollm2 [--tf32] [--mode eager,compile]
                                      [--batch B] [--seq T] [--steps N]
"""
import argparse

import torch
import transformers
from torch_timing import print_bench, time_steps


def model_for(name):
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=50257, n_embd=768, n_layer=12, n_head=12,
                                      n_positions=1024, activation_function="gelu_new",
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel(cfg), 16
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3,
                                   intermediate_size=1536, max_position_embeddings=8192,
                                   rms_norm_eps=1e-5, rope_theta=100000.0,
                                   tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg), 8


def run(name, mode, tf32, batch, seq, steps):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    model, default_batch = model_for(name)
    batch = batch or default_batch
    model = model.cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")
    fwd = torch.compile(model) if mode == "compile" else model

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    ms, warm_s, peak, loss = time_steps(step, steps)
    print_bench(f"torch_lm_{name}{'_tf32' if tf32 else ''}_{mode}", batch * seq, ms, warm_s, peak,
                loss)
    del model, opt, fwd
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["gpt2", "smollm2"])
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--mode", default="eager,compile")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    for mode in a.mode.split(","):
        run(a.model, mode, a.tf32, a.batch, a.seq, a.steps)


if __name__ == "__main__":
    main()
