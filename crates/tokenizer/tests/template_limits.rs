//! Chat templates come from model files, so rendering is bounded: a step
//! (fuel) limit and an output-size limit, each a clear error; a template
//! that does not parse is an error naming `tokenizer.chat_template`.

mod common;

use redlite_gguf::Metadata;
use redlite_tokenizer::{ChatMessage, ChatTemplate, TokenizerError, DEFAULT_FUEL};
use std::time::{Duration, Instant};

fn conversation(n: usize) -> Vec<ChatMessage> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                ChatMessage::user(format!("question {i}"))
            } else {
                ChatMessage::assistant(format!("answer {i}"))
            }
        })
        .collect()
}

#[test]
fn an_unbounded_loop_runs_out_of_fuel_quickly() {
    // 10^10 iterations without a limit (the template ran for 10
    // minutes before it was killed).
    let t = ChatTemplate::new(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    )
    .unwrap();
    let start = Instant::now();
    let e = t.render(&[], None, true, None).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let msg = e.to_string();
    assert!(msg.starts_with("chat template: "), "{msg}");
    assert!(msg.contains("more than 20000000 template steps"), "{msg}");
}

#[test]
fn a_huge_output_is_refused_at_the_limit() {
    // 100 MB of output in about half a million steps: within the fuel.
    let t = ChatTemplate::new("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}").unwrap();
    let e = t.render(&[], None, true, None).unwrap_err();
    assert!(
        e.to_string().contains("over the limit of 16777216 bytes"),
        "{e}"
    );
    // Under a larger explicit limit the same template renders in full.
    let t = t.with_limits(DEFAULT_FUEL, 200 << 20);
    assert_eq!(t.render(&[], None, true, None).unwrap().len(), 100_000_000);
}

#[test]
fn the_qwen_template_renders_long_conversations_within_the_defaults() {
    let t = common::qwen2_template();
    let out = t.render(&conversation(4000), None, true, None).unwrap();
    assert!(out.contains("answer 3999"));
    // ... and the fuel does apply to it: 4000 messages need more than
    // 10000 steps.
    let small = common::qwen2_template().with_limits(10_000, usize::MAX);
    let e = small
        .render(&conversation(4000), None, true, None)
        .unwrap_err();
    assert!(
        e.to_string().contains("more than 10000 template steps"),
        "{e}"
    );
}

#[test]
fn a_template_that_does_not_parse_names_the_key() {
    let mut m = Metadata::new();
    m.insert(
        "tokenizer.chat_template",
        "{% for m in messages %}{{ m.content }",
    );
    let e = ChatTemplate::from_gguf(&m).unwrap_err();
    assert!(
        matches!(
            e,
            TokenizerError::Invalid {
                key: "tokenizer.chat_template",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("does not parse"), "{e}");
    // Absent is a different error (callers treat it as "no template").
    let e = ChatTemplate::from_gguf(&Metadata::new()).unwrap_err();
    assert!(matches!(e, TokenizerError::MissingKey { .. }), "{e:?}");
}
