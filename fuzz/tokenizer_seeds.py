#!/usr/bin/env python3
"""Writes fuzz/corpus/tokenizer/: tokenizer.json files built as tests/test_tokenizer.c builds its
fixtures (fixture_json: every byte's GPT-2 character is the token of its value, then the
fixture's vocabulary, merges, added tokens and pre-tokenizer), named valid_* when the loader
accepts them and bad_* (the test's edits of the hello fixture) when it refuses them.
tests/test_fuzz_seeds.c checks both, so a change of the format that the seeds miss fails a test.

Usage: fuzz/tokenizer_seeds.py [OUT_DIR]   (default fuzz/corpus/tokenizer next to this file)
"""
import json
import os
import sys

BYTE_LEVEL = '{"type":"ByteLevel","add_prefix_space":false,"use_regex":true}'


def byte_chars():
    """GPT-2's bytes_to_unicode: the character standing for each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(
        range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def fixture_json(vocab="", merges="", added="", pre=BYTE_LEVEL, letters_only=False, top="",
                 model=""):
    chars = byte_chars()
    entries = [json.dumps(chars[b], ensure_ascii=False) + ":" + str(b) for b in range(256)
               if not letters_only or ord("a") <= b <= ord("z")]
    vocab_text = ",".join(entries) + ("," + vocab if vocab else "")
    return ("{" + (top + "," if top else "") +
            '"version":"1.0","truncation":null,"padding":null,'
            '"added_tokens":[' + added + '],"normalizer":null,"pre_tokenizer":' + pre + "," +
            '"post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":true,'
            '"trim_offsets":true,"use_regex":true},'
            '"model":{' + (model + "," if model else "") +
            '"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,'
            '"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{' +
            vocab_text + '},"merges":[' + merges + "]}}")


HELLO = dict(vocab='"ll":256,"he":257,"hell":258,"\u0120w":259,"or":260,"\u0120wor":261',
             merges='"l l","h e","he ll","\u0120 w","o r","\u0120w or"')
LLAMA3_SPLIT = ('{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":'
                r""""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"""
                r'\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},'
                '"behavior":"Isolated","invert":false},{"type":"ByteLevel",'
                '"add_prefix_space":false,"use_regex":false}]}')
DIGITS = ('{"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},' +
          BYTE_LEVEL + "]}")

VALID = {
    "valid_hello.json": HELLO,
    "valid_merges_arrays.json": dict(
        vocab=HELLO["vocab"],
        merges='["l","l"],["h","e"],["he","ll"],["\u0120","w"],["o","r"],["\u0120w","or"]'),
    "valid_letters_only.json": dict(letters_only=True, vocab='"ab":26', merges='"a b"'),
    "valid_llama3_split.json": dict(pre=LLAMA3_SPLIT),
    "valid_digits.json": dict(pre=DIGITS),
    "valid_added_tokens.json": dict(
        vocab='"\u0120x":256',
        added='{"id":300,"content":"<\u4f60>","special":true,"normalized":false},'
              '{"id":301,"content":"<|endoftext|>","special":true,"normalized":false,'
              '"single_word":false,"lstrip":false,"rstrip":false}'),
}

# (from, to) edits of the hello fixture that the loader refuses, as in the test's
# load_errors tests.
BAD = {
    "bad_negative_id.json": ('"ll":256', '"ll":-1'),
    "bad_merge_three_parts.json": ('"l l"', '"l z z"'),
    "bad_merge_unknown.json": ('"h e"', '"h q"'),
    "bad_fuse_unk.json": ('"fuse_unk":false', '"fuse_unk":1'),
    "bad_added_no_content.json": ('"added_tokens":[]', '"added_tokens":[{"id":1}]'),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus", "tokenizer")
    os.makedirs(out, exist_ok=True)
    for name, fx in VALID.items():
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write(fixture_json(**fx))
    hello = fixture_json(**HELLO)
    for name, (old, new) in BAD.items():
        assert old in hello, old
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write(hello.replace(old, new, 1))
    with open(os.path.join(out, "bad_not_json.json"), "w") as f:
        f.write('{"model": ')


if __name__ == "__main__":
    main()
