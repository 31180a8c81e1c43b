//! MTP speculative decoding through the server, on the tiny Qwen3-Next
//! fixture with an MTP block (its head checked against llama.cpp's MTP
//! graph in `crates/model/tests/mtp_fixture.rs`, the drafter's snapshot and
//! restore in `crates/spec/tests/mtp_wiring.rs`).
//!
//! Greedy answers with `--spec mtp` (and with a request's
//! `"speculative.type": "mtp"`) are the tokens of plain greedy decoding
//! (run here straight on the engine's sequence, and through a server
//! without speculation), over turns of one conversation whose later turns
//! resume from the prompt cache's end-of-turn checkpoint (also after turns
//! that draft with lookup or not at all), whole and streamed; `/metrics` counts the drafts proposed and kept. A resumed turn
//! drafts exactly what the same turn computed from scratch drafts (the
//! drafter was restored to the checkpoint's point). With `--state-dir`, the
//! MTP state saved beside a state file lets a restarted server resume an
//! MTP turn from the file; a corrupted one is skipped (the turn computes
//! its prefix). A file without the head is refused, naming the file and
//! the missing layer.

use redlite_engine::{BackendOptions, Engine, Logits, MemoryRequest, Model};
use redlite_model::sample::Sampler;
use redlite_model::sequence::Sequence;
use redlite_server::{spawn, RunningServer, ServeArgs};
use redlite_spec::SpecMode;
use redlite_tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const MTP_FILE: &str = "tiny-qwen3next-mtp-f32.gguf";
const CTX: usize = 256;
const MAX_TOKENS: usize = 40;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next-mtp")
        .join(name)
}

fn args(spec: SpecMode, prompt_cache: bool) -> ServeArgs {
    let mut args = ServeArgs::for_model(fixture(MTP_FILE));
    args.port = 0;
    args.ctx_size = CTX;
    args.no_warmup = true;
    args.no_prompt_cache = !prompt_cache;
    args.spec.spec = spec;
    args.spec.draft_max = 4;
    // Draft every step: the timing back-off would make the counts depend
    // on the machine.
    args.spec.spec_always = true;
    args
}

fn start(spec: SpecMode, prompt_cache: bool) -> RunningServer {
    spawn(args(spec, prompt_cache)).expect("start the server on the MTP fixture")
}

/// Plain greedy decoding straight on the engine's sequence: no server, no
/// speculation, no prompt cache.
struct Plain {
    tok: Tokenizer,
    seq: Box<dyn Sequence>,
    _engine: Engine,
}

impl Plain {
    fn new() -> Plain {
        let file = Arc::new(redlite_gguf::GgufFile::open(fixture(MTP_FILE)).unwrap());
        let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
        let model = Model::load(file, Default::default()).unwrap();
        let mut engine = Engine::open(
            model,
            &BackendOptions::default(),
            &MemoryRequest {
                ctx: CTX,
                sessions: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let seq = engine.open_sequence(0).unwrap();
        Plain {
            tok,
            seq,
            _engine: engine,
        }
    }

    /// Up to `MAX_TOKENS` greedy tokens after `prompt`, ending before an
    /// end-of-generation token.
    fn answer(&mut self, prompt: &[u32]) -> Vec<u32> {
        self.seq.reset().unwrap();
        let mut sampler = Sampler::greedy();
        let mut history = prompt.to_vec();
        let mut logits = self.seq.prefill(prompt, Logits::Last).unwrap();
        let mut out = Vec::new();
        while out.len() < MAX_TOKENS {
            let t = sampler.sample(&logits, &history);
            if self.tok.is_eog(t) {
                break;
            }
            out.push(t);
            history.push(t);
            if out.len() < MAX_TOKENS {
                logits = self.seq.decode(t).unwrap();
            }
        }
        out
    }

    /// The text of `ids` as the server streams it.
    fn text(&self, ids: &[u32]) -> String {
        let mut d = self.tok.stream_decoder();
        let mut s: String = ids.iter().map(|&t| d.push(t)).collect();
        s += &d.finish();
        s
    }
}

/// A conversation in tokens: turn i's prompt is turn i-1's prompt, its
/// answer and a few more tokens; with the plain answers and their texts.
struct Turns {
    prompts: Vec<Vec<u32>>,
    answers: Vec<Vec<u32>>,
    texts: Vec<String>,
}

fn turns(plain: &mut Plain, n: usize) -> Turns {
    let more = plain.tok.encode(TURN_MORE, false);
    let mut t = Turns {
        prompts: vec![plain.tok.encode(TURN1, true)],
        answers: Vec::new(),
        texts: Vec::new(),
    };
    for i in 0..n {
        let a = plain.answer(&t.prompts[i]);
        assert!(!a.is_empty(), "turn {i}: no answer");
        t.texts.push(plain.text(&a));
        let mut next = t.prompts[i].clone();
        next.extend_from_slice(&a);
        next.extend_from_slice(&more);
        t.answers.push(a);
        t.prompts.push(next);
    }
    t
}

/// The first turn's text (chosen among short prompts for a draft or two
/// that the fixture's random head gets right) and what each later turn
/// adds after the answer.
const TURN1: &str = "c the 1";
const TURN_MORE: &str = " and then";

fn send(server: &RunningServer, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp[9..12].parse().unwrap();
    (status, resp.split_once("\r\n\r\n").unwrap().1.to_string())
}

fn request(prompt: &[u32], extra: &Value) -> Value {
    let mut body = json!({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// A greedy completion's text and its cached prompt tokens.
fn complete(server: &RunningServer, prompt: &[u32], extra: &Value) -> (String, u64) {
    let (text, cached, _) = complete_usage(server, prompt, extra);
    (text, cached)
}

/// The same and the prompt's tokens.
fn complete_usage(server: &RunningServer, prompt: &[u32], extra: &Value) -> (String, u64, u64) {
    let body = request(prompt, extra).to_string();
    let (status, text) = send(server, "POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        cached,
        prompt_tokens,
    )
}

/// The same, streamed: the text of every event together.
fn complete_streamed(server: &RunningServer, prompt: &[u32], extra: &Value) -> String {
    let mut body = request(prompt, extra);
    body["stream"] = json!(true);
    let (status, text) = send(server, "POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
    // Chunk sizes are lines of hex digits: the events are the `data:` lines.
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|e| e["choices"][0]["text"].as_str().map(String::from))
        .collect()
}

fn metric(server: &RunningServer, name: &str) -> f64 {
    let (_, text) = send(server, "GET", "/metrics", "");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
}

/// (passes, drafted, accepted) so far.
fn counts(server: &RunningServer) -> [f64; 3] {
    [
        metric(server, "redlite_speculative_passes_total"),
        metric(server, "redlite_speculative_draft_tokens_total"),
        metric(server, "redlite_speculative_accepted_tokens_total"),
    ]
}

#[test]
fn mtp_answers_are_plain_greedy_over_turns_whole_and_streamed() {
    let mut plain = Plain::new();
    let t = turns(&mut plain, 5);
    let none = json!({});
    let unspeculative = start(SpecMode::None, true);
    for i in 0..5 {
        let (text, _) = complete(&unspeculative, &t.prompts[i], &none);
        assert_eq!(text, t.texts[i], "turn {i} without speculation");
    }
    assert_eq!(counts(&unspeculative), [0.0; 3]);

    let mtp = start(SpecMode::Mtp, true);
    let mut resumed = Vec::new();
    for i in 0..2 {
        let (text, cached) = complete(&mtp, &t.prompts[i], &none);
        assert_eq!(text, t.texts[i], "turn {i} with --spec mtp");
        resumed.push(cached);
    }
    // Turn 1 resumes from turn 0's end-of-turn checkpoint: the prompt and
    // every answer token but the last (never run), or all of them when an
    // end-of-generation token ended it.
    let end_of_turn0 = (t.prompts[0].len() + t.answers[0].len() - 1) as u64;
    assert!(
        resumed[1] >= end_of_turn0,
        "turn 1 resumed from {} tokens, turn 0 ended at {end_of_turn0}",
        resumed[1]
    );
    let [passes, drafted, accepted] = counts(&mtp);
    eprintln!(
        "two turns, --spec mtp: {passes} passes, {drafted} drafted, {accepted} accepted; turn 1 resumed from {} tokens",
        resumed[1]
    );
    assert!(passes > 0.0, "no verify pass");
    assert!(
        accepted > 0.0 && accepted <= drafted,
        "drafted {drafted}, accepted {accepted}"
    );
    // Streamed: the same text, turn 1 resuming again.
    for i in 0..2 {
        assert_eq!(
            complete_streamed(&mtp, &t.prompts[i], &none),
            t.texts[i],
            "turn {i} streamed"
        );
    }
    assert!(counts(&mtp)[0] > passes, "the streamed turns did not draft");
    // A turn that turns speculation off keeps the MTP state in step all
    // the same: the next MTP turn resumes from its checkpoint.
    let before = counts(&mtp);
    let off = json!({"speculative.type": "none"});
    assert_eq!(
        complete(&mtp, &t.prompts[2], &off).0,
        t.texts[2],
        "turn 2, none"
    );
    assert_eq!(counts(&mtp), before, "speculative.type none drafted");
    // So does a lookup turn (the MTP drafter follows its verify passes).
    let lookup = json!({"speculative.type": "lookup"});
    let (text, cached) = complete(&mtp, &t.prompts[3], &lookup);
    assert_eq!(text, t.texts[3], "turn 3 with lookup");
    let end_of_turn2 = (t.prompts[2].len() + t.answers[2].len() - 1) as u64;
    assert!(cached >= end_of_turn2, "turn 3 resumed from {cached}");
    let before = counts(&mtp);
    let (text, cached) = complete(&mtp, &t.prompts[4], &none);
    assert_eq!(text, t.texts[4], "turn 4 after turns without MTP drafts");
    let end_of_turn3 = (t.prompts[3].len() + t.answers[3].len() - 1) as u64;
    assert!(cached >= end_of_turn3, "turn 4 resumed from {cached}");
    assert!(counts(&mtp)[0] > before[0], "turn 4 did not draft");

    // A request asking for MTP of a server started without it.
    let ask = json!({"speculative.type": "mtp"});
    for i in 0..2 {
        let (text, _) = complete(&unspeculative, &t.prompts[i], &ask);
        assert_eq!(text, t.texts[i], "turn {i} asking for mtp");
        assert_eq!(
            complete_streamed(&unspeculative, &t.prompts[i], &ask),
            t.texts[i],
            "turn {i} streamed, asking for mtp"
        );
    }
    let c = counts(&unspeculative);
    assert!(c[1] > 0.0 && c[2] <= c[1], "{c:?}");
}

#[test]
fn a_resumed_turn_drafts_what_the_same_turn_computed_afresh_drafts() {
    let mut plain = Plain::new();
    let t = turns(&mut plain, 2);
    let cached = start(SpecMode::Mtp, true);
    let cold = start(SpecMode::Mtp, false);
    let none = json!({});
    complete(&cached, &t.prompts[0], &none);
    let before = counts(&cached);
    let (text, n_cached) = complete(&cached, &t.prompts[1], &none);
    assert!(
        n_cached > t.prompts[0].len() as u64,
        "resumed from {n_cached}"
    );
    let after = counts(&cached);
    let (cold_text, n_cold) = complete(&cold, &t.prompts[1], &none);
    assert_eq!(n_cold, 0);
    assert_eq!(text, t.texts[1]);
    assert_eq!(cold_text, t.texts[1]);
    let resumed: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    eprintln!(
        "turn 1 resumed from {n_cached} tokens: {resumed:?}; afresh: {:?}",
        counts(&cold)
    );
    assert!(resumed[0] > 0.0);
    assert_eq!(
        resumed,
        counts(&cold).to_vec(),
        "passes, drafted, accepted of turn 1: resumed against computed afresh"
    );
}

#[test]
fn a_file_without_the_mtp_layer_is_refused_naming_it() {
    let mut a = args(SpecMode::Mtp, true);
    a.model = fixture("tiny-qwen3next-nomtp-f32.gguf");
    let err = spawn(a)
        .err()
        .expect("--spec mtp without the layer")
        .to_string();
    assert!(
        err.contains("tiny-qwen3next-nomtp-f32.gguf")
            && err.contains("no multi-token-prediction layer")
            && err.contains("nextn_predict_layers"),
        "{err}"
    );
    // Served without it, a request asking for MTP is a 400 naming the field.
    let mut a = args(SpecMode::None, true);
    a.model = fixture("tiny-qwen3next-nomtp-f32.gguf");
    let server = spawn(a).expect("start without --spec");
    let body = request(&[1, 2, 3], &json!({"speculative.type": "mtp"})).to_string();
    let (status, text) = send(&server, "POST", "/v1/completions", &body);
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["param"], "speculative.type", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no multi-token-prediction layer"),
        "{v}"
    );
}

/// The files in `dir` with extension `ext` once there are `n` (the engine
/// thread writes a turn's state after sending the answer).
fn wait_for(dir: &std::path::Path, ext: &str, n: usize) -> Vec<PathBuf> {
    let files = || -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect()
    };
    for _ in 0..600 {
        if files().len() >= n {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    files()
}

#[test]
fn a_restarted_server_resumes_an_mtp_turn_from_its_saved_state() {
    let mut plain = Plain::new();
    let t = turns(&mut plain, 2);
    let dir = std::env::temp_dir().join(format!("redlite-mtp-state-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let with_dir = |spec: SpecMode| {
        let mut a = args(spec, true);
        a.state_dir = Some(dir.clone());
        spawn(a).expect("start with --state-dir")
    };
    let none = json!({});
    let first = with_dir(SpecMode::Mtp);
    assert_eq!(complete(&first, &t.prompts[0], &none).0, t.texts[0]);
    drop(first);
    let mtp_files = wait_for(&dir, "mtp", 1);
    assert_eq!(mtp_files.len(), 1, "no MTP state beside the state file");
    assert_eq!(wait_for(&dir, "state", 1).len(), 1);

    // A new server (empty memory) resumes turn 1 from the files, drafting
    // what the same turn computed afresh drafts.
    let second = with_dir(SpecMode::Mtp);
    let (text, cached) = complete(&second, &t.prompts[1], &none);
    assert_eq!(text, t.texts[1], "turn 1 after a restart");
    let end_of_turn0 = (t.prompts[0].len() + t.answers[0].len() - 1) as u64;
    assert!(cached >= end_of_turn0, "resumed from {cached} tokens");
    let cold = start(SpecMode::Mtp, false);
    assert_eq!(complete(&cold, &t.prompts[1], &none).0, t.texts[1]);
    assert_eq!(counts(&second), counts(&cold), "resumed from the files");
    drop(second);
    wait_for(&dir, "mtp", 2);

    // Corrupted MTP files: a turn without MTP still restores the state
    // file; an MTP turn computes its prefix.
    for p in wait_for(&dir, "mtp", 2) {
        let mut b = std::fs::read(&p).unwrap();
        let at = b.len() / 2;
        b[at] ^= 0x40;
        std::fs::write(&p, &b).unwrap();
    }
    let third = with_dir(SpecMode::None);
    let (text, cached) = complete(&third, &t.prompts[1], &none);
    assert_eq!(text, t.texts[1]);
    assert!(cached >= end_of_turn0, "the state file did not restore");
    let ask = json!({"speculative.type": "mtp"});
    let (text, cached) = complete(&third, &t.prompts[1], &ask);
    assert_eq!(text, t.texts[1]);
    assert_eq!(cached, 0, "an MTP turn resumed without the MTP state");
    assert!(counts(&third)[1] > 0.0);
    drop(third);
    for _ in 0..50 {
        if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
