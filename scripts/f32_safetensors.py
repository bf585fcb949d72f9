"""F32 safetensors files without the safetensors package: how scripts/hf_parity.py and
scripts/quality_run.py hand weights to meganeura's drivers and read them back."""
import json

import numpy as np


def write_safetensors(path, tensors):
    """Writes a dict of arrays as F32 tensors, in the dict's order."""
    header, offset = {}, 0
    for n, a in tensors.items():
        header[n] = {"dtype": "F32", "shape": list(a.shape),
                     "data_offsets": [offset, offset + a.size * 4]}
        offset += a.size * 4
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a, "<f4").tobytes())


def read_safetensors(path, dtype=np.float32):
    """The F32 tensors of a file, as arrays of dtype (copies)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], "<f4").reshape(e["shape"]).astype(dtype)
    return out
