#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/: tiny Llama (GQA) and GPT-2 models as llama.cpp's GGUF files,
written with the gguf package (pip install gguf numpy) from seeded random weights, beside the
same weights as transformers-named F32 safetensors, their config.json and tokenizer.json, and
gguf-py's own dequantization of every tensor (test_gguf.c compares meganeura's reading with it).

Each model comes in F32, F16, BF16, Q8_0, Q4_0 and Q4_1: the linear layers, the token embedding
and the output head in that type, norms, biases and GPT-2's position embedding in F32 (as
llama.cpp's converter keeps 1-D tensors). The layouts are the converter's
(convert_hf_to_gguf.py): Llama's q_proj/k_proj rows permuted (LlamaModel.permute, with the kv
head count for k_proj), GPT-2's Conv1D weights transposed to [out, in], and GPT-2's tied head
written again as output.weight.

Also: types.gguf (one tensor of every supported type, with edge values) and types_ref.safetensors
(gguf-py's f32 of each); bpe_llama3.gguf (a vocabulary only, pre-tokenizer "llama-bpe") and
its tokenizer.json; bad_type.gguf (a Q6_K tensor) and bad_arch.gguf (architecture "qwen2").
Run from the repository root; the output is deterministic."""
import json
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from f32_safetensors import write_safetensors  # noqa: E402

OUT = "tests/fixtures/gguf"
Q = gguf.GGMLQuantizationType
TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0,
         "q4_1": Q.Q4_1}

# ---------------------------------------------------------------- the tokenizer

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,!'"
MERGES = [("h", "e"), ("t", "he"), ("Ġ", "t"), ("Ġt", "he"), ("l", "l"), ("he", "ll"),
          ("hell", "o"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld"),
          ("Ġ", "c"), ("a", "t"), ("Ġc", "at"), ("Ġ", "s"), ("Ġs", "at"), ("i", "n"),
          ("in", "g"), ("Ġ", "a"), ("e", "r")]
SPECIAL = "<|endoftext|>"  # CONTROL: special, not normalized
USER = "<sep>"  # USER_DEFINED: an added token that is not special

GPT2_REGEX = ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
              "|\\s+")
LLAMA3_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def vocabulary():
    tokens = list(CHARS) + ["Ġ"] + [a + b for a, b in MERGES] + [SPECIAL, USER]
    types = [1] * (len(tokens) - 2) + [3, 4]
    assert len(set(tokens)) == len(tokens)
    return tokens, types


def tokenizer_json(pre):
    tokens, _ = vocabulary()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    if pre == "gpt2":
        pre_tok = byte_level
    elif pre == "smollm":
        pre_tok = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]}
    else:
        pre_tok = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated",
             "invert": False}, dict(byte_level, use_regex=False)]}
    added = [{"id": tokens.index(t), "content": t, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": not special, "special": special}
             for t, special in ((SPECIAL, True), (USER, False))]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": pre_tok, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": "", "end_of_word_suffix": "",
                      "fuse_unk": False, "byte_fallback": False,
                      "vocab": {t: i for i, t in enumerate(tokens)},
                      "merges": [f"{a} {b}" for a, b in MERGES]}}


def add_vocab(w, pre):
    tokens, types = vocabulary()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_eos_token_id(tokens.index(SPECIAL))
    w.add_bos_token_id(tokens.index(SPECIAL))

# ---------------------------------------------------------------- the models


def llama_config():
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64,
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 32,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "hidden_act": "silu"}


def gpt2_config():
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 64,
            "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16, "n_inner": 64,
            "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
            "activation_function": "gelu_new"}


def llama_weights(rng, c):
    d, v, ff = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    def r(*shape, s=0.3):
        return (rng.standard_normal(shape) * s).astype(np.float32)
    w = {"model.embed_tokens.weight": r(v, d, s=1.0)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + r(d, s=0.1)
        w[p + "self_attn.q_proj.weight"] = r(q, d)
        w[p + "self_attn.k_proj.weight"] = r(kv, d)
        w[p + "self_attn.v_proj.weight"] = r(kv, d)
        w[p + "self_attn.o_proj.weight"] = r(d, q)
        w[p + "post_attention_layernorm.weight"] = 1 + r(d, s=0.1)
        w[p + "mlp.gate_proj.weight"] = r(ff, d)
        w[p + "mlp.up_proj.weight"] = r(ff, d)
        w[p + "mlp.down_proj.weight"] = r(d, ff)
    w["model.norm.weight"] = 1 + r(d, s=0.1)
    w["lm_head.weight"] = r(v, d)
    return w


def gpt2_weights(rng, c):
    d, v, ff, n = c["n_embd"], c["vocab_size"], c["n_inner"], c["n_positions"]
    def r(*shape, s=0.3):
        return (rng.standard_normal(shape) * s).astype(np.float32)
    w = {"transformer.wte.weight": r(v, d, s=1.0), "transformer.wpe.weight": r(n, d, s=0.5)}
    for i in range(c["n_layer"]):
        p = f"transformer.h.{i}."
        w[p + "ln_1.weight"], w[p + "ln_1.bias"] = 1 + r(d, s=0.1), r(d, s=0.1)
        w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = r(d, 3 * d), r(3 * d, s=0.1)
        w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = r(d, d), r(d, s=0.1)
        w[p + "ln_2.weight"], w[p + "ln_2.bias"] = 1 + r(d, s=0.1), r(d, s=0.1)
        w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = r(d, ff), r(ff, s=0.1)
        w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = r(ff, d), r(d, s=0.1)
    w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = 1 + r(d, s=0.1), r(d, s=0.1)
    return w


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


LLAMA_NAMES = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
               "input_layernorm.weight": "attn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.o_proj.weight": "attn_output.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}
GPT2_NAMES = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
              "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias",
              "ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
              "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


def llama_gguf_tensors(w, c):
    out = {}
    for name, a in w.items():
        if name == "lm_head.weight":
            out["output.weight"] = a
            continue
        rest = name[len("model."):]
        if rest.startswith("layers."):
            _, i, tail = rest.split(".", 2)
            if tail == "self_attn.q_proj.weight":
                a = permute(a, c["num_attention_heads"])
            elif tail == "self_attn.k_proj.weight":
                a = permute(a, c["num_key_value_heads"])
            out[f"blk.{i}.{LLAMA_NAMES[tail]}"] = a
        else:
            out[LLAMA_NAMES[rest]] = a
    return out


def gpt2_gguf_tensors(w):
    out = {}
    for name, a in w.items():
        rest = name[len("transformer."):]
        if rest.startswith("h."):
            _, i, tail = rest.split(".", 2)
            module, kind = tail.rsplit(".", 1)
            if kind == "weight" and module.startswith(("attn.", "mlp.")):
                a = np.ascontiguousarray(a.T)
            out[f"blk.{i}.{GPT2_NAMES[module]}.{kind}"] = a
        else:
            out[GPT2_NAMES[rest]] = a
    out["output.weight"] = out["token_embd.weight"]
    return out


def encode(a, qtype):
    """The tensor's stored form: float arrays for F32/F16, blocks for the others."""
    if qtype == Q.F32:
        return a.astype(np.float32)
    if qtype == Q.F16:
        return a.astype(np.float16)
    return gguf.quants.quantize(a, qtype)


def fnv1a(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_model(path, arch, meta, tensors, qtype):
    """Writes the GGUF and returns gguf-py's dequantization of each tensor as it reads back."""
    w = gguf.GGUFWriter(path, arch)
    meta(w)
    for name, a in tensors.items():
        t = qtype if a.ndim == 2 and name != "position_embd.weight" else Q.F32
        stored = encode(a, t)
        w.add_tensor(name, stored, raw_dtype=None if t in (Q.F32, Q.F16) else t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(path)
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            for t in r.tensors}


def llama_meta(c):
    def meta(w):
        w.add_name("tiny-llama")
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(c["hidden_size"])
        w.add_block_count(c["num_hidden_layers"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_rope_dimension_count(c["head_dim"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_rope_freq_base(c["rope_theta"])
        w.add_vocab_size(c["vocab_size"])
        add_vocab(w, "smollm")
    return meta


def gpt2_meta(c):
    def meta(w):
        w.add_name("tiny-gpt2")
        w.add_context_length(c["n_positions"])
        w.add_embedding_length(c["n_embd"])
        w.add_block_count(c["n_layer"])
        w.add_feed_forward_length(c["n_inner"])
        w.add_head_count(c["n_head"])
        w.add_layer_norm_eps(c["layer_norm_epsilon"])
        add_vocab(w, "gpt2")
    return meta


def write_refs(path, deq):
    with open(path, "w") as f:
        for name in sorted(deq):
            f.write(f"{name} {fnv1a(np.ascontiguousarray(deq[name], '<f4').tobytes()):016x}\n")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


def models(rng):
    for arch, config, weights, to_gguf, meta, pre in (
            ("llama", llama_config(), llama_weights, llama_gguf_tensors, llama_meta, "smollm"),
            ("gpt2", gpt2_config(), gpt2_weights, lambda w, c: gpt2_gguf_tensors(w), gpt2_meta,
             "gpt2")):
        w = weights(rng, config)
        write_safetensors(f"{OUT}/{arch}.safetensors", w)
        write_json(f"{OUT}/{arch}_config.json", config)
        write_json(f"{OUT}/{arch}_tokenizer.json", tokenizer_json(pre))
        tensors = to_gguf(w, config)
        for tname, qtype in TYPES.items():
            deq = write_model(f"{OUT}/{arch}_{tname}.gguf", arch, meta(config), tensors, qtype)
            write_refs(f"{OUT}/{arch}_{tname}.ref", deq)


def types_file(rng):
    """One [2, 64] tensor per supported type: normal values, and F16/BF16/F32 edge values
    (zero, negative zero, subnormals, the largest finite)."""
    base = rng.standard_normal((2, 64)).astype(np.float32)
    edges = np.array([0.0, -0.0, 6e-8, -3e-5, 65504.0, 1e-40, -3.0e38, 1.5], np.float32)
    w = gguf.GGUFWriter(f"{OUT}/types.gguf", "llama")
    for tname, qtype in TYPES.items():
        a = base.copy()
        if qtype in (Q.F32, Q.F16, Q.BF16):
            a[0, :8] = edges if qtype != Q.F16 else edges.clip(-65504, 65504)
        a[1] *= 4.0  # another scale per block row
        stored = encode(a, qtype)
        w.add_tensor(tname, stored, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(f"{OUT}/types.gguf")
    write_safetensors(f"{OUT}/types_ref.safetensors",
                      {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
                       for t in r.tensors})


def small_files(rng):
    w = gguf.GGUFWriter(f"{OUT}/bpe_llama3.gguf", "llama")
    add_vocab(w, "llama-bpe")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    write_json(f"{OUT}/bpe_llama3_tokenizer.json", tokenizer_json("llama-bpe"))

    w = gguf.GGUFWriter(f"{OUT}/bad_type.gguf", "llama")
    llama_meta(llama_config())(w)
    # gguf-py cannot quantize to Q6_K; any 210 bytes are one block of it
    blocks = rng.integers(0, 256, (1, 210), dtype=np.uint8)
    w.add_tensor("token_embd.weight", blocks, raw_dtype=Q.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    w = gguf.GGUFWriter(f"{OUT}/bad_arch.gguf", "qwen2")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(18)
    models(rng)
    types_file(rng)
    small_files(rng)


if __name__ == "__main__":
    main()
