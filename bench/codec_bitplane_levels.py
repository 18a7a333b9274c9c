#!/usr/bin/env python3
"""What decoding codec values from their bit planes would cost in quantisation error.

The INT2 kernel turns a 32-bit word of codes into fp16 pairs with one logic op per two codes
(the codes' bit patterns placed under an fp16 exponent) and one fused multiply-add, because its
levels are affine in the code. A codec region's levels are Gaussian Lloyd-Max centroids, which
are not. Decoding in registers the same way would need levels affine in the code's bit planes,
L(c) = a + sum_i w_i * bit_i(c), one logic op and one multiply-add per bit plane. This fits the
best such levels to a unit Gaussian (alternating nearest-level assignment and least squares on
the bit planes) and prints their mean squared error beside Lloyd-Max's and the best uniform
quantiser's, for 2, 3 and 4 bits:

  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy==2.4.6
  /tmp/venv/bin/python bench/codec_bitplane_levels.py

Measured (docs/benchmarks/codec.md, "A leaner codec decode"): 2 bits 1.000x Lloyd-Max's error (the
2-bit centroids are affine in their two bit planes: -1.5104 + 1.0576 b0 + 1.9632 b1), 3 bits
1.07x, 4 bits 1.20x; uniform levels 1.01x, 1.08x, 1.22x.
"""
import numpy as np

# kernels/history_codec.cc's Gaussian Lloyd-Max centroids.
LLOYD_MAX = {
    2: [-1.5104, -0.4528, 0.4528, 1.5104],
    3: [-2.1520, -1.3439, -0.7560, -0.2451, 0.2451, 0.7560, 1.3439, 2.1520],
    4: [-2.7326, -2.0690, -1.6181, -1.2562, -0.9423, -0.6568, -0.3881, -0.1284, 0.1284, 0.3881,
        0.6568, 0.9423, 1.2562, 1.6181, 2.0690, 2.7326],
}


def nearest(levels, x):
    """Each value's nearest level's index into `levels`."""
    order = np.argsort(levels)
    sorted_levels = levels[order]
    return order[np.searchsorted((sorted_levels[1:] + sorted_levels[:-1]) / 2, x)]


def mse(levels, x):
    levels = np.asarray(levels, np.float64)
    return float(np.mean((x - levels[nearest(levels, x)]) ** 2))


def bitplane_levels(a, w):
    codes = np.arange(1 << len(w))
    return a + sum(w[i] * ((codes >> i) & 1) for i in range(len(w)))


def fit_bitplanes(bits, x, rounds=100):
    w = np.array([2.0**i for i in range(bits)]) * (5.4 / (1 << bits))
    a = -w.sum() / 2
    for _ in range(rounds):
        c = nearest(bitplane_levels(a, w), x)
        planes = np.stack([np.ones_like(x)] + [((c >> i) & 1).astype(np.float64)
                                               for i in range(bits)], 1)
        solution, *_ = np.linalg.lstsq(planes, x, rcond=None)
        a, w = solution[0], solution[1:]
    return a, w


def main():
    x = np.random.default_rng(0).standard_normal(400_000)
    print("bits  Lloyd-Max  bit planes (ratio)   uniform (ratio)   a, w")
    for bits in (2, 3, 4):
        lloyd = mse(LLOYD_MAX[bits], x)
        a, w = fit_bitplanes(bits, x)
        planes = mse(bitplane_levels(a, w), x)
        uniform = min(mse(np.linspace(-s, s, 1 << bits), x) for s in np.linspace(0.5, 4, 200))
        print(f"{bits}     {lloyd:.5f}    {planes:.5f} ({planes / lloyd:.3f}x)   "
              f"{uniform:.5f} ({uniform / lloyd:.3f}x)   {a:.4f}, {np.round(w, 4).tolist()}")


if __name__ == "__main__":
    main()
