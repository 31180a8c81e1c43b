"""Forced tool calls on the Responses and Messages APIs, through the official
`openai` (`responses.create`) and `anthropic` clients: `tool_choice`
`required` / `{"type": "any"}` and a named function / `{"type": "tool"}`
must give one call of an offered tool whose arguments validate against its
schema with the `jsonschema` package, whole and streamed, greedy and
sampled (the grammar holds the call, as on /v1/chat/completions).

Responses and events are also validated against the clients' own types.
"""

import json

import anthropic
import jsonschema
import pytest
from anthropic.types import Message
from openai.types.responses import Response

from conftest import API_KEY, BASE_URL

ROOT = BASE_URL.rsplit("/v1", 1)[0]

PARAMS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
    "add": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}
DESCRIPTIONS = {"get_weather": "Get the current weather in a city.", "add": "Add two integers."}

OPENAI_TOOLS = [
    {"type": "function", "name": n, "description": DESCRIPTIONS[n], "parameters": p}
    for n, p in PARAMS.items()
]
ANTHROPIC_TOOLS = [
    {"name": n, "description": DESCRIPTIONS[n], "input_schema": p} for n, p in PARAMS.items()
]

SAMPLING = {"greedy": {"temperature": 0}, "sampled": {"temperature": 0.7}}


def check(name: str, args: dict, only: str | None = None):
    assert name in PARAMS, name
    if only:
        assert name == only
    jsonschema.validate(args, PARAMS[name])


@pytest.fixture(scope="module")
def claude() -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=ROOT, api_key=API_KEY, max_retries=0, timeout=300)


def responses_calls(client, model_id, choice, mode, stream):
    args = dict(model=model_id, input="What's the weather in Oslo? Then add 2 and 3.",
                tools=OPENAI_TOOLS, tool_choice=choice, max_output_tokens=120,
                **SAMPLING[mode])
    if stream:
        events = list(client.responses.create(**args, stream=True))
        r = events[-1].response
        assert events[-1].type == "response.completed", events[-1]
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [d.arguments for d in done] == [o.arguments for o in r.output
                                               if o.type == "function_call"]
    else:
        r = client.responses.create(**args)
    Response.model_validate(r.model_dump(mode="json", exclude_unset=True))
    assert r.status == "completed", r
    return [o for o in r.output if o.type == "function_call"]


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_responses_required(client, model_id, mode, stream):
    calls = responses_calls(client, model_id, "required", mode, stream)
    assert len(calls) == 1, calls
    check(calls[0].name, json.loads(calls[0].arguments))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_responses_named(client, model_id, stream):
    calls = responses_calls(client, model_id, {"type": "function", "name": "add"}, "greedy",
                            stream)
    assert len(calls) == 1, calls
    check(calls[0].name, json.loads(calls[0].arguments), only="add")


def messages_uses(claude, model_id, choice, mode, stream):
    args = dict(model=model_id, max_tokens=120, extra_body=SAMPLING[mode],
                messages=[{"role": "user",
                           "content": "What's the weather in Oslo? Then add 2 and 3."}],
                tools=ANTHROPIC_TOOLS, tool_choice=choice)
    if stream:
        # The client accumulates input_json_delta into each block's input.
        with claude.messages.stream(**args) as s:
            m = s.get_final_message()
    else:
        m = claude.messages.create(**args)
    Message.model_validate(m.model_dump(mode="json", exclude_unset=True))
    assert m.stop_reason == "tool_use", m
    return [b for b in m.content if b.type == "tool_use"]


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_messages_any(claude, model_id, mode, stream):
    uses = messages_uses(claude, model_id, {"type": "any"}, mode, stream)
    assert len(uses) == 1, uses
    check(uses[0].name, uses[0].input)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_messages_named(claude, model_id, stream):
    uses = messages_uses(claude, model_id, {"type": "tool", "name": "add"}, "greedy", stream)
    assert len(uses) == 1, uses
    check(uses[0].name, uses[0].input, only="add")
