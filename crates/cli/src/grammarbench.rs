//! `redlite bench grammar`: the per-token cost of a grammar's token mask
//! over a model's vocabulary. A JSON document valid for a JSON Schema is
//! tokenized and fed through the constraint token by token; each step's
//! mask (the trie walk or cache lookups, and setting disallowed logits to
//! -inf) is timed. The first pass starts with an empty cache, as each
//! request does.

use anyhow::{bail, Context, Result};
use redlite_grammar::{gbnf, schema, Constraint};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct GrammarBenchArgs {
    /// The GGUF file whose vocabulary is used (only its metadata is read).
    #[arg(short, long)]
    pub model: PathBuf,
    /// A JSON Schema file (default: a built-in object schema with nested
    /// objects, arrays, strings, integers and booleans).
    #[arg(long, requires = "document")]
    pub schema: Option<PathBuf>,
    /// A JSON document valid for --schema, fed as the model's output.
    #[arg(long)]
    pub document: Option<PathBuf>,
    /// Passes over the document (each with a fresh constraint and cache).
    #[arg(long, default_value_t = 3)]
    pub passes: usize,
}

const SCHEMA: &str = r#"{"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
  "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
  "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
              "required": ["street", "city"]},
  "active": {"type": "boolean"}},
  "required": ["name", "age", "tags", "address", "active"]}"#;

const DOCUMENT: &str = r#"{"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["mathematics", "poetry", "analytical engine"], "address": {"street": "12 St James's Square", "city": "London"}, "active": true}"#;

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn run(a: GrammarBenchArgs) -> Result<()> {
    let file = redlite_gguf::GgufFile::open(&a.model)
        .with_context(|| format!("opening {}", a.model.display()))?;
    let tok = redlite_tokenizer::Tokenizer::from_gguf(file.metadata())
        .with_context(|| format!("the tokenizer of {}", a.model.display()))?;
    let (schema_text, doc) = match (&a.schema, &a.document) {
        (Some(s), Some(d)) => (
            std::fs::read_to_string(s).with_context(|| format!("reading {}", s.display()))?,
            std::fs::read_to_string(d).with_context(|| format!("reading {}", d.display()))?,
        ),
        _ => (SCHEMA.to_string(), DOCUMENT.to_string()),
    };
    let schema_value: serde_json::Value =
        serde_json::from_str(&schema_text).context("the schema is not JSON")?;
    let t = Instant::now();
    let vocab = Arc::new(redlite_server::constrain::vocab_for(&tok));
    let vocab_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let gbnf_text = schema::compile(&schema_value)?;
    let g = Arc::new(gbnf::parse(&gbnf_text)?);
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let ids = tok.encode(doc.trim_end(), false);
    crate::outln!(
        "vocabulary: {} tokens, {} trie nodes, built in {vocab_ms:.1} ms; schema compiled in {compile_ms:.2} ms; document: {} tokens",
        tok.vocab_size(),
        vocab.trie_nodes(),
        ids.len()
    )?;
    crate::outln!("| pass | mean µs/token | median | p90 | max | first token | frame walks | cache hits | exit checks |")?;
    crate::outln!("|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    let mut logits = vec![0f32; tok.vocab_size()];
    for pass in 0..a.passes.max(1) {
        let mut c = Constraint::new(g.clone(), vocab.clone())?;
        let mut times = Vec::with_capacity(ids.len() + 1);
        for &id in ids.iter().chain(tok.eos_id().iter()) {
            logits.iter_mut().for_each(|l| *l = 0.0);
            let t = Instant::now();
            c.apply(&mut logits)?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
            if logits[id as usize] == f32::NEG_INFINITY {
                bail!(
                    "the mask refuses token {id} ({:?}) of the document: is it valid for the schema?",
                    String::from_utf8_lossy(tok.token_to_piece(id))
                );
            }
            if !c.accept_token(id)? {
                bail!("the grammar refuses token {id}");
            }
        }
        let first = times[0];
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        let s = c.stats;
        crate::outln!(
            "| {} | {mean:.0} | {:.0} | {:.0} | {:.0} | {first:.0} | {} | {} | {} |",
            pass + 1,
            pct(&sorted, 0.5),
            pct(&sorted, 0.9),
            sorted[sorted.len() - 1],
            s.walks,
            s.hits,
            s.exit_checks
        )?;
    }
    Ok(())
}
