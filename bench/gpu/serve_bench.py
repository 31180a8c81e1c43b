"""Decode speed and time to first token through `redlite serve`, measured
with the official `openai` client (any OpenAI-compatible server works).

    python3 serve_bench.py BASE_URL LABEL [--turns 2] [--system-tokens N]

Prints one JSON line per measurement:
- `decode`: a raw completion of --max-tokens tokens, streamed; tok/s over
  the tokens after the first (the first token's time is the prompt's);
- `turn`: a 2-turn chat conversation (a long system prompt, a question,
  the answer, a follow-up question); each turn's time to the first
  streamed token and the server's usage (prompt and cached tokens).
"""

import argparse
import json
import time

import openai

p = argparse.ArgumentParser()
p.add_argument("base_url")
p.add_argument("label")
p.add_argument("--max-tokens", type=int, default=256)
p.add_argument("--system-words", type=int, default=1500)
p.add_argument("--repeats", type=int, default=3)
a = p.parse_args()

client = openai.OpenAI(base_url=a.base_url, api_key="anything", max_retries=0, timeout=900)
model = client.models.list().data[0].id


def streamed(create):
    t0 = time.perf_counter()
    first = None
    usage = None
    pieces = []
    for ch in create():
        if ch.choices:
            c = ch.choices[0]
            text = getattr(c, "text", None)
            if text is None and getattr(c, "delta", None) is not None:
                d = c.delta
                text = (d.content or "") + (getattr(d, "reasoning_content", None) or "")
            if text:
                if first is None:
                    first = time.perf_counter()
                pieces.append(text)
        if getattr(ch, "usage", None):
            usage = ch.usage
    t1 = time.perf_counter()
    return t0, first or t1, t1, usage, "".join(pieces)


def server_decode_tok_s():
    """The server's own decode speed of its last request (/metrics), which
    leaves out the client's time to parse each streamed chunk."""
    import urllib.request
    root = a.base_url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(root + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('redlite_decode_tokens_per_second{window="last"}'):
                return float(line.split()[-1])
    return None


def emit(**kv):
    kv["label"] = a.label
    print(json.dumps(kv), flush=True)


for i in range(a.repeats):
    t0, first, t1, u, _ = streamed(lambda: client.completions.create(
        model=model, prompt="def quicksort(xs):", max_tokens=a.max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    n = u.completion_tokens if u else None
    emit(kind="decode", run=i, completion_tokens=n, ttft_s=first - t0,
         decode_tok_s=(n - 1) / (t1 - first) if n and n > 1 and t1 > first else None,
         server_decode_tok_s=server_decode_tok_s())

words = ("fn parse_header(bytes: &[u8]) -> Result<Header, Error> { let magic = read_u32(bytes, 0)?; "
         "if magic != GGUF_MAGIC { return Err(Error::BadMagic(magic)); } ").split()
system = "You are a coding agent working in this repository.\n" + " ".join(
    words[i % len(words)] for i in range(a.system_words))
for i in range(a.repeats):
    messages = [{"role": "system", "content": system + f"\nSession {i}."},
                {"role": "user", "content": "Summarise what parse_header does."}]
    for turn in (1, 2):
        t0, first, t1, u, text = streamed(lambda: client.chat.completions.create(
            model=model, messages=messages, max_tokens=32, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        details = getattr(u, "prompt_tokens_details", None) if u else None
        emit(kind="turn", run=i, turn=turn, ttft_s=first - t0, total_s=t1 - t0,
             prompt_tokens=u.prompt_tokens if u else None,
             cached_tokens=getattr(details, "cached_tokens", None) if details else None)
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": "Now write a test for it."}]
