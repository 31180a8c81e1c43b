"""A bounded load test: concurrent streaming clients plus clients that leave
mid-stream. The server keeps serving, every completed answer is whole and
equal to a sequential greedy run, and (in-process servers) resident memory
comes back near its baseline."""

import os
import threading
import time

import openai

from conftest import API_KEY, BASE_URL, vm_rss_kib

PROMPTS = [
    "Name a planet.",
    "Name an animal.",
    "Name a fruit.",
    "Name a country.",
]
N_CLIENTS = int(os.environ.get("REDLITE_LOAD_CLIENTS", "8"))
N_LEAVERS = 3
MAX_TOKENS = 8


def ask(client, model_id, prompt, stream):
    kw = dict(
        model=model_id,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, reason = "", None
    for c in client.chat.completions.create(stream=True, **kw):
        if c.choices:
            text += c.choices[0].delta.content or ""
            reason = c.choices[0].finish_reason or reason
    return text, reason


def leave_early(model_id):
    c = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=300)
    s = c.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=200,
        temperature=0,
        stream=True,
    )
    # Leave in the middle of the generation: after the first content token.
    for chunk in s:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    s.close()


def test_concurrent_streams_with_disconnects(client, model_id):
    pid = os.environ.get("REDLITE_SERVER_PID")
    # Sequential greedy answers: the reference (and the warm-up).
    want = {p: ask(client, model_id, p, stream=False) for p in PROMPTS}
    for text, reason in want.values():
        assert text and reason in ("stop", "length")
    base = vm_rss_kib(int(pid)) if pid else None

    results, errors = {}, []

    def worker(i):
        try:
            c = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=600)
            results[i] = ask(c, model_id, PROMPTS[i % len(PROMPTS)], stream=True)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    def leaver():
        try:
            leave_early(model_id)
        except Exception as e:  # noqa: BLE001
            errors.append(("leaver", repr(e)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N_CLIENTS)]
    threads += [threading.Thread(target=leaver) for _ in range(N_LEAVERS)]
    # Interleave the leavers with the streaming clients.
    order = threads[:N_CLIENTS:2] + threads[N_CLIENTS:] + threads[1:N_CLIENTS:2]
    t0 = time.time()
    for t in order:
        t.start()
        time.sleep(0.05)
    for t in order:
        t.join(timeout=600)
    assert not errors, errors
    assert len(results) == N_CLIENTS
    for i, got in results.items():
        assert got == want[PROMPTS[i % len(PROMPTS)]], (i, got)
    print(f"\n{N_CLIENTS} streams + {N_LEAVERS} leavers in {time.time() - t0:.1f} s")

    # Still serving.
    assert ask(client, model_id, PROMPTS[0], stream=False) == want[PROMPTS[0]]
    if base is not None:
        time.sleep(0.5)
        after = vm_rss_kib(int(pid))
        print(f"VmRSS baseline {base // 1024} MiB, after load {after // 1024} MiB")
        # Checkpoints are bounded and generation buffers are freed.
        assert after - base < 96 * 1024, (base, after)
