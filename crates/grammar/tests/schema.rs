//! JSON Schema compilation: each schema with values it must accept and
//! reject, by the JSON Schema 2020-12 validation rules (and, for what the
//! compiler chooses to leave out, its documented choices: no undeclared
//! keys unless `additionalProperties` allows them).

use redlite_grammar::{gbnf, schema, Matcher};
use serde_json::json;
use std::sync::Arc;

fn check(s: serde_json::Value, yes: &[&str], no: &[&str]) {
    let text = schema::compile(&s).unwrap_or_else(|e| panic!("{e}"));
    let g = Arc::new(gbnf::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}")));
    for v in yes {
        assert!(
            Matcher::matches(&g, v).unwrap(),
            "{s} should accept {v}\n{text}"
        );
    }
    for v in no {
        assert!(
            !Matcher::matches(&g, v).unwrap(),
            "{s} should reject {v}\n{text}"
        );
    }
}

#[test]
fn objects_required_optional_and_additional() {
    let s = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["name"]});
    check(
        s,
        &[
            r#"{"name": "Bo"}"#,
            r#"{"name":"Bo","age":3}"#,
            r#"{"name": "Bo", "ok": true}"#,
            "{\n  \"name\": \"B\\\"o\",\n  \"age\": -12,\n  \"ok\": false\n}",
        ],
        &[
            r#"{"age": 3}"#,
            r#"{"name": 3}"#,
            r#"{"name": "Bo", "x": 1}"#,
            r#"{"name": "Bo",}"#,
            r#"{"name": "Bo", "age": 1.5}"#,
            r#"{"name": "Bo""#,
            r#"{"name": "Bo"} x"#,
        ],
    );
    let s = json!({"type": "object", "properties": {"a": {"type": "number"}},
        "additionalProperties": {"type": "string"}});
    check(
        s,
        &[
            "{}",
            r#"{"a": 1e5}"#,
            r#"{"a": 1, "b": "x", "c": "y"}"#,
            r#"{"b": "x"}"#,
            r#"{"ab": "x", "": "y"}"#,
        ],
        &[r#"{"b": 1}"#, r#"{"a": "x"}"#],
    );
    check(
        json!({"type": "object", "additionalProperties": true}),
        &["{}", r#"{"k": [1, {"z": null}]}"#],
        &["[]"],
    );
}

#[test]
fn arrays_strings_enums_consts_and_types() {
    check(
        json!({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}),
        &["[1]", "[1, 2, 3]", "[ 0 ]"],
        &["[]", "[1,2,3,4]", "[1.5]", "[01]"],
    );
    check(json!({"type": "array", "maxItems": 0}), &["[]"], &["[1]"]);
    check(
        json!({"type": "array", "minItems": 2}),
        &["[1, \"a\"]", "[[], {}, null]"],
        &["[1]"],
    );
    check(
        json!({"type": "string", "minLength": 2, "maxLength": 3}),
        &[r#""ab""#, r#""abc""#, r#""é\n""#],
        &[r#""a""#, r#""abcd""#],
    );
    check(
        json!({"enum": ["red", "green", 3, null]}),
        &[r#""red""#, "3", "null"],
        &[r#""blue""#, "4", r#""Red""#],
    );
    check(
        json!({"const": {"a": [1, "x"]}}),
        &[r#"{"a":[1,"x"]}"#],
        &[r#"{"a": [1, "x"]}"#, "1"],
    );
    check(
        json!({"type": ["string", "null"]}),
        &[r#""x""#, "null"],
        &["1", "true"],
    );
    check(
        json!({"type": "number"}),
        &["0", "-1.25", "3e10", "2E-3"],
        &["01", "1.", ".5", "+1", "NaN"],
    );
    check(
        json!({"type": "boolean"}),
        &["true", "false"],
        &["True", "1"],
    );
    check(
        json!({}),
        &["1", "\"s\"", "[{}]", "null"],
        &["", "nul", "{a: 1}"],
    );
    // Control characters must be escaped inside strings (RFC 8259).
    check(
        json!({"type": "string"}),
        &[r#""a\tb\u00e9""#],
        &["\"a\tb\"", r#""\x""#],
    );
}

#[test]
fn any_of_one_of_and_refs() {
    check(
        json!({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}]}),
        &["5", r#"{"x": "y"}"#],
        &[r#""5""#, "{}"],
    );
    check(
        json!({"type": "object", "properties": {"v": {"oneOf": [{"type": "boolean"}, {"type": "null"}]}}, "required": ["v"]}),
        &[r#"{"v": null}"#, r#"{"v": true}"#],
        &[r#"{"v": 0}"#],
    );
    // A recursive tree through $defs, and the older `definitions`.
    let tree = json!({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"]}}});
    check(
        tree,
        &[
            r#"{"v": 1}"#,
            r#"{"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3}]}"#,
        ],
        &[r#"{"v": 1, "kids": [{}]}"#],
    );
    check(
        json!({"definitions": {"c": {"enum": ["a", "b"]}}, "type": "array", "items": {"$ref": "#/definitions/c"}}),
        &[r#"["a", "b", "a"]"#],
        &[r#"["c"]"#],
    );
}

#[test]
fn unsupported_keywords_are_refused_with_their_path() {
    let e = schema::compile(&json!({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}})).unwrap_err();
    assert_eq!(e.path, "properties.code.pattern");
    let e = schema::compile(&json!({"type": "integer", "minimum": 1})).unwrap_err();
    assert_eq!(e.path, "minimum");
    let e = schema::compile(&json!({"$ref": "#/components/x"})).unwrap_err();
    assert_eq!(e.path, "$ref");
    let e = schema::compile(&json!({"type": "strin"})).unwrap_err();
    assert!(e.message.contains("unknown type"), "{e}");
    let e = schema::compile(&json!({"type": "array", "items": [{"type": "string"}]})).unwrap_err();
    assert_eq!(e.path, "items");
    assert!(schema::compile(&json!(false)).is_err());
    assert!(schema::compile(&json!("object")).is_err());
    let e = schema::compile(&json!({"type": "string", "maxLength": -1})).unwrap_err();
    assert_eq!(e.path, "maxLength");
}

#[test]
fn whitespace_is_bounded() {
    let g = Arc::new(gbnf::parse(&schema::json_object_grammar()).unwrap());
    assert!(Matcher::matches(&g, &format!("{{\n{}\"a\": 1}}", " ".repeat(20))).unwrap());
    assert!(!Matcher::matches(&g, &format!("{{\n{}\"a\": 1}}", " ".repeat(21))).unwrap());
    assert!(!Matcher::matches(&g, "{  \"a\": 1}").unwrap());
    assert!(
        !Matcher::matches(&g, "[1]").unwrap(),
        "json_object mode wants an object"
    );
}
