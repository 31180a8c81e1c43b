//! The streaming parser: the same result however the text is split.

use super::*;

fn parse_split(text: &str, split: usize, tools: bool, think: bool) -> Collected {
    let mut p = ChatParser::new(tools, think, false);
    let mut c = Collected::default();
    let chars: Vec<char> = text.chars().collect();
    for chunk in chars.chunks(split.max(1)) {
        c.add(p.push(&chunk.iter().collect::<String>()));
    }
    c.add(p.finish());
    c
}

/// The same result for every way of splitting the text.
fn parse_all(text: &str, tools: bool, think: bool) -> Collected {
    let whole = parse_split(text, usize::MAX, tools, think);
    for split in 1..12 {
        assert_eq!(
            parse_split(text, split, tools, think),
            whole,
            "split {split}"
        );
    }
    whole
}

#[test]
fn calls_of_tools_never_offered_stay_text() {
    let text = "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {\"path\": \"/\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"ok\", \"arguments\": {}}\n</tool_call>";
    let whole = {
        let mut p = ChatParser::new(true, false, false).with_tool_names(vec!["ok".into()]);
        let mut c = Collected::default();
        c.add(p.push(text));
        c.add(p.finish());
        c
    };
    for split in 1..9 {
        let mut p = ChatParser::new(true, false, false).with_tool_names(vec!["ok".into()]);
        let mut c = Collected::default();
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(split) {
            c.add(p.push(&chunk.iter().collect::<String>()));
        }
        c.add(p.finish());
        assert_eq!(c, whole, "split {split}");
    }
    assert_eq!(whole.calls, vec![("ok".to_string(), "{}".to_string())]);
    assert!(
        whole.content.contains("rm_rf") && whole.content.starts_with("<tool_call>"),
        "{:?}",
        whole.content
    );
    // A bare JSON call of an unknown tool is text too.
    let mut p = ChatParser::new(true, false, false).with_tool_names(vec!["ok".into()]);
    let mut c = Collected::default();
    c.add(p.push("{\"name\": \"nope\", \"arguments\": {}}"));
    c.add(p.finish());
    assert!(c.calls.is_empty() && c.content.contains("nope"), "{c:?}");
}

#[test]
fn plain_text_passes_through() {
    let c = parse_all("Hello, <b>world</b> < x", true, true);
    assert_eq!(c.content, "Hello, <b>world</b> < x");
    assert!(c.calls.is_empty());
}

#[test]
fn qwen_tool_call() {
    let text = "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": {\"c\": true}}}\n</tool_call>";
    let c = parse_all(text, true, true);
    assert_eq!(c.content, "I'll check.");
    assert_eq!(c.calls.len(), 1);
    assert_eq!(c.calls[0].0, "get_weather");
    let args: serde_json::Value = serde_json::from_str(&c.calls[0].1).unwrap();
    assert_eq!(
        args,
        serde_json::json!({"city": "Paris", "unit": {"c": true}})
    );
}

#[test]
fn two_calls_and_no_content() {
    let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": \"}\"}}\n</tool_call>";
    let c = parse_all(text, true, false);
    assert_eq!(c.content, "");
    assert_eq!(
        c.calls,
        vec![
            ("a".to_string(), "{}".to_string()),
            ("b".to_string(), "{\"x\": \"}\"}".to_string())
        ]
    );
}

#[test]
fn name_comes_before_arguments_when_streamed() {
    let mut p = ChatParser::new(true, false, false);
    let mut events = Vec::new();
    for piece in [
        "<tool_call>\n{\"name\": \"f",
        "oo\", \"arguments\": {\"q\"",
        ": 1}}\n</tool",
        "_call>",
    ] {
        events.extend(p.push(piece));
    }
    events.extend(p.finish());
    assert_eq!(
        events[0],
        Parsed::ToolCallStart {
            index: 0,
            name: "foo".into()
        }
    );
    let args: String = events[1..]
        .iter()
        .map(|e| match e {
            Parsed::ToolCallArgs { index: 0, text } => text.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(args, "{\"q\": 1}");
    assert!(events.len() >= 3, "arguments came in more than one chunk");
}

#[test]
fn arguments_first_or_string_arguments() {
    let c = parse_all(
        "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>",
        true,
        false,
    );
    assert_eq!(c.calls, vec![("f".into(), "{\"a\":1}".into())]);
}

#[test]
fn broken_call_is_text() {
    let c = parse_all("<tool_call>not json</tool_call> ok", true, false);
    assert_eq!(c.content, "<tool_call>not json</tool_call>ok");
    assert!(c.calls.is_empty());
    let c = parse_all("x <tool_call>{\"na", true, false);
    assert_eq!(c.content, "x<tool_call>{\"na");
}

#[test]
fn tools_off_leaves_tags() {
    let t = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    assert_eq!(parse_all(t, false, true).content, t);
}

#[test]
fn thinking_is_reasoning() {
    let c = parse_all("<think>\nLet me see.\n</think>\n\nIt is 4.", false, true);
    assert_eq!(c.reasoning, "Let me see.");
    assert_eq!(c.content, "It is 4.");
    // The template opened the block already.
    let mut p = ChatParser::new(false, true, true);
    let mut c = Collected::default();
    c.add(p.push("\nhmm</th"));
    c.add(p.push("ink>\n\nyes"));
    c.add(p.finish());
    assert_eq!(c.reasoning, "hmm");
    assert_eq!(c.content, "yes");
}

#[test]
fn think_then_tool_call() {
    let c = parse_all(
        "<think>need weather</think>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"Oslo\"}}\n</tool_call>",
        true,
        true,
    );
    assert_eq!(c.reasoning, "need weather");
    assert_eq!(c.content, "");
    assert_eq!(c.calls, vec![("w".into(), "{\"c\": \"Oslo\"}".into())]);
}

#[test]
fn bare_json_call_at_the_start() {
    let c = parse_all(
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
        true,
        false,
    );
    assert_eq!(c.content, "");
    assert_eq!(
        c.calls,
        vec![("get_weather".into(), "{\"city\": \"Paris\"}".into())]
    );
    // In a code fence, as the 0.5B demo model writes it.
    let c = parse_all(
        "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```",
        true,
        false,
    );
    assert_eq!(c.content, "");
    assert_eq!(c.calls.len(), 1);
    let args: serde_json::Value = serde_json::from_str(&c.calls[0].1).unwrap();
    assert_eq!(args, serde_json::json!({"city": "Paris"}));
}

#[test]
fn json_that_is_not_a_call_stays_content() {
    for t in [
        "```python\nprint({\"name\": 1})\n```",
        "{\"answer\": 42}",
        "Sure: {\"name\": \"x\", \"arguments\": {}}",
        "`x`",
        " ",
    ] {
        let c = parse_all(t, true, false);
        assert_eq!(c.content, t, "{t}");
        assert!(c.calls.is_empty(), "{t}");
    }
    // Without tools nothing is a call.
    let t = "{\"name\": \"f\", \"arguments\": {}}";
    assert_eq!(parse_all(t, false, false).content, t);
}

#[test]
fn unclosed_call_at_end_keeps_arguments() {
    let c = parse_all(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        true,
        false,
    );
    assert_eq!(c.calls, vec![("f".into(), "{\"a\": 1}".into())]);
}
