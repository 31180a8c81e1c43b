#!/usr/bin/env python3
"""Build a needle-in-a-haystack prompt of a target token length.

The haystack is filler prose generated from fixed word lists by a fixed
pseudo-random generator (xorshift64*, seeded by --seed), so every machine
builds the same bytes without any file or network. A passphrase sentence is
planted after the given fraction of the filler sentences, and a question
asking for it closes the user message. The text is wrapped in the demo
model's chat template (Qwen2.5: its default system message, one user turn,
the generation prompt) and written as the exact prompt text; both engines
then get it as a raw prompt (`redlite generate --raw -f`, `llama-completion
-no-cnv -f`), with control tokens such as <|im_start|> parsed as special
tokens by both tokenizers.

The token length is measured with the model's own tokenizer through
`redlite tokenize` (which is what `redlite generate --raw` uses): the number
of filler sentences is the largest whose prompt has at most --length
tokens (binary search, one tokenizer call per step).

Writes PROMPT_FILE (the exact prompt text, no trailing newline added) and
prints one JSON object on stdout: tokens, sentences, needle_sentence,
needle_token (position of the needle sentence's first token), depth, passphrase.

  bench/needle_prompt.py --redlite target/release/redlite \
      --model ~/.cache/redlite/demo-model.gguf --length 8192 --depth 0.5 \
      --out /tmp/needle-8192-50.txt
"""
import argparse
import json
import os
import subprocess
import sys

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
PASSPHRASE = "4817-AMBER-FALCON"
QUESTION = (
    "What is the secret passphrase mentioned in the text above? "
    "Answer with the passphrase only."
)
INTRO = (
    "Read the following notes from a village archive carefully. "
    "Somewhere in them is a secret passphrase.\n\n"
)

SUBJECTS = [
    "The old harbour keeper", "A quiet librarian", "The baker from the hill",
    "Our neighbour's daughter", "The night watchman", "A travelling musician",
    "The village doctor", "Two young shepherds", "The retired sea captain",
    "A tired postman", "The schoolteacher", "The miller's apprentice",
    "An elderly gardener", "The blacksmith", "A visiting painter",
    "The station master", "The weaver", "A curious child",
]
VERBS = [
    "counted", "repaired", "painted", "carried", "watched", "collected",
    "sorted", "cleaned", "measured", "described", "planted", "wrapped",
    "inspected", "borrowed", "returned", "arranged",
]
OBJECTS = [
    "the grey fishing boats", "a basket of green apples", "the broken fence",
    "three wooden chairs", "the church bells", "a stack of old letters",
    "the rows of cabbages", "the copper kettles", "a pile of winter coats",
    "the narrow bridge", "the market stalls", "a box of candles",
    "the stone wall by the river", "the lanterns on the pier",
    "a map of the valley", "the sheep in the lower field",
]
WHEN = [
    "before dawn", "after the rain stopped", "on a cold Tuesday",
    "late in the evening", "during the harvest", "while the kettle boiled",
    "at the end of the summer", "before the market opened",
    "in the early afternoon", "when the tide went out", "after supper",
    "on the first day of spring",
]
TAILS = [
    "and nobody thought it unusual.", "and then went home to rest.",
    "as the wind came down from the hills.", "while humming an old song.",
    "and wrote it all down in a notebook.", "without saying a word.",
    "and the dogs followed along.", "as the clouds gathered over the bay.",
    "and found everything in good order.", "and promised to do it again soon.",
]


class XorShift64Star:
    """A fixed generator, so the text does not depend on Python's random."""

    def __init__(self, seed):
        self.s = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF or 1

    def next(self):
        x = self.s
        x ^= x >> 12
        x ^= (x << 25) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 27
        self.s = x
        return (x * 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF

    def pick(self, items):
        return items[(self.next() >> 33) % len(items)]


def filler(n, seed):
    rng = XorShift64Star(seed)
    return [
        f"{rng.pick(SUBJECTS)} {rng.pick(VERBS)} {rng.pick(OBJECTS)} "
        f"{rng.pick(WHEN)} {rng.pick(TAILS)}"
        for _ in range(n)
    ]


def needle_sentence(passphrase):
    return f"The secret passphrase is {passphrase}. Remember it."


def user_text(sentences, at, passphrase):
    """Filler sentences with the needle after sentence `at`, in paragraphs
    of six sentences, then the question."""
    body = sentences[:at] + [needle_sentence(passphrase)] + sentences[at:]
    paras = [" ".join(body[i:i + 6]) for i in range(0, len(body), 6)]
    return INTRO + "\n\n".join(paras) + "\n\n" + QUESTION


def chat(user):
    # The demo model's template (Qwen2.5) for one user message and no
    # system message: its default system message, then the user turn, then
    # the generation prompt. needle.sh checks that redlite's and
    # llama.cpp's tokenizers give the same ids for this text.
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n"
        f"<|im_start|>assistant\n"
    )


def count_tokens(redlite, model, text, scratch):
    """Prompt tokens of `text` by the model's tokenizer (`redlite tokenize`,
    the tokenization `redlite generate --raw` uses), through a scratch file:
    long prompts exceed what one command-line argument may hold."""
    with open(scratch, "w", encoding="utf-8") as f:
        f.write(text)
    r = subprocess.run(
        [redlite, "tokenize", "-m", model, "-f", scratch],
        capture_output=True, text=True,
    )
    if r.returncode != 0:
        sys.exit(f"needle_prompt: {redlite} tokenize failed: {r.stderr.strip()}")
    return len(json.loads(r.stdout))


def build(n, depth, seed, passphrase):
    s = filler(n, seed)
    at = round(depth * n)
    return s, at, chat(user_text(s, at, passphrase))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redlite", required=True, help="the redlite binary (for its tokenizer)")
    ap.add_argument("--model", required=True, help="the GGUF file whose tokenizer counts")
    ap.add_argument("--length", type=int, required=True, help="most prompt tokens")
    ap.add_argument("--depth", type=float, required=True, help="needle position, fraction of the filler (0..1)")
    ap.add_argument("--seed", type=int, default=1, help="filler generator seed (default 1)")
    ap.add_argument("--passphrase", default=PASSPHRASE)
    ap.add_argument("--out", required=True, help="where to write the prompt text")
    a = ap.parse_args()
    if not 0.0 <= a.depth <= 1.0:
        sys.exit("needle_prompt: --depth is a fraction in [0, 1]")
    scratch = a.out + ".count"

    def tokens(n):
        return count_tokens(a.redlite, a.model, build(n, a.depth, a.seed, a.passphrase)[2], scratch)

    try:
        base = tokens(0)
        if base > a.length:
            sys.exit(f"needle_prompt: the prompt without filler already has {base} tokens > --length {a.length}")
        # Grow the filler by doubling, then bisect: the largest count of
        # filler sentences whose prompt has at most --length tokens.
        lo, hi = 0, max(1, (a.length - base) // 20)  # lo fits; hi may not
        while tokens(hi) <= a.length:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if tokens(mid) <= a.length:
                lo = mid
            else:
                hi = mid
        _, at, text = build(lo, a.depth, a.seed, a.passphrase)
        n_tok = tokens(lo)
        # The needle's first position (0-based): the tokens of everything
        # before it, less the space that the needle's first token carries.
        before = text[: text.index(needle_sentence(a.passphrase))].rstrip(" ")
        needle_tok = count_tokens(a.redlite, a.model, before, scratch)
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(json.dumps({
        "tokens": n_tok, "sentences": lo, "needle_sentence": at,
        "needle_token": needle_tok, "depth": a.depth, "passphrase": a.passphrase,
    }))


if __name__ == "__main__":
    main()
