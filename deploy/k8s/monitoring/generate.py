#!/usr/bin/env python3
"""Writes the Grafana dashboard and the Prometheus Operator rule object of kvstrata.

  kvstrata-dashboard.json  the Grafana dashboard (provisioned through a ConfigMap by the
                           kustomization beside this file)
  prometheus-rule.yaml     kvstrata.rules.yml wrapped in a monitoring.coreos.com/v1 PrometheusRule

Run it after editing the panels below or kvstrata.rules.yml; `--check` exits 1 when a committed
file differs from what it would write (a test runs that). Standard library only.
"""

import argparse
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
RATE = "$__rate_interval"


def ts(title, targets, unit="short", w=12, h=8, stack=False, max_value=None):
    """A time-series panel; targets are (expr, legend) pairs."""
    panel = {
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"w": w, "h": h},
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {"stacking": {"mode": "normal" if stack else "none"}},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if max_value is not None:
        panel["fieldConfig"]["defaults"]["max"] = max_value
        panel["fieldConfig"]["defaults"]["min"] = 0
    return panel


def quantiles(metric, selector=""):
    return [
        (
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{selector}[{RATE}])))",
            f"p{int(q * 100)}",
        )
        for q in (0.5, 0.9, 0.99)
    ]


ROWS = [
    ("Cache", [
        ts("Cache hit ratio by tier", [
            ('sum by (tier) (rate(kvstrata_router_prompt_tokens_total{tier=~"local|kvstore"}'
             f'[{RATE}])) / ignoring (tier) group_left '
             f"sum(rate(kvstrata_router_prompt_tokens_total[{RATE}]))", "{{tier}}"),
            ('sum(rate(kvstrata_router_prompt_tokens_total{tier=~"local|kvstore"}'
             f"[{RATE}])) / sum(rate(kvstrata_router_prompt_tokens_total[{RATE}]))",
             "all tiers"),
        ], unit="percentunit", max_value=1),
        ts("Predicted vs actual cached tokens /s", [
            (f"sum(rate(kvstrata_router_predicted_cached_tokens_total[{RATE}]))", "predicted"),
            ('sum(rate(kvstrata_router_prompt_tokens_total{tier=~"local|kvstore"}'
             f"[{RATE}]))", "actual"),
        ]),
    ]),
    ("Throughput and latency", [
        ts("Requests /s by finish reason", [
            (f"sum by (finish_reason) (rate(kvstrata_router_requests_total[{RATE}]))",
             "{{finish_reason}}"),
        ], unit="reqps", stack=True),
        ts("Tokens /s", [
            (f"sum(rate(kvstrata_router_generated_tokens_total[{RATE}]))", "generated"),
            (f"sum by (tier) (rate(kvstrata_router_prompt_tokens_total[{RATE}]))",
             "prompt, {{tier}}"),
        ]),
        ts("Time to first token", quantiles("kvstrata_router_time_to_first_token_seconds"),
           unit="s"),
        ts("Inter-token latency", quantiles("kvstrata_router_inter_token_latency_seconds"),
           unit="s"),
    ]),
    ("Workers", [
        ts("Running and waiting", [
            ("sum(kvstrata_decode_running_sequences)", "running (workers)"),
            ("sum(kvstrata_decode_waiting_requests)", "waiting (workers)"),
            ("sum(kvstrata_router_running_requests)", "in flight (routers)"),
        ]),
        ts("Live workers", [("max(kvstrata_router_workers)", "workers")]),
        ts("KV pages in use per worker", [
            ("kvstrata_router_worker_total_pages - kvstrata_router_worker_free_pages",
             "{{worker}}"),
        ]),
        ts("Worker KV cache in use", [
            ("sum by (instance) (kvstrata_decode_kv_cache_used_bytes) / "
             "sum by (instance) (kvstrata_decode_kv_cache_capacity_bytes)", "{{instance}}"),
        ], unit="percentunit", max_value=1),
        ts("Local page tier", [
            ("sum by (instance) (kvstrata_decode_local_cache_bytes)", "{{instance}} used"),
            ("sum by (instance) (kvstrata_decode_local_cache_capacity_bytes)",
             "{{instance}} capacity"),
        ], unit="bytes"),
        ts("Routing decisions /s", [
            (f"sum by (policy, reason) (rate(kvstrata_router_routing_decisions_total[{RATE}]))",
             "{{policy}} {{reason}}"),
            (f"sum(rate(kvstrata_router_retries_total[{RATE}]))", "retries"),
        ], stack=True),
    ]),
    ("kvstore", [
        ts("kvstore occupancy", [
            ("sum by (instance) (kvstrata_kvstore_used_bytes) / "
             "sum by (instance) (kvstrata_kvstore_capacity_bytes)", "{{instance}}"),
        ], unit="percentunit", max_value=1),
        ts("Evictions /s", [
            (f"sum(rate(kvstrata_kvstore_evictions_total[{RATE}]))", "kvstore pages"),
            (f"sum(rate(kvstrata_decode_local_cache_evictions_total[{RATE}]))",
             "local tier pages"),
        ]),
        ts("Fetch bandwidth", [
            (f"sum(rate(kvstrata_kvstore_fetch_bytes_total[{RATE}]))", "sent by the kvstore"),
            (f"sum(rate(kvstrata_decode_kvstore_fetched_bytes_total[{RATE}]))",
             "received by workers"),
        ], unit="Bps"),
        ts("Prefix lookup + fetch (worker side)",
           quantiles("kvstrata_decode_kvstore_fetch_seconds"), unit="s"),
        ts("Fetch latency (kvstore side)",
           quantiles("kvstrata_kvstore_request_duration_seconds", '{method="Fetch"}'), unit="s"),
        ts("Worker kvstore errors /s (served as misses)", [
            (f"sum by (op) (rate(kvstrata_decode_kvstore_errors_total[{RATE}]))", "{{op}}"),
        ]),
    ]),
]


def dashboard():
    panels, y, next_id = [], 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": next_id, "collapsed": False,
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []})
        next_id += 1
        y += 1
        x = 0
        for p in row:
            if x + p["gridPos"]["w"] > 24:
                x, y = 0, y + 8
            p = dict(p, id=next_id)
            p["gridPos"] = dict(p["gridPos"], x=x, y=y)
            next_id += 1
            x += p["gridPos"]["w"]
            panels.append(p)
        y += 8
    return {
        "uid": "kvstrata-overview",
        "title": "kvstrata",
        "description": "kvstrata: shared 2-bit KV cache serving (router, decode workers, kvstore).",
        "tags": ["kvstrata"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "type": "datasource", "query": "prometheus",
            "label": "Data source", "current": {}, "hide": 0,
        }]},
        "panels": panels,
    }


def prometheus_rule(rules_text):
    body = rules_text[rules_text.index("groups:"):]
    indented = "".join("  " + line if line.strip() else line
                       for line in body.splitlines(keepends=True))
    return ("# Generated by generate.py from kvstrata.rules.yml; do not edit.\n"
            "apiVersion: monitoring.coreos.com/v1\n"
            "kind: PrometheusRule\n"
            "metadata:\n"
            "  name: kvstrata\n"
            "  labels:\n"
            "    app.kubernetes.io/part-of: kvstrata\n"
            "spec:\n" + indented)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed files instead of writing them")
    args = parser.parse_args()
    outputs = {
        HERE / "kvstrata-dashboard.json": json.dumps(dashboard(), indent=2) + "\n",
        HERE / "prometheus-rule.yaml": prometheus_rule((HERE / "kvstrata.rules.yml").read_text()),
    }
    stale = []
    for path, text in outputs.items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent.parent.parent)}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run deploy/k8s/monitoring/generate.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
