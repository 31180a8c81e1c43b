//! Encode/decode against ids from Hugging Face `tokenizers`
//! (scripts/make_tokenizer_fixtures.py).

mod common;

use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

fn corpus() -> Vec<Case> {
    let s = std::fs::read_to_string(common::fixture("qwen2_corpus.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

#[test]
fn encode_matches_hf_tokenizers() {
    let tok = common::qwen2();
    let cases = corpus();
    assert!(cases.len() > 300);
    let mut failures = Vec::new();
    for c in &cases {
        let got = tok.encode(&c.text, true);
        if got != c.ids {
            failures.push(format!(
                "text {:?}\n  want {:?}\n  got  {:?}",
                c.text, c.ids, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} mismatched:\n{}",
        failures.len(),
        cases.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

#[test]
fn decode_round_trips() {
    let tok = common::qwen2();
    for c in corpus() {
        assert_eq!(tok.decode(&c.ids), c.text);
    }
}

#[test]
fn stream_decoder_matches_decode() {
    let tok = common::qwen2();
    for c in corpus() {
        let mut dec = tok.stream_decoder();
        let mut s = String::new();
        for &id in &c.ids {
            s.push_str(&dec.push(id));
        }
        assert!(dec.pending().is_empty(), "{:?}", c.text);
        s.push_str(&dec.finish());
        assert_eq!(s, c.text);
    }
}
