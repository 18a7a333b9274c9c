#!/usr/bin/env python3
"""The router's OpenAI-compatible HTTP front, driven by the official `openai` client against the
real local cluster (scripts/cluster.sh on free ports) on the default model.

Checks completions and chat, whole and streamed (the streamed text must equal the whole one, both
greedy), stop strings, max_tokens, usage and cached tokens on a repeated prefix, logprobs, errors
as OpenAI error objects (400 naming the parameter, 404, 413, 504), unknown fields ignored, that a
client that hangs up cancels its request, the `curl` examples of docs/api.md, and a wave of
concurrent streams (no failure other than 429, which docs/api.md documents).

Usage: openai_e2e_test.py BUILD_DIR   (with the test venv's Python, which has `openai`)
"""

import asyncio
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from local_cluster import ROOT, LocalCluster  # noqa: E402

import openai  # noqa: E402

SYSTEM_PROMPT = "You are the support assistant of Northwind Outfitters. Follow these rules.\n" + "".join(
    f"Rule {i + 1}: for questions about order {4100 + 37 * i}, check the record, confirm the "
    f"customer's address, and answer politely within {1 + i % 3} business days.\n"
    for i in range(24))
# Streams in the concurrency check (scripts/sanitize.sh asks for fewer: its binaries are slower).
CONCURRENT_STREAMS = int(os.environ.get("KVSTRATA_OPENAI_STREAMS", "256"))
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def metric(cluster, name):
    """The sum of a router metric's series."""
    port = cluster.ports["ROUTER_METRICS_PORT"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def wait_for(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def status_error(call):
    """The APIStatusError `call` raises."""
    try:
        call()
    except openai.APIStatusError as e:
        return e
    raise AssertionError("the request succeeded; an error was expected")


@check
def models_and_health(t):
    ids = [m.id for m in t.client.models.list().data]
    expect(ids == [t.model], f"/v1/models lists {ids}")
    expect(t.client.models.retrieve(t.model).id == t.model, "GET /v1/models/{id}")
    health = json.loads(urllib.request.urlopen(t.base + "/health", timeout=10).read())
    expect(health["status"] == "serving" and health["available_workers"] == 2, f"{health}")


@check
def completions_whole_and_streamed(t):
    args = dict(model=t.model, prompt="The capital of France is", max_tokens=12, temperature=0)
    whole = t.client.completions.create(**args)
    text = whole.choices[0].text
    expect(whole.object == "text_completion" and text, f"completion: {whole}")
    expect(whole.usage.completion_tokens <= 12 and whole.usage.prompt_tokens > 0, f"{whole.usage}")
    expect(whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens,
           "total_tokens")
    chunks = list(t.client.completions.create(**args, stream=True,
                                              stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    expect(streamed == text, f"streamed {streamed!r} != whole {text!r}")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    expect(finishes == [whole.choices[0].finish_reason], f"finish reasons {finishes}")
    expect(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens ==
           whole.usage.completion_tokens, f"usage chunk {chunks[-1]}")


@check
def chat_whole_and_streamed(t):
    args = dict(model=t.model, messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_completion_tokens=24, temperature=0)
    whole = t.client.chat.completions.create(**args)
    message = whole.choices[0].message
    expect(message.role == "assistant" and "Paris" in message.content, f"chat: {whole}")
    expect(whole.choices[0].finish_reason in ("stop", "length"), whole.choices[0].finish_reason)
    t.chat_text = message.content
    chunks = list(t.client.chat.completions.create(**args, stream=True))
    expect(chunks[0].choices[0].delta.role == "assistant", "first chunk carries the role")
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    expect(streamed == message.content, f"streamed {streamed!r} != whole {message.content!r}")
    expect(chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason, "finish reason")
    expect(all(c.usage is None for c in chunks), "no usage without include_usage")


@check
def stop_strings_and_max_tokens(t):
    words = t.chat_text.split(" ")
    expect(len(words) >= 3, f"greedy answer too short for a stop string: {t.chat_text!r}")
    stop = " " + words[2]
    expected = t.chat_text[:t.chat_text.index(stop)]
    r = t.client.chat.completions.create(
        model=t.model, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_completion_tokens=24, temperature=0, stop=[stop, "never appears"])
    expect(r.choices[0].message.content == expected and r.choices[0].finish_reason == "stop",
           f"stop {stop!r}: {r.choices[0].message.content!r}, {r.choices[0].finish_reason}")
    r = t.client.completions.create(model=t.model, prompt="Once upon a time", max_tokens=3,
                                    extra_body={"ignore_eos": True})
    expect(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3, f"{r}")


@check
def cached_tokens_on_a_repeated_prefix(t):
    def ask(question):
        return t.client.chat.completions.create(
            model=t.model, max_completion_tokens=4, temperature=0,
            messages=[{"role": "system", "content": SYSTEM_PROMPT},
                      {"role": "user", "content": question}]).usage
    first = ask("Which rule covers order 4211?")
    expect(first.prompt_tokens > 512, f"prompt of {first.prompt_tokens} tokens")
    deadline = time.time() + 30
    while True:
        u = ask(f"What do I confirm first? ({time.time()})")
        cached = u.prompt_tokens_details.cached_tokens
        if cached > 0 or time.time() > deadline:
            break
        time.sleep(0.5)
    expect(cached >= 512 and cached % 64 == 0 and cached < u.prompt_tokens,
           f"cached_tokens {cached} of {u.prompt_tokens} on the repeated system prompt")


@check
def logprobs(t):
    r = t.client.chat.completions.create(
        model=t.model, messages=[{"role": "user", "content": "Say hello."}], max_completion_tokens=5,
        temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    expect(len(content) == r.usage.completion_tokens, f"{len(content)} logprobs")
    for e in content:
        expect(e.logprob <= 0 and len(e.top_logprobs) == 2 and bytes(e.bytes).decode(
            "utf-8", "replace") == e.token, f"{e}")
        expect(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob, "tops in order")
        expect(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4, "greedy takes the top token")
    r = t.client.completions.create(model=t.model, prompt="One, two,", max_tokens=4, temperature=0,
                                    logprobs=2)
    lp = r.choices[0].logprobs
    expect(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4 and
           lp.text_offset[0] == 0, f"{lp}")


@check
def errors_name_the_parameter(t):
    chat = [{"role": "user", "content": "hi"}]
    cases = [
        (lambda: t.client.chat.completions.create(model=t.model, messages=chat, top_p=3), "top_p"),
        (lambda: t.client.chat.completions.create(model=t.model, messages=chat, n=2), "n"),
        (lambda: t.client.chat.completions.create(model=t.model, messages=chat,
                                                  extra_body={"temperature": "hot"}), "temperature"),
        (lambda: t.client.chat.completions.create(
            model=t.model, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
         "messages[0].content[0].type"),
        (lambda: t.client.chat.completions.create(model=t.model, messages=chat, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools"),
        (lambda: t.client.completions.create(model=t.model, prompt=["a", "b"]), "prompt"),
        (lambda: t.client.completions.create(model=t.model, prompt="a", max_tokens=100000),
         "prompt"),
    ]
    for call, param in cases:
        e = status_error(call)
        expect(e.status_code == 400 and e.body["param"] == param and e.body["message"],
               f"{param}: {e.status_code} {e.body}")
    e = status_error(lambda: t.client.completions.create(model=t.model, prompt="a", max_tokens=100000))
    expect(e.body["code"] == "context_length_exceeded", f"{e.body}")


@check
def errors_404_413_504(t):
    e = status_error(lambda: t.client.chat.completions.create(
        model="no-such-model", messages=[{"role": "user", "content": "hi"}]))
    expect(isinstance(e, openai.NotFoundError) and e.body["code"] == "model_not_found" and
           e.body["param"] == "model", f"{e.body}")
    e = status_error(lambda: t.client.embeddings.create(model=t.model, input="hi"))
    expect(e.status_code == 404 and e.body["type"] == "invalid_request_error", f"{e.body}")
    e = status_error(lambda: t.client.chat.completions.create(
        model=t.model, messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Kvstrata-Timeout-Ms": "1"}))
    expect(e.status_code == 504 and e.body["code"] == "deadline_exceeded", f"{e.status_code} {e.body}")
    big = json.dumps({"model": t.model, "prompt": "x" * (9 << 20)}).encode()
    request = urllib.request.Request(t.base + "/v1/completions", data=big,
                                     headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=30)
        raise AssertionError("a 9 MiB body was accepted")
    except urllib.error.HTTPError as e:
        expect(e.code == 413 and json.loads(e.read())["error"]["code"] == "request_too_large",
               f"{e.code}")


@check
def unknown_fields_are_ignored(t):
    r = t.client.chat.completions.create(
        model=t.model, messages=[{"role": "user", "content": "hi", "name": "ann"}],
        max_completion_tokens=2, user="ann",
        extra_body={"some_future_field": {"x": 1}, "store": False, "metadata": {"k": "v"}})
    expect(r.choices[0].message.content is not None, f"{r}")


def open_request(t, body):
    """A raw HTTP request on a socket of its own, left unread."""
    port = t.cluster.ports["ROUTER_HTTP_PORT"]
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


@check
def a_client_that_hangs_up_cancels_its_request(t):
    long = {"model": t.model, "prompt": "Once upon a time", "max_tokens": 3000,
            "extra": "ignored", "ignore_eos": True}
    for stream in (True, False):
        gone = metric(t.cluster, "kvstrata_router_http_client_disconnects_total")
        s = open_request(t, dict(long, stream=stream))
        if stream:
            got = b""
            while b"data:" not in got:
                got += s.recv(4096)
        else:
            wait_for("the request to run", lambda: metric(
                t.cluster, "kvstrata_router_running_requests") >= 1, 30)
        s.close()
        start = time.time()
        wait_for("the router to end the request", lambda: metric(
            t.cluster, "kvstrata_router_running_requests") == 0, 5)
        expect(metric(t.cluster, "kvstrata_router_http_client_disconnects_total") == gone + 1,
               "the disconnect is counted")
        print(f"  stream={stream}: request ended {time.time() - start:.2f} s after the client left")


@check
def curl_examples_in_the_docs(t):
    doc = (ROOT / "docs" / "api.md").read_text()
    section = doc[doc.index("## OpenAI-compatible HTTP"):]
    section = section[:section.find("\n## ", 1)]
    examples = [b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if "curl" in b]
    expect(len(examples) >= 4, f"{len(examples)} curl examples found")
    port = str(t.cluster.ports["ROUTER_HTTP_PORT"])
    for example in examples:
        script = example.replace("localhost:8070", f"localhost:{port}")
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                              text=True, timeout=120)
        expect(done.returncode == 0, f"example failed ({done.returncode}): {example}\n{done.stderr}")
        out = done.stdout.strip()
        if out.startswith("data:"):
            events = [line[5:].strip() for line in out.splitlines() if line.startswith("data:")]
            expect(events[-1] == "[DONE]", f"stream does not end with [DONE]: {example}")
            for e in events[:-1]:
                expect("error" not in json.loads(e), f"{example}: {e}")
        elif out.startswith("{"):
            expect("error" not in json.loads(out), f"{example}: {out}")
        expect(out, f"example printed nothing: {example}")


@check
def concurrent_streams(t):
    async def one(client, i):
        try:
            stream = await client.chat.completions.create(
                model=t.model, messages=[{"role": "user", "content": f"Count to three. ({i})"}],
                max_completion_tokens=8, temperature=0.7, seed=i, stream=True)
            finish = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            return "ok" if finish in ("stop", "length") else f"no finish reason ({finish})"
        except openai.RateLimitError:
            return "429"
        except Exception as e:  # noqa: BLE001 — every other outcome is a failure to report
            return f"{type(e).__name__}: {e}"

    async def wave():
        async with openai.AsyncOpenAI(base_url=t.base + "/v1", api_key="unused", max_retries=0,
                                      timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(CONCURRENT_STREAMS)))

    start = time.time()
    results = asyncio.run(wave())
    elapsed = time.time() - start
    ok, limited = results.count("ok"), results.count("429")
    failed = [r for r in results if r not in ("ok", "429")]
    print(f"  {CONCURRENT_STREAMS} concurrent streams: {ok} complete, {limited} answered 429, "
          f"{len(failed)} failed, {elapsed:.1f} s")
    expect(not failed, f"failures: {failed[:5]}")
    expect(ok >= CONCURRENT_STREAMS // 2, f"only {ok} streams completed")


class Context:
    pass


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    cluster = LocalCluster(sys.argv[1])
    passed, failed = 0, 0
    with cluster:
        t = Context()
        t.cluster = cluster
        t.base = cluster.openai_base_url[: -len("/v1")]
        t.client = openai.OpenAI(base_url=cluster.openai_base_url, api_key="unused",
                                 max_retries=0, timeout=120)
        t.model = t.client.models.list().data[0].id
        t.chat_text = ""
        for fn in CHECKS:
            start = time.time()
            try:
                fn(t)
                passed += 1
                print(f"PASS {fn.__name__} ({time.time() - start:.1f} s)", flush=True)
            except Exception as e:  # noqa: BLE001
                failed += 1
                print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
        if failed:
            for log in cluster.logs():
                print(f"---- {log.name} (tail) ----\n{log.read_text()[-3000:]}")
    if not failed:
        shutil.rmtree(cluster.work, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
