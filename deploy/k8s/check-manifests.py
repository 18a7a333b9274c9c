#!/usr/bin/env python3
"""Checks rendered kvstrata manifests offline: schemas and the project's deployment rules.

  kubectl kustomize deploy/k8s/overlays/gpu | deploy/k8s/check-manifests.py --gpu -
  kubectl kustomize deploy/k8s/overlays/gpu-shared | deploy/k8s/check-manifests.py --gpu --same-gpu -

1. Every object validates against the Kubernetes JSON schemas of --kubernetes-version, strictly
   (an unknown field is an error), with the kubernetes-validate package (deploy/k8s/
   requirements.txt). Prometheus Operator objects (monitoring.coreos.com/v1) have no schema
   there; their required structure is checked here. Any other kind without a schema fails.
2. Rules the schemas cannot express: every container has gRPC probes, requests and limits, and
   the non-root security context; the grace period covers --shutdown_grace_ms; every workload
   has a PodDisruptionBudget selecting it; references (ConfigMaps and their keys, Service
   selectors and ports, HPA targets, monitors) resolve; KVSTORE_ADDRESSES names every kvstore
   pod; nvidia.com/gpu only where --gpu says, and a worker given a GPU runs on it.
3. With --same-gpu (overlays/gpu-shared), what the same-GPU transport needs of a pod that runs a
   kvstore and a decode worker: one GPU, asked for by one container and shown to the other
   (NVIDIA_VISIBLE_DEVICES); both on CUDA; the store's --pool_socket folder an emptyDir that
   the worker mounts at the same path (the store answers the path, the worker dials it); the
   transport not turned off (--same_gpu_transport, or page MACs without
   --same_gpu_with_page_macs).

Prints one line per problem and exits 1 if there is any. Needs PyYAML and kubernetes-validate.
"""

import argparse
import posixpath
import re
import sys

import kubernetes_validate
import yaml

WORKLOAD_KINDS = ("Deployment", "StatefulSet")
LABEL_KEYS = ("app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/component")
RUN_AS_USER = 10001
# Components that must ask for a GPU in the GPU overlay.
GPU_COMPONENTS = ("decode", "kvstore")


class Checker:
    def __init__(self):
        self.problems = []

    def fail(self, obj, message):
        self.problems.append(f"{name_of(obj)}: {message}")


def name_of(obj):
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')}/{meta.get('name', '?')}"


def matches(selector, labels):
    """True when a matchLabels-style selector (dict) selects labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# ---- 1. Schemas -------------------------------------------------------------------------------

def check_monitoring_crd(c, obj):
    """monitoring.coreos.com/v1: the fields the Prometheus Operator cannot do without."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if not (obj.get("metadata") or {}).get("name"):
        c.fail(obj, "metadata.name missing")
    if kind in ("ServiceMonitor", "PodMonitor"):
        if not (spec.get("selector") or {}).get("matchLabels"):
            c.fail(obj, "spec.selector.matchLabels missing")
        key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
        endpoints = spec.get(key)
        if not isinstance(endpoints, list) or not endpoints:
            c.fail(obj, f"spec.{key} must be a non-empty list")
            return
        for e in endpoints:
            if not isinstance(e.get("port"), str):
                c.fail(obj, f"spec.{key}[].port must name a port")
            for r in e.get("relabelings") or []:
                if "targetLabel" not in r and r.get("action", "replace") == "replace":
                    c.fail(obj, f"spec.{key}[].relabelings: replace without targetLabel")
    elif kind == "PrometheusRule":
        groups = spec.get("groups")
        if not isinstance(groups, list) or not groups:
            c.fail(obj, "spec.groups must be a non-empty list")
            return
        for g in groups:
            if not g.get("name") or not isinstance(g.get("rules"), list) or not g["rules"]:
                c.fail(obj, "every group needs a name and rules")
                continue
            for r in g["rules"]:
                if ("record" in r) == ("alert" in r) or not isinstance(r.get("expr"), str):
                    c.fail(obj, f"group {g['name']}: each rule needs expr and one of record/alert")
    else:
        c.fail(obj, "no schema and no structural check for this kind")


def check_cert_manager_crd(c, obj):
    """cert-manager.io/v1 (deploy/k8s/examples/cert-manager.yaml): what cert-manager needs."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind == "Certificate":
        for key in ("secretName", "issuerRef"):
            if not spec.get(key):
                c.fail(obj, f"spec.{key} missing")
        if not (spec.get("dnsNames") or spec.get("commonName") or spec.get("isCA")):
            c.fail(obj, "spec.dnsNames missing")
    elif kind in ("Issuer", "ClusterIssuer"):
        if not any(spec.get(k) for k in ("ca", "selfSigned", "vault", "acme")) and \
                "selfSigned" not in spec:
            c.fail(obj, "spec has no issuer type (ca, selfSigned, ...)")
    else:
        c.fail(obj, f"unexpected cert-manager kind {kind}")


def check_schema(c, obj, version):
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        c.fail(obj, f"schema {version}: {path}: {e.message}")
    except kubernetes_validate.SchemaNotFoundError:
        if obj.get("apiVersion") == "monitoring.coreos.com/v1":
            check_monitoring_crd(c, obj)
        elif obj.get("apiVersion") == "cert-manager.io/v1":
            check_cert_manager_crd(c, obj)
        else:
            c.fail(obj, f"no Kubernetes {version} schema for {obj.get('apiVersion')} {obj['kind']}")


# ---- 2. Rules ----------------------------------------------------------------------------------

def arg_value(args, flag):
    for a in args or []:
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    return None


def check_container(c, obj, pod, ctr):
    who = f"container {ctr['name']}"
    ports = {p.get("containerPort") for p in ctr.get("ports") or []}
    for probe in ("livenessProbe", "readinessProbe"):
        p = ctr.get(probe)
        if not p or "grpc" not in p:
            c.fail(obj, f"{who}: {probe} must be a grpc probe (grpc.health.v1)")
        elif p["grpc"].get("port") not in ports:
            c.fail(obj, f"{who}: {probe} port {p['grpc'].get('port')} is not a container port")
    res = ctr.get("resources") or {}
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in (res.get(kind) or {}):
                c.fail(obj, f"{who}: resources.{kind}.{r} missing")

    psc, sc = pod.get("securityContext") or {}, ctr.get("securityContext") or {}
    def effective(key):
        return sc.get(key, psc.get(key))
    if effective("runAsNonRoot") is not True:
        c.fail(obj, f"{who}: runAsNonRoot must be true")
    if effective("runAsUser") != RUN_AS_USER:
        c.fail(obj, f"{who}: runAsUser must be {RUN_AS_USER}")
    if (effective("seccompProfile") or {}).get("type") != "RuntimeDefault":
        c.fail(obj, f"{who}: seccompProfile must be RuntimeDefault")
    if sc.get("allowPrivilegeEscalation") is not False:
        c.fail(obj, f"{who}: allowPrivilegeEscalation must be false")
    if sc.get("readOnlyRootFilesystem") is not True:
        c.fail(obj, f"{who}: readOnlyRootFilesystem must be true")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        c.fail(obj, f"{who}: capabilities.drop must include ALL")

    grace_ms = arg_value(ctr.get("args"), "shutdown_grace_ms")
    period = pod.get("terminationGracePeriodSeconds", 30)
    if grace_ms is None:
        c.fail(obj, f"{who}: --shutdown_grace_ms must be set (it sizes the grace period)")
    elif period * 1000 < int(grace_ms) + 2000:
        c.fail(obj, f"{who}: terminationGracePeriodSeconds {period} leaves under 2 s beyond "
                    f"--shutdown_grace_ms={grace_ms}")


def check_references(c, obj, pod, configmaps):
    for ctr in pod.get("containers") or []:
        for env in ctr.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("configMapKeyRef")
            if ref and not ref.get("optional"):
                if ref["name"] not in configmaps:
                    c.fail(obj, f"env {env['name']}: no ConfigMap {ref['name']}")
                elif ref["key"] not in configmaps[ref["name"]]:
                    c.fail(obj, f"env {env['name']}: ConfigMap {ref['name']} has no {ref['key']}")
        defined = {e["name"] for e in ctr.get("env") or []}
        for a in (ctr.get("command") or []) + (ctr.get("args") or []):
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                if var not in defined:
                    c.fail(obj, f"container {ctr['name']}: $({var}) in {a!r} is not in env")
    for v in pod.get("volumes") or []:
        cm = v.get("configMap")
        if cm and not cm.get("optional") and cm["name"] not in configmaps:
            c.fail(obj, f"volume {v['name']}: no ConfigMap {cm['name']}")


def binary_of(ctr):
    """The kvstrata binary a container runs: command[0], or the $0 of a `sh -c SCRIPT NAME`."""
    cmd = ctr.get("command") or []
    if len(cmd) >= 4 and cmd[0].endswith("sh") and cmd[1] == "-c":
        return cmd[3]
    return cmd[0].rsplit("/", 1)[-1] if cmd else None


def asks_gpu(ctr):
    res = ctr.get("resources") or {}
    return {k: "nvidia.com/gpu" in (res.get(k) or {}) for k in ("requests", "limits")}


def is_gpu_cell(pod):
    """A pod that runs a kvstore and a decode worker side by side (overlays/gpu-shared)."""
    binaries = {binary_of(ctr) for ctr in pod.get("containers") or []}
    return {"kvstrata-kvstore", "kvstrata-decode"} <= binaries


def check_gpu(c, obj, pod, component, gpu):
    cell = is_gpu_cell(pod)  # one GPU for the pod: check_same_gpu checks who asks for it
    for ctr in pod.get("containers") or []:
        has = asks_gpu(ctr)
        if gpu and component in GPU_COMPONENTS and not cell and not all(has.values()):
            c.fail(obj, f"container {ctr['name']}: nvidia.com/gpu requests and limits expected")
        if not gpu and any(has.values()):
            c.fail(obj, f"container {ctr['name']}: nvidia.com/gpu outside the GPU overlay")
        device = arg_value(ctr.get("args"), "device") or ""
        if binary_of(ctr) == "kvstrata-decode" and any(has.values()) and \
                not device.startswith("cuda"):
            c.fail(obj, f"container {ctr['name']}: given a GPU but not --device=cuda "
                        "(the worker would run on the CPU)")


def check_same_gpu(c, workloads):
    cells = 0
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        if not is_gpu_cell(pod):
            continue
        cells += 1
        ctrs = pod.get("containers") or []
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        stores = [x for x in ctrs if binary_of(x) == "kvstrata-kvstore"]
        workers = [x for x in ctrs if binary_of(x) == "kvstrata-decode"]
        if len(stores) != 1:
            c.fail(w, f"{len(stores)} kvstore containers in one pod (one pool, one store)")
            continue
        store = stores[0]
        asking = [x for x in ctrs if any(asks_gpu(x).values())]
        if len(asking) != 1:
            c.fail(w, f"{len(asking)} containers ask for nvidia.com/gpu: the device plugin gives "
                      "each its own GPU, so exactly one may ask and the others share it")
        for x in asking:
            res = x.get("resources") or {}
            if any(str((res.get(k) or {}).get("nvidia.com/gpu")) != "1"
                   for k in ("requests", "limits")):
                c.fail(w, f"container {x['name']}: nvidia.com/gpu must be 1 in requests and "
                          "limits (one GPU for the store and its workers)")
        for x in ctrs:
            if x in asking or binary_of(x) not in ("kvstrata-kvstore", "kvstrata-decode"):
                continue
            env = {e["name"]: e.get("value") for e in x.get("env") or []}
            if env.get("NVIDIA_VISIBLE_DEVICES") in (None, "", "void", "none"):
                c.fail(w, f"container {x['name']}: asks for no GPU and sets no "
                          "NVIDIA_VISIBLE_DEVICES, so the runtime shows it none")
        for x in [store] + workers:
            if not (arg_value(x.get("args"), "device") or "").startswith("cuda"):
                c.fail(w, f"container {x['name']}: --device=cuda expected (the same GPU)")
        socket = arg_value(store.get("args"), "pool_socket")
        if not socket:
            c.fail(w, f"container {store['name']}: --pool_socket must be set (the default is "
                      "in the store's own /tmp, which no other container sees)")
            continue
        folder = posixpath.dirname(socket)
        mount = next((m for m in store.get("volumeMounts") or [] if m["mountPath"] == folder),
                     None)
        if mount is None or "emptyDir" not in volumes.get(mount["name"], {}):
            c.fail(w, f"container {store['name']}: the --pool_socket folder {folder} must be an "
                      "emptyDir volume mounted there")
            continue
        for x in workers:
            who = f"container {x['name']}"
            if not any(m["name"] == mount["name"] and m["mountPath"] == folder
                       for m in x.get("volumeMounts") or []):
                c.fail(w, f"{who}: must mount volume {mount['name']} at {folder}, where the "
                          f"store's pool socket is (the store answers {socket} as the path)")
            if (arg_value(x.get("args"), "same_gpu_transport") or "true") == "false":
                c.fail(w, f"{who}: --same_gpu_transport=false turns the transport off")
            if arg_value(x.get("args"), "page_mac_key_file") and \
                    arg_value(x.get("args"), "same_gpu_with_page_macs") not in ("true", "1"):
                c.fail(w, f"{who}: with --page_mac_key_file the same-GPU transport is off "
                          "unless --same_gpu_with_page_macs=true")
    if cells == 0:
        c.problems.append("--same-gpu: no pod runs a kvstore and a decode worker together")


def check_kvstore_addresses(c, objs, configmaps):
    kvstores = [o for o in objs if o["kind"] == "StatefulSet" and
                o["spec"]["template"]["metadata"]["labels"].get(LABEL_KEYS[2]) == "kvstore"]
    for sts in kvstores:
        service = sts["spec"]["serviceName"]
        replicas = sts["spec"].get("replicas", 1)
        port = sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        want = ",".join(f"{sts['metadata']['name']}-{i}.{service}:{port}" for i in range(replicas))
        for name, data in configmaps.items():
            got = data.get("KVSTORE_ADDRESSES")
            if got is not None and got != want:
                c.fail(sts, f"ConfigMap {name}: KVSTORE_ADDRESSES={got!r}, but the "
                            f"{replicas} kvstore pods are {want!r}")
        if not any(o["kind"] == "Service" and o["metadata"]["name"] == service and
                   o["spec"].get("clusterIP") == "None" for o in objs):
            c.fail(sts, f"serviceName {service} is not a headless Service here")


def check_rules(c, objs, gpu, same_gpu):
    configmaps = {o["metadata"]["name"]: o.get("data") or {}
                  for o in objs if o["kind"] == "ConfigMap"}
    workloads = [o for o in objs if o["kind"] in WORKLOAD_KINDS]
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    services = [o for o in objs if o["kind"] == "Service"]
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}

    for w in workloads:
        template = w["spec"]["template"]
        labels, pod = template["metadata"].get("labels") or {}, template["spec"]
        for key in LABEL_KEYS:
            if key not in labels:
                c.fail(w, f"pod template label {key} missing")
        if not matches(w["spec"]["selector"].get("matchLabels"), labels):
            c.fail(w, "selector does not select its own pod template")
        if not any(matches(p["spec"]["selector"].get("matchLabels"), labels) for p in pdbs):
            c.fail(w, "no PodDisruptionBudget selects its pods")
        for ctr in pod.get("containers") or []:
            check_container(c, w, pod, ctr)
        check_references(c, w, pod, configmaps)
        check_gpu(c, w, pod, labels.get(LABEL_KEYS[2]), gpu)

    def pods_with_port(selector, port_name):
        for w in workloads:
            t = w["spec"]["template"]
            if matches(selector, t["metadata"].get("labels") or {}):
                yield any(p.get("name") == port_name or p.get("containerPort") == port_name
                          for ctr in t["spec"]["containers"] for p in ctr.get("ports") or [])

    for s in services:
        for p in s["spec"].get("ports") or []:
            found = list(pods_with_port(s["spec"].get("selector"), p.get("targetPort", p["port"])))
            if not found:
                c.fail(s, "selects no workload's pods")
            elif not all(found):
                c.fail(s, f"targetPort {p.get('targetPort')} is not a port of the selected pods")
    # A NetworkPolicy selects pods that exist and opens only ports they have.
    for np in (o for o in objs if o["kind"] == "NetworkPolicy"):
        selector = np["spec"]["podSelector"].get("matchLabels") or {}
        selected = [w for w in workloads
                    if matches(selector, w["spec"]["template"]["metadata"].get("labels") or {})]
        if not selected:
            c.fail(np, f"podSelector {selector} selects no workload")
        open_ports = {p.get("containerPort") for w in selected
                      for ctr in w["spec"]["template"]["spec"]["containers"]
                      for p in ctr.get("ports") or []}
        for rule in np["spec"].get("ingress") or []:
            for port in rule.get("ports") or []:
                if port.get("port") not in open_ports:
                    c.fail(np, f"port {port.get('port')} is no container port of the pods it selects")
    for h in (o for o in objs if o["kind"] == "HorizontalPodAutoscaler"):
        ref = h["spec"]["scaleTargetRef"]
        if (ref["kind"], ref["name"]) not in names:
            c.fail(h, f"scaleTargetRef {ref['kind']}/{ref['name']} is not here")
    for m in (o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor")):
        selector = (m["spec"].get("selector") or {}).get("matchLabels")
        if m["kind"] == "ServiceMonitor":
            targets = [s for s in services if matches(selector, s["metadata"].get("labels") or {})]
            ports = {p.get("name") for s in targets for p in s["spec"].get("ports") or []}
            endpoints = m["spec"].get("endpoints") or []
        else:
            targets = [w for w in workloads
                       if matches(selector, w["spec"]["template"]["metadata"].get("labels") or {})]
            ports = {p.get("name") for w in targets
                     for ctr in w["spec"]["template"]["spec"]["containers"]
                     for p in ctr.get("ports") or []}
            endpoints = m["spec"].get("podMetricsEndpoints") or []
        if not targets:
            c.fail(m, "selects nothing in these manifests")
        for e in endpoints:
            if targets and e.get("port") not in ports:
                c.fail(m, f"port {e.get('port')} is not a port of what it selects")
    check_kvstore_addresses(c, objs, configmaps)
    if same_gpu:
        check_same_gpu(c, workloads)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="rendered YAML files, - for stdin")
    ap.add_argument("--kubernetes-version", default="1.30.0")
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU overlay: decode and kvstore must request nvidia.com/gpu")
    ap.add_argument("--same-gpu", action="store_true",
                    help="workers share their kvstore's GPU in one pod (overlays/gpu-shared)")
    ap.add_argument("--schema-only", action="store_true",
                    help="only the schemas (for fragments such as examples/)")
    opts = ap.parse_args()

    objs = []
    for f in opts.files:
        with (sys.stdin if f == "-" else open(f)) as stream:
            objs += [o for o in yaml.safe_load_all(stream) if o]
    c = Checker()
    if not objs:
        c.problems.append("no objects")
    for o in objs:
        check_schema(c, o, opts.kubernetes_version)
    if not opts.schema_only:
        try:
            check_rules(c, objs, opts.gpu, opts.same_gpu)
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            # Only reachable with a schema problem already reported: the rules assume valid objects.
            c.problems.append(f"rules not checked: objects malformed ({type(e).__name__}: {e})")

    kinds = sorted({o.get("kind", "?") for o in objs})
    for p in c.problems:
        print(f"FAIL {p}")
    print(f"{len(objs)} objects ({', '.join(kinds)}), Kubernetes {opts.kubernetes_version}: "
          f"{'ok' if not c.problems else f'{len(c.problems)} problems'}")
    return 1 if c.problems else 0


if __name__ == "__main__":
    sys.exit(main())
