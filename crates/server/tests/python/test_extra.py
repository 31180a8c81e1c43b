"""The smaller endpoints and the logit-adjusting fields, through the official
client where it has them (model retrieval, logprobs, logit_bias) and raw
HTTP for llama-server's /tokenize and /detokenize."""

import json
import math

import openai
import pytest

from conftest import raw


def error_of(body: bytes) -> dict:
    return json.loads(body)["error"]


def test_retrieve_model(client, model_id):
    m = client.models.retrieve(model_id)
    assert m.id == model_id and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"


def test_tokenize_round_trip():
    text = "Hello, world! <|im_end|>"
    status, _, body = raw("POST", "/tokenize", json.dumps({"content": text}).encode())
    assert status == 200, body
    ids = json.loads(body)["tokens"]
    status, _, body = raw("POST", "/detokenize", json.dumps({"tokens": ids}).encode())
    assert status == 200, body
    assert json.loads(body)["content"] == text
    status, _, body = raw("POST", "/tokenize",
                          json.dumps({"content": "Hello", "with_pieces": True}).encode())
    pieces = json.loads(body)["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello"


def test_embeddings_refused(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model_id, input="x")
    assert e.value.body["code"] == "embeddings_not_supported"


def test_chat_logprobs(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=5, temperature=0, logprobs=True, top_logprobs=3,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for t in lp:
        assert len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(t.logprob, t.top_logprobs[0].logprob, abs_tol=1e-5)
        assert t.logprob <= 0
    # The tokens spell the answer.
    assert "".join(t.token for t in lp) == r.choices[0].message.content


def test_logit_bias_bans_the_greedy_token(client, model_id):
    kw = dict(model=model_id, messages=[{"role": "user", "content": "Say hello."}],
              max_tokens=1, temperature=0, logprobs=True,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    first = client.chat.completions.create(**kw).choices[0].logprobs.content[0]
    status, _, body = raw("POST", "/tokenize",
                          json.dumps({"content": first.token}).encode())
    (tid,) = json.loads(body)["tokens"]
    again = client.chat.completions.create(**kw, logit_bias={str(tid): -100})
    assert again.choices[0].logprobs.content[0].token != first.token
    # Penalties outside [-2, 2] are refused, naming the field.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**dict(kw, frequency_penalty=3))
    assert e.value.body["param"] == "frequency_penalty"


def test_chat_logprobs_streamed(client, model_id):
    kw = dict(model=model_id, messages=[{"role": "user", "content": "Say hello."}],
              max_tokens=5, temperature=0, logprobs=True, top_logprobs=2,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    whole = client.chat.completions.create(**kw)
    text, lps = "", []
    for c in client.chat.completions.create(**kw, stream=True):
        if c.choices and c.choices[0].delta.content:
            text += c.choices[0].delta.content
        if c.choices and c.choices[0].logprobs:
            lps += c.choices[0].logprobs.content
    assert text == whole.choices[0].message.content
    assert [t.token for t in lps] == [t.token for t in whole.choices[0].logprobs.content]
    assert "".join(t.token for t in lps) == text


def n_tokens(text: str) -> int:
    status, _, body = raw("POST", "/tokenize", json.dumps({"content": text}).encode())
    assert status == 200, body
    return len(json.loads(body)["tokens"])


def test_fill_in_the_middle(client, model_id):
    """`suffix`: the prompt becomes <|fim_prefix|> prompt <|fim_suffix|>
    suffix <|fim_middle|> (Qwen2.5-Coder's FIM tokens), and the model writes
    the middle: a function body between a signature and its use."""
    prefix = "def add(a, b):\n    "
    suffix = "\n\nprint(add(1, 2))\n"
    r = client.completions.create(model=model_id, prompt=prefix, suffix=suffix,
                                  max_tokens=16, temperature=0)
    assert r.usage.prompt_tokens == n_tokens(prefix) + n_tokens(suffix) + 3
    text = r.choices[0].text
    print("middle:", repr(text))
    assert "return" in text and "a" in text and "b" in text, text
    plain = client.completions.create(model=model_id, prompt=prefix, max_tokens=4, temperature=0)
    assert plain.usage.prompt_tokens == n_tokens(prefix)


def test_echo(client, model_id):
    prompt = "def fib(n):"
    plain = client.completions.create(model=model_id, prompt=prompt, max_tokens=8, temperature=0)
    echoed = client.completions.create(model=model_id, prompt=prompt, max_tokens=8,
                                       temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt=prompt, max_tokens=1, echo=True,
                                  logprobs=1)
    assert e.value.body["param"] == "echo"
