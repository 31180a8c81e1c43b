"""`/metrics` read by the Prometheus project's own parser of the text
exposition format (`prometheus_client.parser`): the whole page must parse,
and the latency histograms (time to first token, per-step token latency,
prompt processing) must be well-formed histograms that count a request's
steps: one time to first token, one prompt, and one inter-token latency
per generated token after the first.
"""

import json
import math
import uuid

from prometheus_client.parser import text_string_to_metric_families

from conftest import raw

HISTOGRAMS = [
    "redlite_time_to_first_token_seconds",
    "redlite_token_latency_seconds",
    "redlite_prompt_processing_seconds",
]


def scrape() -> dict:
    status, headers, body = raw("GET", "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain"), headers
    # The parser raises on any line that is not valid exposition text.
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def histogram(families: dict, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """(cumulative buckets as (le, count), sum, count), checked well-formed."""
    f = families[name]
    assert f.type == "histogram", (name, f.type)
    buckets, total, count = [], None, None
    for s in f.samples:
        if s.name == name + "_bucket":
            buckets.append((float(s.labels["le"]), s.value))
        elif s.name == name + "_sum":
            total = s.value
        elif s.name == name + "_count":
            count = s.value
    assert buckets and total is not None and count is not None, f.samples
    les = [le for le, _ in buckets]
    assert les == sorted(les) and les[-1] == math.inf, les
    counts = [c for _, c in buckets]
    assert all(a <= b for a, b in zip(counts, counts[1:])), counts
    assert counts[-1] == count, (counts, count)
    assert total >= 0
    return buckets, total, count


def test_latency_histograms_count_each_step(model_id):
    before = scrape()
    for name in HISTOGRAMS:
        histogram(before, name)
    # A prompt never sent before, so none of it is cached.
    prompt = f"Request {uuid.uuid4().hex}: count from one to ten:"
    body = json.dumps({"model": model_id, "prompt": prompt, "max_tokens": 6,
                       "temperature": 0}).encode()
    status, _, out = raw("POST", "/v1/completions", body)
    assert status == 200, out
    usage = json.loads(out)["usage"]
    generated = usage["completion_tokens"]
    assert generated >= 2, usage
    after = scrape()
    grew = {}
    for name in HISTOGRAMS:
        _, sum0, n0 = histogram(before, name)
        _, sum1, n1 = histogram(after, name)
        grew[name] = n1 - n0
        assert sum1 >= sum0
    assert grew["redlite_time_to_first_token_seconds"] == 1, grew
    assert grew["redlite_prompt_processing_seconds"] == 1, grew
    assert grew["redlite_token_latency_seconds"] == generated - 1, (grew, usage)
