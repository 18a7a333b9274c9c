#!/usr/bin/env python3
"""Test vectors for the kvstrata radix hash (docs/hashing.md).

An implementation of the spec independent of core/radix_hash.cc: standard library only
(hashlib, struct), written from docs/hashing.md rather than from the C++ code, so the two can
check each other.

  gen_hash_vectors.py                 # writes docs/hash-vectors.json
  gen_hash_vectors.py --out FILE      # writes FILE instead
  gen_hash_vectors.py --check FILE    # recomputes every case in FILE; exit 1 on any mismatch
"""

import argparse
import hashlib
import json
import pathlib
import re
import struct
import sys

SPEC = "kvstrata.radix.v1"
NAMESPACE_TAG = b"\x00"
PAGE_TAG = b"\x01"
DOMAIN = b"kvstrata.radix.v1"
KEY_BYTES = 16
U32_MAX = 0xFFFFFFFF

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "docs" / "hash-vectors.json"


# --- The spec ---------------------------------------------------------------------------------


def u32le(value):
    if not 0 <= value <= U32_MAX:
        raise ValueError(f"{value} does not fit in a u32")
    return struct.pack("<I", value)


def field(text):
    data = text.encode("utf-8")
    return u32le(len(data)) + data


def truncated_sha256(data):
    return hashlib.sha256(data).digest()[:KEY_BYTES]


def namespace_input(ns):
    for name in ("model_fingerprint", "kv_format", "rotation_digest"):
        if not ns[name]:
            raise ValueError(f"namespace field {name} is empty")
    if ns["page_tokens"] <= 0:
        raise ValueError("page_tokens must be > 0")
    return (NAMESPACE_TAG + DOMAIN + field(ns["model_fingerprint"]) + field(ns["kv_format"]) +
            field(ns["rotation_digest"]) + u32le(ns["page_tokens"]) + field(ns["cache_salt"]))


def page_input(parent, page):
    return PAGE_TAG + parent + b"".join(u32le(token) for token in page)


def keys(ns, tokens):
    """Returns (namespace input, namespace key, [key of each full page])."""
    ns_input = namespace_input(ns)
    key = truncated_sha256(ns_input)
    ns_key = key
    p = ns["page_tokens"]
    page_keys = []
    for start in range(0, len(tokens) - len(tokens) % p, p):
        key = truncated_sha256(page_input(key, tokens[start:start + p]))
        page_keys.append(key)
    return ns_input, ns_key, page_keys


# --- The cases --------------------------------------------------------------------------------

MODEL = "qwen2.5-0.5b-instruct@9c1e3a7f"
KV_FORMAT = "int2-g128-sink64-recent256"
ROTATION = "3b4c1f0e6d2a9b8c7f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0f9e"


def ns(page_tokens, cache_salt="", model=MODEL, kv_format=KV_FORMAT, rotation=ROTATION):
    return {
        "model_fingerprint": model,
        "kv_format": kv_format,
        "rotation_digest": rotation,
        "page_tokens": page_tokens,
        "cache_salt": cache_salt,
    }


def tenant_salt(tenant, client_salt=""):
    """The cache_salt the router sets for an authenticated tenant (docs/hashing.md, Tenants)."""
    digest = hashlib.sha256(b"kvstrata.tenant.v1\x00" + tenant.encode("utf-8")).hexdigest()
    return "t:" + digest[:32] + ":" + client_salt


def tenant_ns(page_tokens, tenant, client_salt=""):
    return dict(ns(page_tokens, cache_salt=tenant_salt(tenant, client_salt)), tenant=tenant,
                client_salt=client_salt)


def pseudo_tokens(count, seed):
    """Deterministic token ids below a Qwen2-sized vocabulary (151936)."""
    return [(seed + i * 2654435761) % 151936 for i in range(count)]


def cases():
    prompt = pseudo_tokens(128, seed=7)
    return [
        {
            "name": "small-pages-partial-tail",
            "comment": "P=4, 14 tokens: 3 full pages; the last 2 tokens get no key",
            "namespace": ns(4, rotation="identity"),
            "tokens": [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644,
                       872, 198],
        },
        {
            "name": "default-64-three-pages",
            "comment": "the default page size, 192 tokens: 3 full pages",
            "namespace": ns(64),
            "tokens": pseudo_tokens(192, seed=151643),
        },
        {
            "name": "salt-empty",
            "comment": "same tokens as salt-tenant-a; the empty salt is the shared namespace",
            "namespace": ns(64),
            "tokens": prompt,
        },
        {
            "name": "salt-tenant-a",
            "comment": "same tokens as salt-empty; a salt changes every key",
            "namespace": ns(64, cache_salt="tenant-a"),
            "tokens": prompt,
        },
        {
            "name": "salt-non-ascii-utf8",
            "comment": "the salt is hashed as its UTF-8 bytes (its length field counts bytes)",
            "namespace": ns(4, cache_salt="Zürich-東京-\U0001F511"),
            "tokens": [1, 2, 3, 4, 5, 6, 7, 8],
        },
        {
            "name": "large-token-ids",
            "comment": "ids at the top of the range: u32 little-endian, no sign tricks",
            "namespace": ns(4),
            "tokens": [151935, 2147483647, 0, 65536, 16777216, 2147483646, 255, 256],
        },
        {
            "name": "zero-full-pages",
            "comment": "10 tokens at P=64: no full page, no page key",
            "namespace": ns(64),
            "tokens": pseudo_tokens(10, seed=3),
        },
        {
            "name": "tenant-acme",
            "comment": "same tokens as salt-empty, from tenant acme: cache_salt is "
                       "tenant_salt(tenant, client_salt), set by the router",
            "namespace": tenant_ns(64, "acme"),
            "tokens": prompt,
        },
        {
            "name": "tenant-globex",
            "comment": "same tokens as tenant-acme from another tenant: no key in common",
            "namespace": tenant_ns(64, "globex"),
            "tokens": prompt,
        },
        {
            "name": "tenant-acme-client-salt",
            "comment": "tenant acme with its own client salt tenant-a: a namespace inside acme's, "
                       "apart from the bare salt tenant-a",
            "namespace": tenant_ns(64, "acme", client_salt="tenant-a"),
            "tokens": prompt,
        },
        {
            "name": "empty-sequence",
            "comment": "no tokens: only the namespace key",
            "namespace": ns(16, cache_salt="tenant-b"),
            "tokens": [],
        },
    ]


def with_expected(case):
    ns_input, ns_key, page_keys = keys(case["namespace"], case["tokens"])
    return dict(case,
                namespace_input_hex=ns_input.hex(),
                namespace_key=ns_key.hex(),
                page_keys=[key.hex() for key in page_keys])


def document():
    computed = [with_expected(case) for case in cases()]
    by_name = {case["name"]: case for case in computed}
    # The salt cases exist to show that a salt separates tenants; make sure they do.
    unsalted, salted = by_name["salt-empty"], by_name["salt-tenant-a"]
    assert unsalted["tokens"] == salted["tokens"]
    assert unsalted["namespace_key"] != salted["namespace_key"]
    assert not set(unsalted["page_keys"]) & set(salted["page_keys"])
    tenant_keys = [set(by_name[n]["page_keys"]) for n in
                   ("salt-empty", "salt-tenant-a", "tenant-acme", "tenant-globex",
                    "tenant-acme-client-salt")]
    assert sum(len(k) for k in tenant_keys) == len(set().union(*tenant_keys))
    return {
        "spec": SPEC,
        "description": "Radix hash test vectors; see docs/hashing.md. Generated by "
                       "tools/hashvectors/gen_hash_vectors.py. Keys are lowercase hex; "
                       "namespace_input_hex is the exact SHA-256 input for h_{-1}.",
        "cases": computed,
    }


# --- Output and checking ----------------------------------------------------------------------


def dumps(doc):
    """JSON with integer lists wrapped at 100 columns instead of one number per line."""
    text = json.dumps(doc, indent=2, ensure_ascii=False)

    def wrap(match):
        indent = match.group(1)
        numbers = re.findall(r"-?\d+", match.group(2))
        lines, line = [], ""
        for number in numbers:
            piece = number + ","
            if line and len(indent) + 2 + len(line) + 1 + len(piece) > 100:
                lines.append(line)
                line = piece
            else:
                line = f"{line} {piece}" if line else piece
        lines.append(line)
        body = "\n".join(indent + "  " + entry for entry in lines)
        return "[\n" + body[:-1] + "\n" + indent + "]"

    return re.sub(r"\[\n(\s*)  ((?:-?\d+,?\s*)+?)\n\1\]", wrap, text) + "\n"


def check(path):
    doc = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    failures = 0
    if doc.get("spec") != SPEC:
        print(f"{path}: spec is {doc.get('spec')!r}, expected {SPEC!r}", file=sys.stderr)
        failures += 1
    for case in doc["cases"]:
        name = case["name"]
        n = case["namespace"]
        if "tenant" in n and n["cache_salt"] != tenant_salt(n["tenant"], n["client_salt"]):
            print(f"{path}: case {name}: cache_salt is {n['cache_salt']!r}, tenant_salt gives "
                  f"{tenant_salt(n['tenant'], n['client_salt'])!r}", file=sys.stderr)
            failures += 1
        expected = with_expected({k: case[k] for k in ("name", "namespace", "tokens")})
        for field_name in ("namespace_input_hex", "namespace_key", "page_keys"):
            if case.get(field_name) != expected[field_name]:
                print(f"{path}: case {name}: {field_name} is {case.get(field_name)!r}, "
                      f"recomputed {expected[field_name]!r}", file=sys.stderr)
                failures += 1
    if failures:
        print(f"{path}: {failures} mismatch(es)", file=sys.stderr)
        return 1
    print(f"{path}: {len(doc['cases'])} cases OK")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", metavar="FILE", help="recompute FILE's keys and compare")
    group.add_argument("--out", metavar="FILE", default=str(DEFAULT_OUT),
                       help="where to write the vectors (default: docs/hash-vectors.json)")
    args = parser.parse_args()
    if args.check:
        return check(args.check)
    pathlib.Path(args.out).write_text(dumps(document()), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
