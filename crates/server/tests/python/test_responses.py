"""The official `openai` client's Responses API against `redlite serve`.

Every response and stream event is also validated strictly against the
client's own pydantic types (`model_validate`): the client builds its
objects without validation, so this is what proves the shapes are right.
Generations are short and greedy; the 0.5B demo model's wit is not tested.
"""

import json
import typing

import openai
import pytest
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseStreamEvent,
)

from conftest import error_of, raw

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}

# Event type -> the client's class for it.
EVENT_TYPES = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def strict(resp) -> Response:
    """Validate a response object against the client's types."""
    return Response.model_validate(resp.model_dump(mode="json", exclude_unset=True))


def test_plain(client, model_id):
    r = client.responses.create(
        model=model_id, input="Say hello.", max_output_tokens=8, temperature=0,
        instructions="Answer in English.",
    )
    strict(r)
    assert r.object == "response"
    assert r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert r.instructions == "Answer in English."
    assert isinstance(r.output[0], ResponseOutputMessage)
    assert r.output_text.strip()
    assert 0 < r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # The raw body validates too (what a client without the SDK reads).
    status, _, body = raw("POST", "/v1/responses", json.dumps(
        {"input": "Say hello.", "max_output_tokens": 8, "temperature": 0}).encode())
    assert status == 200, body
    Response.model_validate(json.loads(body))


def test_stream_event_sequence(client, model_id):
    events = list(client.responses.create(
        model=model_id, input="Count to three.", max_output_tokens=12, temperature=0,
        stream=True,
    ))
    types = [e.type for e in events]
    for e in events:
        # The client picked the class named by `type`; it validates strictly.
        cls = EVENT_TYPES[e.type]
        assert isinstance(e, cls), (e.type, type(e))
        cls.model_validate(e.model_dump(mode="json", exclude_unset=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", types[-1]]
    assert types[-1] in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = strict(events[-1].response)
    assert deltas == done.text == final.output_text
    assert deltas
    # The whole answer is the same text (greedy).
    whole = client.responses.create(
        model=model_id, input="Count to three.", max_output_tokens=12, temperature=0)
    assert whole.output_text == deltas


def test_stream_helper(client, model_id):
    with client.responses.stream(
        model=model_id, input="Say hi.", max_output_tokens=24, temperature=0,
    ) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    strict(final)
    assert final.output_text == text


def test_function_call_and_follow_up(client, model_id):
    r = client.responses.create(
        model=model_id,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        # A named function (the prompt starts the call; `required` needs
        # constrained decoding for a model this small to follow it).
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=48,
        temperature=0,
    )
    strict(r)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls, r.output
    call = calls[0]
    assert isinstance(call, ResponseFunctionToolCall)
    assert call.name == "get_weather"
    assert call.call_id.startswith("call_")
    assert r.tools[0].name == "get_weather"
    assert json.loads(call.arguments).get("city"), call.arguments

    # The follow-up: the tool's output, continuing the stored conversation.
    r2 = client.responses.create(
        model=model_id,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": "Sunny, 21 degrees."}],
        tools=[WEATHER],
        max_output_tokens=24,
        temperature=0,
    )
    strict(r2)
    assert r2.previous_response_id == r.id
    assert r2.output_text.strip() or any(o.type == "function_call" for o in r2.output)
    # The first prompt and its answer are a prefix of this prompt, token
    # for token: the engine resumed from its checkpoint (all but at most
    # the last sampled token, which is never fed back).
    prev = r.usage.input_tokens + r.usage.output_tokens
    assert r2.usage.input_tokens_details.cached_tokens >= prev - 1, r2.usage
    assert r2.usage.input_tokens > r.usage.input_tokens

    # The same turn sent as a whole history (no stored state): the items
    # a client echoes back, function_call included.
    r3 = client.responses.create(
        model=model_id,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id,
             "output": "Sunny, 21 degrees."},
        ],
        tools=[WEATHER],
        max_output_tokens=24,
        temperature=0,
        store=False,
    )
    strict(r3)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r3.id)


def test_stream_function_call_events(client, model_id):
    events = list(client.responses.create(
        model=model_id, input="Weather in Oslo?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=48, temperature=0, stream=True,
    ))
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    args = "".join(e.delta for e in events
                   if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == args
    json.loads(args)
    final = strict(events[-1].response)
    assert final.output[0].arguments == args


def test_text_follow_up_reuses_the_prompt_cache(client, model_id):
    r1 = client.responses.create(
        model=model_id, input="My name is Ada. Remember it.", max_output_tokens=12,
        temperature=0,
    )
    r2 = client.responses.create(
        model=model_id, previous_response_id=r1.id, input="What is my name?",
        max_output_tokens=12, temperature=0,
    )
    strict(r2)
    # Everything up to the end of the first answer was computed already.
    prev = r1.usage.input_tokens + r1.usage.output_tokens
    assert r2.usage.input_tokens_details.cached_tokens >= prev - 1, r2.usage
    got = client.responses.retrieve(r1.id)
    assert got.id == r1.id and got.output_text == r1.output_text


def test_errors_name_the_field(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_id, input="x", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")
    for body, param in [
        ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
        ({"input": [{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]},
         "input[0].call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0].type"),
        ({"input": "x", "tools": [{"type": "shell_magic"}]}, "tools[0].type"),
        ({"input": "x", "temperature": 5}, "temperature"),
        ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
         "tool_choice"),
        ({}, "input"),
    ]:
        status, _, out = raw("POST", "/v1/responses", json.dumps(body).encode())
        assert status == 400, (body, out)
        assert error_of(out)["param"] == param, (body, out)
    # Unknown but harmless fields are accepted.
    status, _, out = raw("POST", "/v1/responses", json.dumps(
        {"input": "Hi", "max_output_tokens": 2, "user": "u", "truncation": "auto",
         "reasoning": {"effort": "low"}, "include": [], "service_tier": "auto",
         "prompt_cache_key": "k", "parallel_tool_calls": False}).encode())
    assert status == 200, out
