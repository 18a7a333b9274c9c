"""Independent reference for tests/model/gguf_reference_test.cc.

Reads a GGUF file with the `gguf` package (ggml's own Python reader and dequantiser, not our
code) and prints, for each tensor named on the command line, its type, shape, a SHA-256 of its
dequantised fp32 values (little-endian, ggml order) and a sample of values as hex bit patterns.
The first line is the SHA-256 of the whole file.

usage: gguf_reference.py MODEL.gguf TENSOR_NAME...
output:
  file <sha256>
  tensor <name> <type> <ne0>x<ne1>... <count> <sha256> <index>:<bits> ...
"""

import hashlib
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def sample_indices(count):
    """The first 16 elements, the last 4 and 44 spread evenly in between."""
    picks = set(range(min(16, count)))
    picks.update(range(max(0, count - 4), count))
    picks.update(int(i) for i in np.linspace(0, count - 1, num=44))
    return sorted(picks)


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    path, names = argv[1], argv[2:]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    print(f"file {digest.hexdigest()}")

    tensors = {t.name: t for t in GGUFReader(path).tensors}
    for name in names:
        t = tensors.get(name)
        if t is None:
            print(f"missing {name}")
            continue
        values = dequantize(t.data, t.tensor_type)
        values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
        bits = values.view("<u4")
        sample = " ".join(f"{i}:{int(bits[i]):08x}" for i in sample_indices(values.size))
        shape = "x".join(str(int(d)) for d in t.shape)
        print(f"tensor {name} {t.tensor_type.name} {shape} {values.size} "
              f"{hashlib.sha256(values.tobytes()).hexdigest()} {sample}")


if __name__ == "__main__":
    main(sys.argv)
