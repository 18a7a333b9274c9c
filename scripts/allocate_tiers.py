"""Tier counts for `kvstrata eval --rank-tiers` from a per-layer next-token KL sensitivity
(`kvstrata eval --layer-sensitivity --rank-by next-token-kl --json`), docs/fidelity.md, Round 2.
Standard library only.

    python3 scripts/allocate_tiers.py SENSITIVITY.json

Model: layer l alone in the base codec costs KL s_l; giving its keys d more code bits per
element scales that by 2^(-2d) (the MSE of a rate-distortion-like quantiser). Each layer gets
one of the key recipes below; the choice minimises sum_l s_l 2^(-2 d_l) within the history-bit
budget (K and V averaged, values unchanged), by a sweep of the Lagrange multiplier. Prints the
predicted KL of that allocation, of P2's hand-typed boosts and of the top 8, and on its last
line the --rank-tiers argument: the count of each recipe down the ranking.
"""
import json
import sys

BUDGET = 2.5  # history bits per element, K and V averaged
PAGE_RATIO = 8 / 64 / 64  # one 8-bit ratio per region per page of 64 tokens, per element
ROW_SCALE = 8 / 64  # one 8-bit log2 scale per row


def bits(code_bits, regions):
    return code_bits + ROW_SCALE + regions * PAGE_RATIO


# (code-bit change vs the base, bits per element, recipe), K side; V is 3x16+2x16+1x32 for all.
KEYS = [
    (1.25, bits(4.0, 1), "4x64:eig:s8:pr"),
    (0.75, bits(3.5, 2), "4x32+3x32:eig:s8:pr"),
    (0.25, bits(3.0, 3), "4x16+3x32+2x16:eig:s8:pr"),
    (0.0, bits(2.75, 3), "base"),
    (-0.25, bits(2.5, 2), "3x32+2x32:eig:s8:pr"),
]
VALUE_BITS = bits(1.75, 3)
VALUES = "3x16+2x16+1x32:eig:s8:pr"


def main() -> None:
    with open(sys.argv[1]) as f:
        results = json.load(f)["results"]
    s = [r["kl_mean"] for r in results]
    layers = len(s)
    rank = sorted(range(layers), key=lambda l: (-s[l], l))  # as RankLayers: ties to the lower
    budget = layers * (2 * BUDGET - VALUE_BITS)
    best = None
    for step in range(1, 20001):
        lam = step * 1e-3 * sum(s) / layers
        pick = [min(KEYS, key=lambda k: s[l] * 2 ** (-2 * k[0]) + lam * k[1]) for l in range(layers)]
        used = sum(k[1] for k in pick)
        err = sum(s[l] * 2 ** (-2 * pick[l][0]) for l in range(layers))
        if used <= budget and (best is None or err < best[0]):
            best = (err, used, pick)
    err, used, pick = best
    predicted = lambda boosted: sum(s[l] * (2 ** -1.5 if l in boosted else 1) for l in range(layers))
    print(f"base codec everywhere: {sum(s):.3e}")
    print(f"P2's boosts (7 14 17 18 20 21 23 24): {predicted({7, 14, 17, 18, 20, 21, 23, 24}):.3e}")
    print(f"top 8 of the ranking: {predicted(set(rank[:8])):.3e}")
    print(f"allocation: {err:.3e} at {(used / layers + VALUE_BITS) / 2:.4f} history bits")
    tiers = []
    for l in rank:
        recipe = pick[l][2]
        if tiers and tiers[-1][1] == recipe:
            tiers[-1][0] += 1
        else:
            tiers.append([1, recipe])
    print(";".join(f"{n}={r}" if r == "base" else f"{n}={r}|{VALUES}" for n, r in tiers))


if __name__ == "__main__":
    main()
