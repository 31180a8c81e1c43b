"""The official `openai` client against a running `redlite serve`.

The demo model is small (Qwen2.5 0.5B) and slow on CI machines, so every
generation is short and greedy (temperature 0) where the text is compared.
"""

import json
import time

import openai
import pytest

from conftest import API_KEY, BASE_URL, error_of, raw

USER = [{"role": "user", "content": "Name three colors."}]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}


def stream_text(stream):
    """Concatenate a chat stream; return (content, chunks)."""
    chunks = list(stream)
    content = "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices
    )
    return content, chunks


def test_health_needs_no_key():
    status, _, body = raw("GET", "/health", key=None)
    assert status == 200
    assert json.loads(body)["status"] == "ok"


def test_models(client, model_id):
    models = client.models.list()
    assert len(models.data) == 1
    assert models.data[0].object == "model"
    assert model_id


def test_chat(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=USER, max_tokens=6, temperature=0)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == model_id
    assert isinstance(r.created, int)
    choice = r.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 5
    assert 1 <= u.completion_tokens <= 6
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_content_parts_and_system_roles(client, model_id):
    r = client.chat.completions.create(
        model=model_id,
        messages=[
            {"role": "developer", "content": "Answer in one word."},
            {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
        ],
        max_completion_tokens=4,
        temperature=0,
    )
    assert r.choices[0].message.content
    assert r.usage.completion_tokens <= 4


def test_stream_matches_whole_answer_and_reports_usage(client, model_id):
    whole = client.chat.completions.create(
        model=model_id, messages=USER, max_tokens=8, temperature=0
    )
    stream = client.chat.completions.create(
        model=model_id,
        messages=USER,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, chunks = stream_text(stream)
    assert content == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id and c.id.startswith("chatcmpl-") for c in chunks)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    assert finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    # The last chunk carries the usage and no choices; the others have null usage.
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_usage_has_none(client, model_id):
    _, chunks = stream_text(
        client.chat.completions.create(
            model=model_id, messages=USER, max_tokens=3, temperature=0, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_output(client, model_id, stream):
    msgs = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    full = client.chat.completions.create(
        model=model_id, messages=msgs, max_tokens=16, temperature=0
    ).choices[0].message.content
    assert len(full) >= 6, full
    # A stop string from the middle of the greedy answer, likely spanning tokens.
    stop = full[len(full) // 2: len(full) // 2 + 3]
    want = full[: full.find(stop)]
    kw = dict(model=model_id, messages=msgs, max_tokens=16, temperature=0, stop=[stop, "@@@"])
    if stream:
        got, chunks = stream_text(client.chat.completions.create(stream=True, **kw))
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        r = client.chat.completions.create(**kw)
        got, reason = r.choices[0].message.content, r.choices[0].finish_reason
    assert got == want, (full, stop, got)
    assert reason == "stop"


def test_completions(client, model_id):
    r = client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert r.id.startswith("cmpl-")
    assert r.object == "text_completion"
    text = r.choices[0].text
    assert text
    assert r.usage.completion_tokens <= 4
    s = client.completions.create(
        model=model_id,
        prompt="The capital of France is",
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(s)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].usage.total_tokens == r.usage.total_tokens


def test_seeded_sampling_repeats(client, model_id):
    kw = dict(model=model_id, messages=USER, max_tokens=5, temperature=1.0, top_p=0.9, seed=42,
              extra_body={"top_k": 20, "min_p": 0.01})
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def check_tool_call(tc):
    assert tc.id.startswith("call_")
    assert tc.type == "function"
    assert tc.function.name == "get_weather"
    return json.loads(tc.function.arguments)


def test_tools_round_trip(client, model_id):
    msgs = [
        {"role": "system", "content": "You are a helpful assistant. Use tools when they help."},
        {"role": "user", "content": "What is the weather in Paris right now?"},
    ]
    r = client.chat.completions.create(
        model=model_id, messages=msgs, tools=[WEATHER_TOOL], max_tokens=40, temperature=0
    )
    choice = r.choices[0]
    if choice.message.tool_calls:
        # The model called the tool: check the OpenAI shape.
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]
        args = check_tool_call(call)
        assert isinstance(args, dict)
        assistant = choice.message.model_dump(exclude_none=True)
    else:
        # The 0.5B model may answer in words; go on with a call of our own.
        assert isinstance(choice.message.content, str)
        assistant = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{
                "id": "call_test123",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            }],
        }
        call = None
    call_id = call.id if call else "call_test123"
    msgs += [
        assistant,
        {"role": "tool", "tool_call_id": call_id, "content": "{\"temp_c\": 18, \"sky\": \"sunny\"}"},
    ]
    r2 = client.chat.completions.create(
        model=model_id, messages=msgs, tools=[WEATHER_TOOL], max_tokens=12, temperature=0
    )
    m = r2.choices[0].message
    assert m.content or m.tool_calls
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens


def test_forced_tool_call(client, model_id):
    """A named tool_choice forces the call: the parse path is deterministic."""
    msgs = [{"role": "user", "content": "Weather in Oslo?"}]
    r = client.chat.completions.create(
        model=model_id,
        messages=msgs,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=24,
        temperature=0,
    )
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert calls[0].id.startswith("call_")
    if r.choices[0].finish_reason == "tool_calls":
        assert isinstance(json.loads(calls[0].function.arguments), dict)
    # Streamed: first the id and name, then argument pieces.
    s = client.chat.completions.create(
        model=model_id,
        messages=msgs,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    deltas = [tc for c in s if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas, "no tool call deltas"
    assert deltas[0].id.startswith("call_") and deltas[0].function.name
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    assert all(d.index == 0 for d in deltas if d.index is not None) or len({d.index for d in deltas}) > 1


def test_tool_choice_none_ignores_tools(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=USER, tools=[WEATHER_TOOL], tool_choice="none",
        max_tokens=4, temperature=0,
    )
    assert not r.choices[0].message.tool_calls


def test_prompt_reuse_reports_cached_tokens(client, model_id):
    msgs = [
        {"role": "system", "content": "You are a terse assistant. " * 8},
        {"role": "user", "content": "Give me a fruit."},
    ]
    r1 = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=6, temperature=0)
    msgs += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "Another one."},
    ]
    r2 = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=4, temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens, (cached, r1.usage)
    assert cached < r2.usage.prompt_tokens


def test_disconnect_cancels_generation(client, model_id):
    def cancelled():
        _, _, body = raw("GET", "/metrics")
        for line in body.decode().splitlines():
            if line.startswith("redlite_requests_cancelled_total"):
                return float(line.split()[-1])
        raise AssertionError("no cancel counter")

    before = cancelled()
    s = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_tokens=400,
        temperature=0,
        stream=True,
    )
    got = 0
    for c in s:
        if c.choices and c.choices[0].delta.content:
            got += 1
            if got >= 2:
                break
    s.close()
    # The engine notices before its next tokens; a new request runs at once.
    t0 = time.time()
    r = client.chat.completions.create(model=model_id, messages=USER, max_tokens=2, temperature=0)
    assert r.choices[0].message.content is not None
    deadline = time.time() + 30
    while cancelled() <= before and time.time() < deadline:
        time.sleep(0.1)
    assert cancelled() > before
    assert time.time() - t0 < 60


# ------------------------------------------------------------------ errors --

def test_bad_json_is_400():
    status, _, body = raw("POST", "/v1/chat/completions", b"{not json")
    assert status == 400
    assert error_of(body)["type"] == "invalid_request_error"


def test_bad_field_is_400_naming_it(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=USER, extra_body={"temperature": "hot"})
    assert e.value.status_code == 400
    assert error_of(e.value.response.content)["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=[{"role": "robot", "content": "x"}])
    assert error_of(e.value.response.content)["param"] == "messages[0].role"


def test_n_other_than_1_is_400(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=USER, n=2, max_tokens=2)
    assert error_of(e.value.response.content)["param"] == "n"


def test_max_tokens_over_the_limits_is_lowered_to_what_fits(client, model_id):
    # Agents ask for 16k-32k: the answer stops where the context ends
    # (the server under test runs with -c 1024), not with a 400.
    r = client.completions.create(
        model=model_id, prompt="word " * 1000, max_tokens=10_000_000, temperature=0
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 1024


def test_prompt_over_context_is_400(client, model_id):
    long = "word " * 20000
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": long}], max_tokens=2
        )
    err = error_of(e.value.response.content)
    assert err["code"] == "context_length_exceeded"
    assert err["param"] == "messages"


def test_oversized_body_is_413():
    body = json.dumps({"messages": [{"role": "user", "content": "x" * (5 << 20)}]}).encode()
    status, _, resp = raw("POST", "/v1/chat/completions", body)
    assert status == 413
    assert error_of(resp)["code"] == "request_too_large"


def test_wrong_or_missing_key_is_401(model_id):
    if not API_KEY or API_KEY == "sk-anything":
        pytest.skip("the server runs without --api-key")
    bad = openai.OpenAI(base_url=BASE_URL, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=model_id, messages=USER, max_tokens=1)
    assert e.value.status_code == 401
    assert error_of(e.value.response.content)["code"] == "invalid_api_key"
    status, _, body = raw("GET", "/v1/models", key=None)
    assert status == 401
    error_of(body)


def test_unknown_route_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.get("/nope", cast_to=object)
    status, _, body = raw("POST", "/v1/nope", b"{}")
    assert status == 404
    assert error_of(body)["code"] == "unknown_url"


def test_metrics(client, model_id):
    client.chat.completions.create(model=model_id, messages=USER, max_tokens=1, temperature=0)
    status, headers, body = raw("GET", "/metrics")
    assert status == 200
    text = body.decode()
    for name in [
        'redlite_requests_total{endpoint="/v1/chat/completions",status="200"}',
        'redlite_requests_total{endpoint="/v1/chat/completions",status="400"}',
        "redlite_prompt_tokens_total",
        "redlite_generated_tokens_total",
        'redlite_prompt_tokens_per_second{window="last"}',
        'redlite_decode_tokens_per_second{window="last"}',
        "redlite_queue_depth",
        "redlite_kv_cache_tokens",
        "redlite_kv_cache_usage_ratio",
        "redlite_prompt_cache_checkpoints",
    ]:
        assert name in text, name
