"""Constrained decoding through the official `openai` client: every output
under `response_format: json_schema` must validate against its schema with
the `jsonschema` package (an independent validator), `json_object` must be a
JSON object, `grammar` (GBNF, llama-server's extension) must match, and a
forced `tool_choice` must give a call of an offered tool whose arguments
validate against that tool's parameters.

The demo model is small: strings get a `maxLength` so outputs end within
`max_tokens`; each schema runs greedy and sampled.
"""

import json

import jsonschema
import openai
import pytest

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "color": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "bright": {"type": "boolean"},
        },
        "required": ["color", "bright"],
    },
    "shopping": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "string", "maxLength": 20},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
    "city": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "location": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"],
            },
            "population": {"type": ["integer", "null"]},
        },
        "required": ["city", "location"],
    },
    "result": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"ok": {"const": True}, "value": {"type": "integer"}},
                "required": ["ok", "value"],
            },
            {
                "type": "object",
                "properties": {"ok": {"const": False}, "error": {"type": "string", "maxLength": 40}},
                "required": ["ok", "error"],
            },
        ]
    },
    # A `$ref` into `$defs` (recursive schemas are covered by the grammar
    # crate's tests: a greedy 0.5B model nests them past any token budget).
    "plan": {
        "$defs": {
            "step": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 30},
                    "minutes": {"type": "integer"},
                },
                "required": ["title"],
            }
        },
        "type": "object",
        "properties": {
            "plan": {"type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 1, "maxItems": 3}
        },
        "required": ["plan"],
    },
    "triple": {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3},
    "code": {
        "type": "object",
        "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 5}},
        "required": ["code"],
    },
}

PROMPTS = {
    "person": "Give me a made-up person as JSON.",
    "color": "Pick a color as JSON.",
    "shopping": "Write a short shopping list as JSON.",
    "city": "Describe Paris as JSON.",
    "result": "Report the result of 2+2 as JSON.",
    "plan": "Plan making tea as JSON.",
    "triple": "Three prime numbers as a JSON array.",
    "code": "Invent a short product code as JSON.",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]


def ask(client, model_id, name, **sampling):
    return client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": PROMPTS[name]}],
        max_tokens=300,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True},
        },
        **sampling,
    )


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_json_schema_outputs_validate(client, model_id, name, mode):
    sampling = {"temperature": 0} if mode == "greedy" else {"temperature": 1.0, "seed": 11}
    r = ask(client, model_id, name, **sampling)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", (name, text)
    value = json.loads(text)
    jsonschema.validate(value, SCHEMAS[name])


def test_json_object_mode(client, model_id):
    r = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Describe a cat in JSON."}],
        max_tokens=120,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_gbnf_grammar_extension(client, model_id):
    for endpoint in ("chat", "completions"):
        if endpoint == "chat":
            r = client.chat.completions.create(
                model=model_id,
                messages=[{"role": "user", "content": "Is the sky green?"}],
                max_tokens=10,
                temperature=0,
                extra_body={"grammar": 'root ::= ("yes" | "no") "."'},
            )
            text = r.choices[0].message.content
        else:
            r = client.completions.create(
                model=model_id,
                prompt="Is water wet? Answer:",
                max_tokens=10,
                temperature=0,
                extra_body={"grammar": 'root ::= " " ("yes" | "no") "."'},
            )
            text = r.choices[0].text
        assert text.strip() in ("yes.", "no."), (endpoint, text)
        assert r.choices[0].finish_reason == "stop"


def check_call(call, only=None):
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert call.type == "function"
    assert call.function.name in by_name, call.function.name
    if only:
        assert call.function.name == only
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, by_name[call.function.name])


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_tool_choice_required_gives_a_valid_call(client, model_id, mode):
    sampling = {"temperature": 0} if mode == "greedy" else {"temperature": 1.0, "seed": 5}
    r = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "What's the weather in Oslo?"}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=120,
        **sampling,
    )
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", m
    assert len(m.tool_calls) == 1, m
    check_call(m.tool_calls[0])


def test_named_tool_choice_gives_that_tool(client, model_id):
    r = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "What's the weather in Oslo?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=80,
        temperature=0,
    )
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", m
    assert len(m.tool_calls) == 1
    check_call(m.tool_calls[0], only="add")


def test_forced_tool_call_streams_valid_arguments(client, model_id):
    stream = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        stream=True,
    )
    name, args, finish = "", "", None
    for c in stream:
        if not c.choices:
            continue
        for tc in c.choices[0].delta.tool_calls or []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    jsonschema.validate(json.loads(args), by_name[name])


def bad_request(fn):
    with pytest.raises(openai.BadRequestError) as e:
        fn()
    return e.value.body.get("param") if isinstance(e.value.body, dict) else None


def test_bad_constraints_are_400s_naming_the_field(client, model_id):
    msgs = [{"role": "user", "content": "hi"}]
    bad_tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
    assert bad_request(lambda: client.chat.completions.create(
        model=model_id, messages=msgs, tools=bad_tools, max_tokens=2)) == "tools[0].function.parameters"
    assert bad_request(lambda: client.chat.completions.create(
        model=model_id, messages=msgs, max_tokens=2,
        extra_body={"grammar": "root ::= undefined-rule"})) == "grammar"
    assert bad_request(lambda: client.chat.completions.create(
        model=model_id, messages=msgs, max_tokens=2,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"x": {"type": "string", "pattern": "^a+$"}}}}},
    )) == "response_format.json_schema.schema.properties.x.pattern"
