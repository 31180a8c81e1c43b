"""The official `anthropic` client against `redlite serve`'s /v1/messages.

Messages and stream events are also validated strictly against the
client's pydantic types (the client builds its objects without
validation). Generations are short and greedy.
"""

import json

import anthropic
import pytest
from anthropic.types import Message, MessageTokensCount, TextBlock, ToolUseBlock

from conftest import API_KEY, BASE_URL, raw

ROOT = BASE_URL.rsplit("/v1", 1)[0]

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# This client version has no sampling parameters; the API (and the server)
# takes them in the body.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def claude() -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=ROOT, api_key=API_KEY, max_retries=0, timeout=300)


def strict(m) -> Message:
    return Message.model_validate(m.model_dump(mode="json", exclude_unset=True))


def sse_events(body: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of a raw SSE body."""
    out = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_plain(claude, model_id):
    m = claude.messages.create(
        model=model_id, max_tokens=8, extra_body=GREEDY,
        system="Answer in English.",
        messages=[{"role": "user", "content": "Say hello."}],
    )
    strict(m)
    assert m.type == "message" and m.role == "assistant"
    assert m.id.startswith("msg_")
    assert isinstance(m.content[0], TextBlock) and m.content[0].text.strip()
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert 0 < m.usage.output_tokens <= 8
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0


def test_stream_helper_and_raw_events(claude, model_id):
    args = dict(model=model_id, max_tokens=12, extra_body=GREEDY,
                messages=[{"role": "user", "content": "Count to three."}])
    body = {k: v for k, v in args.items() if k != "extra_body"} | GREEDY
    with claude.messages.stream(**args) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    strict(final)
    assert text and final.content[0].text == text
    whole = claude.messages.create(**args)
    assert whole.content[0].text == text

    # The raw stream: Anthropic's documented event order, each event's
    # data validated by the client's type for it.
    status, headers, body = raw("POST", "/v1/messages", json.dumps({**body, "stream": True}).encode())
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse_events(body)
    names = [e for e, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    from anthropic.types import (RawContentBlockDeltaEvent, RawContentBlockStartEvent,
                                 RawContentBlockStopEvent, RawMessageDeltaEvent,
                                 RawMessageStartEvent, RawMessageStopEvent)
    types = {"message_start": RawMessageStartEvent, "content_block_start": RawContentBlockStartEvent,
             "content_block_delta": RawContentBlockDeltaEvent,
             "content_block_stop": RawContentBlockStopEvent,
             "message_delta": RawMessageDeltaEvent, "message_stop": RawMessageStopEvent}
    for name, data in events:
        assert data["type"] == name
        if name in types:
            types[name].model_validate(data)
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert delta["usage"]["output_tokens"] == final.usage.output_tokens


def test_tool_use_round_trip(claude, model_id):
    m = claude.messages.create(
        model=model_id, max_tokens=48, extra_body=GREEDY, messages=ASK, tools=[WEATHER],
        # A named tool (the prompt starts the call; `any` needs constrained
        # decoding for a model this small to follow it).
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    strict(m)
    assert m.stop_reason == "tool_use", m
    use = next(b for b in m.content if b.type == "tool_use")
    assert isinstance(use, ToolUseBlock)
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    assert isinstance(use.input, dict) and use.input.get("city"), use.input

    follow = claude.messages.create(
        model=model_id, max_tokens=24, extra_body=GREEDY, tools=[WEATHER],
        messages=ASK + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 degrees."}]},
        ],
    )
    strict(follow)
    assert follow.content, follow
    assert follow.usage.input_tokens + (follow.usage.cache_read_input_tokens or 0) > \
        m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)

    # Streamed: the client accumulates input_json_delta into the input.
    with claude.messages.stream(
        model=model_id, max_tokens=48, extra_body=GREEDY, messages=ASK, tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as s:
        final = s.get_final_message()
    strict(final)
    streamed = next(b for b in final.content if b.type == "tool_use")
    assert streamed.input == use.input
    assert final.stop_reason == "tool_use"


def test_stop_sequences(claude, model_id):
    m = claude.messages.create(
        model=model_id, max_tokens=40, extra_body=GREEDY, stop_sequences=["4"],
        messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
    )
    strict(m)
    assert m.stop_reason == "stop_sequence", m
    assert m.stop_sequence == "4"
    assert "4" not in m.content[0].text


def test_count_tokens(claude, model_id):
    c = claude.messages.count_tokens(model=model_id, messages=ASK, tools=[WEATHER])
    MessageTokensCount.model_validate(c.model_dump())
    m = claude.messages.create(model=model_id, max_tokens=1, extra_body=GREEDY, messages=ASK,
                               tools=[WEATHER])
    assert c.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_errors_have_anthropics_shape(claude, model_id):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=model_id, max_tokens=0, messages=ASK)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in e.value.body["error"]["message"]
    bad = anthropic.Anthropic(base_url=ROOT, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=model_id, max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
    for body, field in [
        ({"messages": ASK}, "max_tokens"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
         "messages[0].content[0].type"),
        ({"max_tokens": 4, "messages": ASK, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"max_tokens": 4, "messages": ASK, "temperature": "hot"}, "temperature"),
        ({"max_tokens": 4, "messages": ASK, "tool_choice": {"type": "sometimes"}},
         "tool_choice.type"),
    ]:
        status, _, out = raw("POST", "/v1/messages", json.dumps(body).encode())
        assert status == 400, (body, out)
        err = json.loads(out)
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
        assert field in err["error"]["message"], (field, err)
