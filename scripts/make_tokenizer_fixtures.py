#!/usr/bin/env python3
"""Make the expected-output fixtures for crates/tokenizer from INDEPENDENT engines.

* Token ids: a Hugging Face `tokenizers` tokenizer built from the vocabulary and
  merges stored in the GGUF (read with the `gguf` package), with the Qwen2
  pre-tokenizer config as Qwen's tokenizer.json has it (Split on the Qwen2
  regex, Isolated, then ByteLevel without regex) and the CONTROL /
  USER_DEFINED tokens registered as added tokens.
  No normalizer: GGUF/llama.cpp tokenization does not apply Qwen's NFC, so the
  corpus is kept NFC-stable (asserted below) and both conventions agree on it.
* Chat renders: Python `jinja2` with the settings transformers uses for chat
  templates (trim_blocks, lstrip_blocks, loopcontrols, sandbox, a `tojson`
  equal to json.dumps(ensure_ascii=False), raise_exception).

Writes crates/tokenizer/tests/fixtures/qwen2_corpus.json and qwen2_chat.json.

Setup (pinned):
    python3 -m venv .venv
    .venv/bin/pip install gguf==0.19.0 tokenizers==0.23.3 jinja2==3.1.6
    .venv/bin/python scripts/make_tokenizer_fixtures.py \
        [crates/tokenizer/tests/fixtures/qwen2-tokenizer.gguf]
"""
import json
import os
import random
import sys
import unicodedata

import gguf
import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

PINNED = {"tokenizers": "0.23.3", "jinja2": "3.1.6"}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "crates", "tokenizer", "tests", "fixtures")

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def check_versions():
    got = {"tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__}
    for k, v in PINNED.items():
        if got[k] != v:
            print(f"warning: {k} {got[k]} != pinned {v}", file=sys.stderr)


def read_gguf(path):
    r = gguf.GGUFReader(path)

    def get(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    return {
        "tokens": get("tokenizer.ggml.tokens"),
        "types": get("tokenizer.ggml.token_type"),
        "merges": get("tokenizer.ggml.merges"),
        "template": get("tokenizer.chat_template"),
        "bos": get("tokenizer.ggml.bos_token_id"),
        "eos": get("tokenizer.ggml.eos_token_id"),
    }


def build_tokenizer(g):
    vocab = {t: i for i, t in enumerate(g["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in g["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials, added = [], []
    for t, ty in zip(g["tokens"], g["types"]):
        if ty == 3:  # CONTROL
            specials.append(AddedToken(t, special=True, normalized=False))
        elif ty == 4:  # USER_DEFINED
            added.append(AddedToken(t, special=False, normalized=False))
    tok.add_special_tokens(specials)
    tok.add_tokens(added)
    return tok


CORPUS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How's it going? I'm fine, you'll see; they've said we'd go.",
    "IT'S SHOUTING: WE'LL, THEY'RE, I'D, YOU'VE, DON'T, I'M",
    "don't 's 't x'S y'Ll 'd' ''s",
    "long s folds: a'ſt b'ſ c'Ka",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e10 0xFF 1,000,000 ٣٤٥ ① ½ Ⅻ ²³",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{:?}\", v);\n}\n",
    "#include <stdio.h>\r\nint main(void) {\r\n    printf(\"hi\\n\");\r\n    return 0;\r\n}\r\n",
    "const f = async (a, b) => { await fetch(`/api/${a}?b=${b}`); return a ?? b; };",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%o%' ORDER BY id DESC;",
    "<html><body><div class=\"x\">&amp; &lt;tag&gt;</div></body></html>",
    "    four spaces\n        eight spaces\n\t\ttwo tabs\n\n\n\nmany newlines",
    "trailing spaces   \nand tabs\t\t\n   ",
    "a  b   c    d     e      f",
    " " * 40 + "x" + " " * 17,
    "\n\n\n" + " " * 5 + "\n \n\t\n",
    "line1\r\nline2\r\n\r\nline3\rline4\n\r",
    "中文分词测试：你好，世界！今天天气很好。",
    "日本語のテキスト、カタカナとひらがな。한국어 텍스트도 있습니다.",
    "Ελληνικά, русский текст, עברית, العربية, हिन्दी, ไทย",
    "emoji 😀😃😄 👍🏽 ❤️ 🇺🇸🇯🇵 👨‍👩‍👧‍👦 👩🏾‍💻 🏳️‍🌈 🧑‍🤝‍🧑",
    "mixed: café naïve résumé Zürich ß ẞ ﬁ Å",
    "punct!!! ??? ... --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "path/to/file.rs:12:34 https://example.com/a?b=c&d=e#frag user@example.com",
    "x=1;y=2\nz = x+y  # comment\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more text<|endoftext|><|endoftext|>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>",
    "<|repo_name|>redlite<|file_sep|>src/main.rs\nfn main() {}",
    "<|im_start|><|im_end|><|im_start|>",
    "almost special: <|im_start| <im_start|> <|im_start <|unknown|> </tool_call",
    "<|vision_start|><|image_pad|><|vision_end|>describe",
    "   <|im_end|>   \n",
    "Unicode spaces:\u00a0nbsp\u2003em\u3000ideographic\u2028ls\u2029ps\u0085nel\u000bvt\u000cff end",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "control \x00 \x01 \x1f \x7f chars",
    "ÀÁÂÃÄÅ àáâãäå 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 math",
    "a'b'c 'hello' \"quoted\" `backtick` ‘smart’ “quotes”",
    "1+1=2, 2*3=6, 10/2=5, 2^10=1024, 7%3=1",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
    "\t\t\t\tdeeply\n\t\t\t\t\tindented\n",
    "The quick brown fox jumps over the lazy dog. " * 5,
]

# Random strings over a mix of character classes, to shake out pre-tokenizer
# edge cases (made NFC-stable; the seed keeps the file reproducible).
POOL = (
    list("abcXYZ019'' \t\n\r.,;:!?-_()[]{}<>/\\\"@#$%&*+=|~`^")
    + [" "] * 10
    + list("éßÆñ中文日本한국😀👍🏽‍️٣①½ⅫⅫ²\u00a0\u3000\u2028\u0085\u200b")
    + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "'s", "'LL", "\r\n"]
)


def random_corpus(n, seed=1234):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        s = "".join(rng.choice(POOL) for _ in range(k))
        out.append(unicodedata.normalize("NFC", s))
    return out


# ---------------------------------------------------------------- chat ----

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # what transformers installs for chat templates
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def jinja_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


# A Qwen3-style template written for these tests: it exercises the Python
# string methods (split, lstrip, rstrip, startswith, endswith, strip),
# namespace(), reverse slicing, reasoning_content and enable_thinking.
THINKING_TEMPLATE = """{%- if messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content.strip() + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if message.role == 'user' and not message.content.startswith('<tool_response>') and ns.last_query == messages|length - 1 %}
{%- set ns.last_query = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'user' %}
{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{%- set content = message.content if message.content is string else '' %}
{%- set reasoning = '' %}
{%- if message.reasoning_content is string %}
{%- set reasoning = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query and reasoning %}
{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
{%- else %}
{{- '<|im_start|>assistant\\n' + content }}
{%- endif %}
{%- if content.endswith('.') %}{{- ' [ends with period]' }}{%- endif %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city — température “now”",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "integer", "minimum": 0}},
                "required": ["a", "b"],
            },
        },
    },
]

CHATS = [
    {
        "name": "plain",
        "messages": [{"role": "user", "content": "Write hello world in Rust."}],
        "add_generation_prompt": True,
    },
    {
        "name": "system_multi_turn",
        "messages": [
            {"role": "system", "content": "You are a terse coding assistant."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And in 中文?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "no_generation_prompt",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! 😀"},
        ],
        "add_generation_prompt": False,
    },
    {
        "name": "tools_call_result",
        "messages": [
            {"role": "user", "content": "Weather in Paris and 2+3?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
                    {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
                ],
            },
            {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "It is 21 °C and clear; 2+3 = 5."},
        ],
        "tools": TOOLS,
        "add_generation_prompt": False,
    },
    {
        "name": "tools_system_string_arguments",
        "messages": [
            {"role": "system", "content": "Use tools when helpful."},
            {"role": "user", "content": "Add 1 and 2"},
            {
                "role": "assistant",
                "content": "Let me add.",
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}],
            },
            {"role": "tool", "content": "3"},
        ],
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
    {
        "name": "enable_thinking_false_gguf_template",
        "messages": [{"role": "user", "content": "Quick answer: capital of France?"}],
        "add_generation_prompt": True,
        "enable_thinking": False,
    },
    {
        "name": "thinking_template_disabled",
        "template": THINKING_TEMPLATE,
        "messages": [
            {"role": "system", "content": "  Be brief.  \n"},
            {"role": "user", "content": "Capital of France?"},
        ],
        "add_generation_prompt": True,
        "enable_thinking": False,
    },
    {
        "name": "thinking_template_history",
        "template": THINKING_TEMPLATE,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nHello."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
            {"role": "assistant", "content": "done", "reasoning_content": "\nexplicit reasoning\n"},
        ],
        "add_generation_prompt": True,
        "enable_thinking": True,
    },
    {
        "name": "thinking_template_default",
        "template": THINKING_TEMPLATE,
        "messages": [{"role": "user", "content": "Hello"}],
        "add_generation_prompt": True,
    },
]


def render_chats(gguf_template, bos, eos):
    env = jinja_env()
    out = []
    for c in CHATS:
        src = c.get("template", gguf_template)
        kwargs = {
            "messages": c["messages"],
            "add_generation_prompt": c["add_generation_prompt"],
            "bos_token": bos,
            "eos_token": eos,
        }
        if c.get("tools") is not None:
            kwargs["tools"] = c["tools"]
        if c.get("enable_thinking") is not None:
            kwargs["enable_thinking"] = c["enable_thinking"]
        expected = env.from_string(src).render(**kwargs)
        entry = {
            "name": c["name"],
            "template": c.get("template"),  # null: the GGUF's tokenizer.chat_template
            "messages": c["messages"],
            "tools": c.get("tools"),
            "add_generation_prompt": c["add_generation_prompt"],
            "enable_thinking": c.get("enable_thinking"),
            "expected": expected,
        }
        out.append(entry)
    return out


def main():
    check_versions()
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(FIX, "qwen2-tokenizer.gguf")
    g = read_gguf(path)
    tok = build_tokenizer(g)

    texts = CORPUS + random_corpus(300)
    # A text mixing everything, and a long one.
    texts.append("\n".join(CORPUS))
    for t in texts:
        assert unicodedata.normalize("NFC", t) == t, f"corpus text not NFC-stable: {t!r}"

    entries = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        assert back == t, f"HF round trip failed for {t!r}: {back!r}"
        entries.append({"text": t, "ids": ids})
    with open(os.path.join(FIX, "qwen2_corpus.json"), "w", encoding="utf-8") as f:
        # one entry per line: diffs stay readable
        f.write("[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n]\n")

    bos = g["tokens"][g["bos"]] if g["bos"] is not None else ""
    eos = g["tokens"][g["eos"]] if g["eos"] is not None else ""
    chats = render_chats(g["template"], bos, eos)
    with open(os.path.join(FIX, "qwen2_chat.json"), "w", encoding="utf-8") as f:
        json.dump(chats, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(entries)} corpus entries, {len(chats)} chat renders", file=sys.stderr)


if __name__ == "__main__":
    main()
