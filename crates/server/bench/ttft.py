"""Time to first token of a conversation's second turn, through the OpenAI
client: turn 1 (system prompt + question) is answered whole; turn 2 repeats
it with the answer and a follow-up, streamed, and the time to its first
content token is measured. With the prompt cache the server continues from
its checkpoint of turn 1; with --no-prompt-cache it recomputes everything.

    python crates/server/bench/ttft.py --base-url http://127.0.0.1:8080/v1 [--runs 5]
"""

import argparse
import json
import statistics
import time

import openai

SYSTEM = (
    "You are a careful assistant for a small hardware shop. Answer briefly. "
    "Policies: returns within 30 days with a receipt; store credit after that; "
    "opening hours are 9 to 18 on weekdays and 10 to 16 on Saturdays; closed on Sundays. "
    "We sell hand tools, power tools, fasteners, paint, garden supplies and electrical parts. "
    "Delivery is free above 50 euros within the city, otherwise 7 euros. "
    "Staff: Anna (paint), Ben (power tools), Chiara (garden), Dmitri (electrical). "
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="sk-anything")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--system-repeat", type=int, default=4,
                    help="repeat the system prompt this many times (longer prompt)")
    args = ap.parse_args()
    c = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)
    model = c.models.list().data[0].id
    ttfts, rows = [], []
    for run in range(args.runs):
        # A distinct conversation each run: nothing cached from the last one.
        msgs = [
            {"role": "system", "content": f"Session {time.time_ns()}. " + SYSTEM * args.system_repeat},
            {"role": "user", "content": "When are you open on Saturday?"},
        ]
        r1 = c.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0)
        msgs += [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "user", "content": "And who can help me with paint?"},
        ]
        t0 = time.perf_counter()
        ttft, usage = None, None
        for chunk in c.chat.completions.create(
            model=model, messages=msgs, max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True},
        ):
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - t0
            if chunk.usage:
                usage = chunk.usage
        ttfts.append(ttft)
        rows.append({
            "turn2_prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.prompt_tokens_details.cached_tokens,
            "ttft_s": round(ttft, 3),
        })
    print(json.dumps({"runs": rows, "median_ttft_s": round(statistics.median(ttfts), 3)}, indent=1))


if __name__ == "__main__":
    main()
