//! Token masks over a small vocabulary: the trie walk with its cache must
//! allow exactly the tokens that a plain matcher accepts one by one, and
//! outputs sampled under the mask must be JSON that a validator written
//! here from the JSON Schema rules accepts.

use redlite_grammar::{gbnf, schema, Constraint, Matcher, Vocab};
use serde_json::{json, Value};
use std::sync::Arc;

const EOG: u32 = 0;

/// Every single byte (valid UTF-8 or not) and pieces like a BPE vocabulary's.
fn pieces() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![b"<eog>".to_vec()];
    v.extend((0u8..=255).map(|b| vec![b]));
    for s in [
        "{\"",
        "\":",
        "\": ",
        ", \"",
        "\"}",
        "\"},",
        " {",
        "\n  ",
        "\n",
        "  ",
        "true",
        "false",
        "null",
        "na",
        "me",
        "name",
        "\"name\"",
        "12",
        "345",
        "-",
        ".5",
        "e3",
        "é",
        "中文",
        "abc",
        "\"a",
        "a\"",
        "\", \"",
        "\"],",
        "[1",
        "]}",
        "[\"",
        "\"]",
        "0",
        "00",
        "1.",
        "{}",
        "[]",
        " ",
        "\"\"",
        "\\n",
        "\\u00",
        "ok",
        "tags",
        "\"tags\"",
        "\": [",
        "], ",
        "}\n",
        "x\":",
        "city",
        "\"city\": \"",
    ] {
        v.push(s.as_bytes().to_vec());
    }
    v.push(vec![0xe4, 0xb8]); // the first two bytes of 中
    v.push(vec![0xad, b'"']); // its last byte and a quote
    v
}

fn vocab(p: &[Vec<u8>]) -> Arc<Vocab> {
    Arc::new(Vocab::new(
        p.len(),
        |id| Some(p[id as usize].as_slice()),
        &[EOG],
    ))
}

/// A tiny seeded RNG (SplitMix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}}, "required": ["name", "age"]}),
        json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "ok"]}, "maxItems": 4}, "city": {"type": "string", "maxLength": 8}}, "required": ["tags"]}),
        json!({"type": "array", "items": {"type": ["number", "null", "boolean"]}, "minItems": 1, "maxItems": 5}),
        json!({"anyOf": [{"type": "string", "maxLength": 6}, {"type": "object", "properties": {"x": {"const": 1}}, "required": ["x"]}]}),
    ]
}

#[test]
fn cached_trie_masks_equal_token_by_token_matching() {
    let p = pieces();
    let v = vocab(&p);
    let mut rng = Rng(7);
    for s in schemas()
        .iter()
        .chain([json!({"type": "object", "additionalProperties": true})].iter())
    {
        let g = Arc::new(gbnf::parse(&schema::compile(s).unwrap()).unwrap());
        for _run in 0..4 {
            let mut c = Constraint::new(g.clone(), v.clone()).unwrap();
            let mut m = Matcher::new(g.clone()).unwrap();
            for _step in 0..60 {
                let mask = c.compute_mask().unwrap().to_vec();
                let mut allowed = Vec::new();
                for id in 0..p.len() as u32 {
                    let want = if id == EOG {
                        m.is_complete()
                    } else {
                        m.clone().advance(&p[id as usize]).unwrap()
                    };
                    let got = mask[id as usize / 64] >> (id % 64) & 1 == 1;
                    assert_eq!(
                        got,
                        want,
                        "{s}: token {:?}",
                        String::from_utf8_lossy(&p[id as usize])
                    );
                    if want {
                        allowed.push(id);
                    }
                }
                assert!(!allowed.is_empty());
                let pick = allowed[(rng.next() % allowed.len() as u64) as usize];
                if pick == EOG {
                    break;
                }
                assert!(c.accept_token(pick).unwrap());
                assert!(m.advance(&p[pick as usize]).unwrap());
            }
        }
    }
}

/// JSON Schema validation for the keywords the test schemas use, written
/// from the JSON Schema 2020-12 validation vocabulary.
fn valid(s: &Value, v: &Value) -> bool {
    if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
        return any.iter().any(|x| valid(x, v));
    }
    if let Some(c) = s.get("const") {
        return c == v;
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        return e.contains(v);
    }
    let type_ok = |t: &str| match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    };
    match s.get("type") {
        Some(Value::String(t)) if !type_ok(t) => return false,
        Some(Value::Array(ts)) if !ts.iter().any(|t| type_ok(t.as_str().unwrap())) => return false,
        _ => {}
    }
    if let (Some(max), Some(x)) = (s.get("maxLength").and_then(Value::as_u64), v.as_str()) {
        if x.chars().count() as u64 > max {
            return false;
        }
    }
    if let Some(a) = v.as_array() {
        let n = a.len() as u64;
        if s.get("minItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| n < m)
            || s.get("maxItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
        {
            return false;
        }
        if let Some(items) = s.get("items") {
            return a.iter().all(|x| valid(items, x));
        }
    }
    if let Some(o) = v.as_object() {
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !o.contains_key(r.as_str().unwrap()) {
                return false;
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) if !valid(ps, x) => return false,
                Some(_) => {}
                None if s.get("additionalProperties") != Some(&json!(true)) => return false,
                None => {}
            }
        }
    }
    true
}

#[test]
fn sampled_outputs_are_valid_json_of_the_schema() {
    let p = pieces();
    let v = vocab(&p);
    let mut rng = Rng(42);
    let mut finished = 0;
    for s in schemas() {
        let g = Arc::new(gbnf::parse(&schema::compile(&s).unwrap()).unwrap());
        for _ in 0..40 {
            let mut c = Constraint::new(g.clone(), v.clone()).unwrap();
            let mut out = Vec::new();
            let mut done = false;
            for _ in 0..400 {
                // Random logits, with EOG favoured so outputs end.
                let mut logits: Vec<f32> = (0..p.len()).map(|_| rng.f32()).collect();
                logits[EOG as usize] += 0.5;
                c.apply(&mut logits).unwrap();
                let pick = (0..logits.len())
                    .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                    .unwrap() as u32;
                assert!(c.accept_token(pick).unwrap());
                if pick == EOG {
                    done = true;
                    break;
                }
                out.extend_from_slice(&p[pick as usize]);
            }
            if !done {
                continue;
            }
            finished += 1;
            let text = String::from_utf8(out).expect("UTF-8");
            let val: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(valid(&s, &val), "{s} rejects {text}");
        }
    }
    assert!(finished >= 100, "only {finished} outputs ended");
}

#[test]
fn eog_only_when_complete_and_control_tokens_never() {
    let p = pieces();
    let mut v: Vec<Option<&[u8]>> = p.iter().map(|x| Some(x.as_slice())).collect();
    v[1] = None; // a control token: never produced
    let vocab = Arc::new(Vocab::new(p.len(), |id| v[id as usize], &[EOG]));
    let g = Arc::new(gbnf::parse("root ::= [\\x00-\\x7F] \"ab\"?").unwrap());
    let mut c = Constraint::new(g, vocab).unwrap();
    let m = c.compute_mask().unwrap().to_vec();
    let bit = |m: &[u64], i: usize| m[i / 64] >> (i % 64) & 1 == 1;
    assert!(!bit(&m, EOG as usize) && !bit(&m, 1) && bit(&m, 2));
    assert!(c.accept_token(b'x' as u32 + 1).unwrap());
    let m = c.compute_mask().unwrap().to_vec();
    assert!(bit(&m, EOG as usize), "complete after one character");
    assert!(
        !c.accept_token(b'x' as u32 + 1).unwrap(),
        "refused, state kept"
    );
    assert!(c.accept_token(b'a' as u32 + 1).unwrap());
    let m = c.compute_mask().unwrap().to_vec();
    assert!(!bit(&m, EOG as usize));
    assert!(c.accept_token(b'b' as u32 + 1).unwrap());
    assert!(c.is_finished());
    let mut logits = vec![1.0f32; p.len()];
    c.apply(&mut logits).unwrap();
    assert!(logits
        .iter()
        .enumerate()
        .all(|(i, &l)| (i == EOG as usize) == (l > f32::NEG_INFINITY)));
}
