//! The loop against the sequence API, with a backend double that counts
//! calls: which state a prompt starts from, and what is computed.
use super::*;
use redlite_model::sequence::Checkpoint;
use redlite_model::ModelError;
use std::sync::Mutex;

/// Calls made on the double.
#[derive(Debug, Default, Clone, PartialEq)]
struct Calls {
    prefill_tokens: Vec<usize>,
    decode: usize,
    reset: usize,
    checkpoint: usize,
    restore: Vec<usize>,
}

/// A sequence whose state is the tokens it holds; its logits make
/// token `100 + pos % 7` the most likely, so greedy output is known.
struct Double {
    tokens: Vec<u32>,
    ctx: usize,
    n_vocab: usize,
    calls: Arc<Mutex<Calls>>,
    /// Run at the next prefill call (e.g. a client leaving).
    on_prefill: Hook,
}

type Hook = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

impl Double {
    fn logits(&self) -> Vec<f32> {
        let mut l = vec![0f32; self.n_vocab];
        l[100 + self.tokens.len() % 7] = 10.0;
        l
    }
}

impl Sequence for Double {
    fn prefill(&mut self, tokens: &[u32], _: Logits) -> Result<Vec<f32>, ModelError> {
        self.calls.lock().unwrap().prefill_tokens.push(tokens.len());
        if let Some(f) = self.on_prefill.lock().unwrap().take() {
            f();
        }
        self.tokens.extend_from_slice(tokens);
        Ok(self.logits())
    }
    fn decode(&mut self, token: u32) -> Result<Vec<f32>, ModelError> {
        self.calls.lock().unwrap().decode += 1;
        self.tokens.push(token);
        Ok(self.logits())
    }
    fn pos(&self) -> usize {
        self.tokens.len()
    }
    fn ctx_len(&self) -> usize {
        self.ctx
    }
    fn reset(&mut self) -> Result<(), ModelError> {
        self.calls.lock().unwrap().reset += 1;
        self.tokens.clear();
        Ok(())
    }
    fn checkpoint(&mut self) -> Result<Checkpoint, ModelError> {
        self.calls.lock().unwrap().checkpoint += 1;
        let n = self.tokens.len();
        Ok(Checkpoint::new(
            "double",
            n,
            n as u64 * 8,
            Box::new(self.tokens.clone()),
        ))
    }
    fn restore(&mut self, c: &Checkpoint) -> Result<(), ModelError> {
        let t: &Vec<u32> = c.state("double")?;
        self.calls.lock().unwrap().restore.push(t.len());
        self.tokens = t.clone();
        Ok(())
    }
    fn last_routes(&self) -> Result<Vec<Vec<u32>>, ModelError> {
        Ok(Vec::new())
    }
    fn backend(&self) -> &'static str {
        "double"
    }
}

fn tokenizer() -> Arc<Tokenizer> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next/tiny-qwen3next-q8_0.gguf");
    let file = redlite_gguf::GgufFile::open(&path).expect("fixture");
    Arc::new(Tokenizer::from_gguf(file.metadata()).expect("fixture tokenizer"))
}

fn run(handle: &EngineHandle, prompt: Vec<u32>, max_tokens: usize) -> Done {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    assert!(handle.submit(Job {
        prompt,
        max_tokens,
        sampler: SamplerConfig::default(),
        stop: Vec::new(),
        events: tx,
        logprobs: None,
        grammar: None,
        spec: Default::default(),
    }));
    loop {
        match rx.blocking_recv().expect("the engine answers") {
            Event::Done(d) => return d,
            Event::Error(e) => panic!("{e}"),
            Event::Text(_) => {}
        }
    }
}

fn start_double(prompt_cache: bool) -> (EngineHandle, Arc<Mutex<Calls>>) {
    let (h, c, _) = start_double_with_hook(prompt_cache);
    (h, c)
}

fn start_double_with_hook(prompt_cache: bool) -> (EngineHandle, Arc<Mutex<Calls>>, Hook) {
    let calls = Arc::new(Mutex::new(Calls::default()));
    let hook: Hook = Arc::new(Mutex::new(None));
    let on_prefill = hook.clone();
    let c = calls.clone();
    let tok = tokenizer();
    let n_vocab = tok.vocab_size().max(200);
    let open: OpenSequence = Box::new(move || {
        Ok(Box::new(Double {
            tokens: Vec::new(),
            ctx: 256,
            n_vocab,
            calls: c,
            on_prefill,
        }) as Box<dyn Sequence>)
    });
    let cfg = EngineConfig {
        ctx: 256,
        ubatch: 4,
        prompt_cache,
        max_checkpoints: 4,
        state_dir: None,
        spec: Default::default(),
        model: None,
    };
    let h = start(open, tok, cfg, Arc::new(Metrics::default())).expect("starts");
    (h, calls, hook)
}

#[test]
fn a_prompt_cancelled_midway_keeps_what_was_computed() {
    let (h, calls, hook) = start_double_with_hook(true);
    let prompt: Vec<u32> = (1..=10).collect();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // The client leaves during the first prefill call (4 tokens).
    let rx = Mutex::new(Some(rx));
    *hook.lock().unwrap() = Some(Box::new(move || drop(rx.lock().unwrap().take())));
    assert!(h.submit(Job {
        prompt: prompt.clone(),
        max_tokens: 3,
        sampler: SamplerConfig::default(),
        stop: Vec::new(),
        events: tx,
        logprobs: None,
        grammar: None,
        spec: Default::default(),
    }));
    // The retry resumes after the 4 tokens computed.
    let d = run(&h, prompt, 1);
    assert_eq!((d.prompt_tokens, d.cached_tokens), (10, 4));
    let c = calls.lock().unwrap();
    assert_eq!(c.prefill_tokens, vec![4, 4, 2]);
    assert_eq!(c.restore, vec![4]);
}

#[test]
fn a_follow_up_turn_restores_the_previous_state_and_computes_only_the_new_tokens() {
    let (h, calls) = start_double(true);
    let first: Vec<u32> = (1..=10).collect();
    let d = run(&h, first.clone(), 3);
    assert_eq!(
        (d.prompt_tokens, d.cached_tokens, d.completion_tokens),
        (10, 0, 3)
    );
    {
        let c = calls.lock().unwrap();
        // A fresh state, the prompt in ubatch-sized calls, a checkpoint
        // after the prompt and one after the generation; the last
        // sampled token is not fed back.
        assert_eq!(c.reset, 1);
        assert_eq!(c.prefill_tokens, vec![4, 4, 2]);
        assert_eq!(c.decode, 2);
        assert_eq!(c.checkpoint, 2);
        assert!(c.restore.is_empty());
    }
    // The next turn: the conversation so far (prompt + the two tokens
    // fed back, as greedy chose them) and three new tokens.
    let mut second = first.clone();
    second.extend([100 + 10 % 7, 100 + 11 % 7]);
    second.extend([7, 8, 9]);
    let d = run(&h, second.clone(), 1);
    assert_eq!((d.prompt_tokens, d.cached_tokens), (15, 12));
    let c = calls.lock().unwrap().clone();
    assert_eq!(c.restore, vec![12], "restored the end of the first turn");
    assert_eq!(c.reset, 1, "no fresh state for a follow-up");
    assert_eq!(
        c.prefill_tokens,
        vec![4, 4, 2, 3],
        "only the new tokens computed"
    );
    drop(h);
}

#[test]
fn a_grammar_constrains_the_output_and_ends_it() {
    let (h, _) = start_double(true);
    // The double prefers token 100 + pos % 7 whatever the grammar says;
    // the output must still be a sentence of the grammar, ended by it.
    let text = r#"root ::= "{\"ok\": " ("true" | "false") "}""#;
    let g = Arc::new(redlite_grammar::gbnf::parse(text).unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    assert!(h.submit(Job {
        prompt: vec![1, 2, 3],
        max_tokens: 64,
        sampler: SamplerConfig {
            temperature: 1.0,
            seed: 9,
            ..SamplerConfig::default()
        },
        stop: Vec::new(),
        events: tx,
        logprobs: None,
        grammar: Some(g.clone()),
        spec: Default::default(),
    }));
    let mut out = String::new();
    let done = loop {
        match rx.blocking_recv().expect("the engine answers") {
            Event::Done(d) => break d,
            Event::Error(e) => panic!("{e}"),
            Event::Text(t) => out.push_str(&t),
        }
    };
    assert_eq!(done.finish, Finish::Stop, "{out:?}");
    assert!(
        redlite_grammar::Matcher::matches(&g, &out).unwrap(),
        "{out:?}"
    );
    assert!(serde_json::from_str::<serde_json::Value>(&out).is_ok());
}

#[test]
fn without_the_prompt_cache_every_prompt_starts_fresh() {
    let (h, calls) = start_double(false);
    let p: Vec<u32> = (1..=6).collect();
    run(&h, p.clone(), 2);
    let d = run(&h, p, 2);
    assert_eq!(d.cached_tokens, 0);
    let c = calls.lock().unwrap();
    assert_eq!(c.reset, 2);
    assert_eq!(c.checkpoint, 0);
    assert!(c.restore.is_empty());
    assert_eq!(c.prefill_tokens, vec![4, 2, 4, 2]);
}

#[test]
fn a_sequence_that_cannot_open_is_an_error_at_start() {
    let open: OpenSequence = Box::new(|| Err("no device".into()));
    let cfg = EngineConfig {
        ctx: 8,
        ubatch: 4,
        prompt_cache: true,
        max_checkpoints: 1,
        state_dir: None,
        spec: Default::default(),
        model: None,
    };
    let e = start(open, tokenizer(), cfg, Arc::new(Metrics::default())).unwrap_err();
    assert!(e.to_string().contains("no device"), "{e}");
}
