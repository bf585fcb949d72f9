#!/usr/bin/env python3
"""Writes io/unicode_tables.c: the code point ranges of the character classes the tokenizer's
pre-tokenizers need, probed from the installed HF `tokenizers` package:

    letters  \\p{L} of the package's regex engine (Oniguruma): the hand-written split regexes
    numbers  \\p{N} of the regex engine: the split regexes and Split {"Regex": "\\p{N}"}
    numeric  Rust's char::is_numeric: the Digits pre-tokenizer

Why probe instead of reading Python's unicodedata: the package classifies characters with the
tables its engines were built with (Oniguruma's for regexes, Rust's standard library's for
Digits), which follow their own Unicode versions, newer or older than this Python's and not
always the same as each other (e.g. tokenizers 0.23.3: Rust knows the digits U+11DE0..U+11DE9
as numeric, Oniguruma's \\p{N} does not). tests/test_tokenizer_conformance.c compares our
tokenizer with this package, so its classification is the one to match, whatever Unicode
versions it carries. Each class is found by running the package itself over every code point;
the package's version is written into the file and returned by mn_unicode_version().

The probe also checks that the regex engine's \\s and Rust's char::is_whitespace are the set that
mn_unicode_is_space (io/tokenizer_unicode.h) hard-codes, SPACES below; it fails if not.

scripts/fixtures/tokenizer_conformance.py imports probe() to draw test characters from.

Usage: scripts/gen_unicode_tables.py [OUTPUT]   (default: io/unicode_tables.c beside this script)
"""
import os
import sys

# mn_unicode_is_space in io/tokenizer_unicode.h: White_Space. Change both together.
SPACES = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                    0x2028, 0x2029, 0x202F, 0x205F, 0x3000])

def regex_class(text, cls):
    """The code points of `text` that the package's regex engine matches with `cls`."""
    from tokenizers import Regex, normalizers
    kept = normalizers.Replace(Regex("[^" + cls + "]"), "").normalize_str(text)
    return set(map(ord, kept))


def numeric_class(text, chunk=16384):
    """The code points of `text` that the Digits pre-tokenizer splits off (char::is_numeric).
    Contiguous Digits alternates non-numeric and numeric runs; an 'a' first in each chunk makes
    the even pieces the non-numeric ones. (In chunks: the package's time grows with the number
    of pieces times the length of the text.)"""
    from tokenizers import pre_tokenizers
    digits = pre_tokenizers.Digits(individual_digits=False)
    out = set()
    for i in range(0, len(text), chunk):
        for k, (piece, _) in enumerate(digits.pre_tokenize_str("a" + text[i:i + chunk])):
            if k % 2:
                out.update(map(ord, piece))
    return out


def whitespace_class(text, chunk=65536):
    """The code points of `text` that WhitespaceSplit drops (Rust's char::is_whitespace)."""
    from tokenizers import pre_tokenizers
    split = pre_tokenizers.WhitespaceSplit()
    out = set()
    for i in range(0, len(text), chunk):
        part = text[i:i + chunk]
        kept = set(c for piece, _ in split.pre_tokenize_str(part) for c in piece)
        out.update(ord(c) for c in part if c not in kept)
    return out


def probe(cps=None, space=False):
    """The package's classes among the code points `cps` (default: all but surrogates), as sets:
    letters, numbers, numeric and, with `space`, space (\\s) and whitespace (is_whitespace)."""
    if cps is None:
        cps = (cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF)
    text = "".join(map(chr, cps))
    out = {"letters": regex_class(text, r"\p{L}"), "numbers": regex_class(text, r"\p{N}"),
           "numeric": numeric_class(text)}
    if space:
        out["space"] = regex_class(text, r"\s")
        out["whitespace"] = whitespace_class(text)
    return out


def ranges(members):
    out = []
    for cp in sorted(members):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def table(name, rs):
    lines = [f"static const mn_unicode_range {name}[{len(rs)}] = {{"]
    per_line = 4
    for i in range(0, len(rs), per_line):
        chunk = ", ".join(f"{{0x{lo:05X}, 0x{hi:05X}}}" for lo, hi in rs[i:i + per_line])
        lines.append(f"    {chunk},")
    lines.append("};")
    return "\n".join(lines)


def check_ascii(name, members, expected):
    got = {cp for cp in members if cp < 0x80}
    if got != set(map(ord, expected)):
        sys.exit(f"{name}: ASCII members {sorted(got)} differ from the C fast path")


def main():
    import tokenizers
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(here), "io", "unicode_tables.c")
    c = probe(space=True)
    for name in ("space", "whitespace"):
        if c[name] != SPACES:
            sys.exit(f"{name}: the package's set differs from mn_unicode_is_space: extra "
                     f"{sorted(map(hex, c[name] - SPACES))}, missing "
                     f"{sorted(map(hex, SPACES - c[name]))}; update io/tokenizer_unicode.h and "
                     f"SPACES here")
    alpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    check_ascii("letters", c["letters"], alpha)
    check_ascii("numbers", c["numbers"], "0123456789")
    check_ascii("numeric", c["numeric"], "0123456789")
    if (c["letters"] & (c["numbers"] | c["numeric"])
            or c["space"] & (c["letters"] | c["numbers"] | c["numeric"])):
        sys.exit("the classes overlap; the tokenizer's classify() assumes they do not")
    version = f"tokenizers {tokenizers.__version__}"
    letters, numbers, numeric = (ranges(c[k]) for k in ("letters", "numbers", "numeric"))
    text = f"""/* Generated by scripts/gen_unicode_tables.py, probed from the HF {version}
 * package (Python {sys.version_info.major}.{sys.version_info.minor}); do not edit.
 * Inclusive code point ranges, sorted, searched by bisection:
 *   letters  {len(c["letters"])} code points: \\p{{L}} of the package's regex engine (Oniguruma)
 *   numbers  {len(c["numbers"])} code points: \\p{{N}} of the regex engine
 *   numeric  {len(c["numeric"])} code points: Rust's char::is_numeric (the Digits pre-tokenizer) */
#include "io/tokenizer_unicode.h"

#include <stddef.h>

typedef struct mn_unicode_range {{
  uint32_t lo, hi;
}} mn_unicode_range;

{table("letters", letters)}

{table("numbers", numbers)}

{table("numeric", numeric)}

static bool in_ranges(const mn_unicode_range *r, size_t n, uint32_t cp) {{
  size_t lo = 0, hi = n;
  while (lo < hi) {{
    size_t mid = lo + (hi - lo) / 2;
    if (cp < r[mid].lo)
      hi = mid;
    else if (cp > r[mid].hi)
      lo = mid + 1;
    else
      return true;
  }}
  return false;
}}

bool mn_unicode_is_letter(uint32_t cp) {{
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(letters, sizeof letters / sizeof letters[0], cp);
}}

bool mn_unicode_is_number(uint32_t cp) {{
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(numbers, sizeof numbers / sizeof numbers[0], cp);
}}

bool mn_unicode_is_numeric(uint32_t cp) {{
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(numeric, sizeof numeric / sizeof numeric[0], cp);
}}

const char *mn_unicode_version(void) {{ return "{version}"; }}
"""
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{out}: {version}: letters {len(c['letters'])} code points in {len(letters)} ranges, "
          f"numbers {len(c['numbers'])} in {len(numbers)}, numeric {len(c['numeric'])} in "
          f"{len(numeric)}; \\s and is_whitespace match mn_unicode_is_space ({len(SPACES)})")


if __name__ == "__main__":
    main()
