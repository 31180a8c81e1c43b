//! The tokenizer: vocabulary, special tokens, encode and decode.

use std::collections::HashMap;

use redlite_gguf::{Metadata, MetadataValue};

use crate::bpe::{self, BpeScratch, IntMap, Merges};
use crate::bytelevel::ByteLevel;
use crate::pretok;
use crate::TokenizerError;

/// GGUF metadata keys read by [`Tokenizer::from_gguf`].
pub mod keys {
    pub const MODEL: &str = "tokenizer.ggml.model";
    pub const PRE: &str = "tokenizer.ggml.pre";
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    pub const MERGES: &str = "tokenizer.ggml.merges";
    pub const BOS: &str = "tokenizer.ggml.bos_token_id";
    pub const EOS: &str = "tokenizer.ggml.eos_token_id";
    pub const EOT: &str = "tokenizer.ggml.eot_token_id";
    pub const EOM: &str = "tokenizer.ggml.eom_token_id";
    pub const PAD: &str = "tokenizer.ggml.padding_token_id";
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
}

/// Token types as GGUF stores them (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    /// Special tokens such as `<|im_start|>`; matched in text only with
    /// `parse_special`.
    Control = 3,
    /// Added tokens such as `<tool_call>`; always matched in text.
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

impl TokenType {
    fn from_i64(v: i64) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Pre-tokenizers this crate implements (`tokenizer.ggml.pre`).
const QWEN2_PRE: &[&str] = &["qwen2", "deepseek-r1-qwen"];

/// Byte-level BPE tokenizer with the Qwen2 pre-tokenizer.
pub struct Tokenizer {
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Decoded bytes of every token, concatenated; `piece_offs[i]..piece_offs[i+1]`.
    pieces: Vec<u8>,
    piece_offs: Vec<usize>,
    vocab: HashMap<String, u32>,
    /// Token id of each byte's single-char token (`u32::MAX` if absent).
    byte_ids: [u32; 256],
    merges: Merges,
    /// CONTROL and USER_DEFINED tokens, longest first: (text, id, is_control).
    specials: Vec<(String, u32, bool)>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("merges", &self.merges.len())
            .field("specials", &self.specials.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

// ------------------------------------------------------------ metadata ----

fn get<'m>(meta: &'m Metadata, key: &'static str) -> Result<&'m MetadataValue, TokenizerError> {
    meta.get(key).ok_or(TokenizerError::MissingKey { key })
}

fn wrong(key: &'static str, expected: &'static str, v: &MetadataValue) -> TokenizerError {
    TokenizerError::WrongType {
        key,
        expected,
        found: v.type_name(),
    }
}

fn get_str<'m>(meta: &'m Metadata, key: &'static str) -> Result<&'m str, TokenizerError> {
    let v = get(meta, key)?;
    v.as_str().ok_or_else(|| wrong(key, "string", v))
}

fn get_str_array<'m>(
    meta: &'m Metadata,
    key: &'static str,
) -> Result<Vec<&'m str>, TokenizerError> {
    let v = get(meta, key)?;
    let MetadataValue::Array(a) = v else {
        return Err(wrong(key, "array of string", v));
    };
    a.values
        .iter()
        .map(|x| x.as_str().ok_or_else(|| wrong(key, "array of string", v)))
        .collect()
}

fn get_int_array(meta: &Metadata, key: &'static str) -> Result<Vec<i64>, TokenizerError> {
    let v = get(meta, key)?;
    let MetadataValue::Array(a) = v else {
        return Err(wrong(key, "array of integer", v));
    };
    a.values
        .iter()
        .map(|x| {
            x.as_int()
                .and_then(|i| i64::try_from(i).ok())
                .ok_or_else(|| wrong(key, "array of integer", v))
        })
        .collect()
}

fn get_opt_id(
    meta: &Metadata,
    key: &'static str,
    vocab_size: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = meta.get(key) else {
        return Ok(None);
    };
    let i = v.as_int().ok_or_else(|| wrong(key, "integer", v))?;
    // llama.cpp writes -1 (as i32 or u32::MAX) for "no such token".
    if i < 0 || i == i128::from(u32::MAX) {
        return Ok(None);
    }
    match u32::try_from(i) {
        Ok(id) if (id as usize) < vocab_size => Ok(Some(id)),
        _ => Err(TokenizerError::Invalid {
            key,
            why: format!("token id {i} is out of range (vocab size {vocab_size})"),
        }),
    }
}

fn get_opt_bool(meta: &Metadata, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(MetadataValue::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong(key, "bool", v)),
    }
}

// --------------------------------------------------------------- build ----

/// Where CONTROL tokens are matched in the text of one encode call.
#[derive(Clone, Copy)]
enum Control<'a> {
    None,
    All,
    /// Everywhere but in these byte ranges.
    Outside(&'a [std::ops::Range<usize>]),
}

impl Control<'_> {
    fn allows(self, start: usize, end: usize) -> bool {
        match self {
            Control::None => false,
            Control::All => true,
            Control::Outside(plain) => !plain.iter().any(|r| r.start < end && start < r.end),
        }
    }
}

/// Where the text of one encode call is split around special tokens.
enum Seg<'t> {
    Text(&'t str),
    Token(u32),
}

impl Tokenizer {
    /// Build the tokenizer from GGUF metadata (`tokenizer.ggml.*`).
    ///
    /// Supports `tokenizer.ggml.model = "gpt2"` (byte-level BPE) with
    /// `tokenizer.ggml.pre = "qwen2"`.
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let model = get_str(meta, keys::MODEL)?;
        if model != "gpt2" {
            return Err(TokenizerError::Unsupported {
                key: keys::MODEL,
                value: model.to_string(),
                why: "only byte-level BPE (\"gpt2\") is implemented",
            });
        }
        let pre = get_str(meta, keys::PRE)?;
        if !QWEN2_PRE.contains(&pre) {
            return Err(TokenizerError::Unsupported {
                key: keys::PRE,
                value: pre.to_string(),
                why: "only the \"qwen2\" pre-tokenizer is implemented",
            });
        }
        let tokens = get_str_array(meta, keys::TOKENS)?;
        let types = if meta.get(keys::TOKEN_TYPE).is_some() {
            let t = get_int_array(meta, keys::TOKEN_TYPE)?;
            if t.len() != tokens.len() {
                return Err(TokenizerError::Invalid {
                    key: keys::TOKEN_TYPE,
                    why: format!("{} entries but {} tokens", t.len(), tokens.len()),
                });
            }
            t.into_iter().map(TokenType::from_i64).collect()
        } else {
            vec![TokenType::Normal; tokens.len()]
        };
        let merges = get_str_array(meta, keys::MERGES)?;
        let n = tokens.len();
        let config = Config {
            bos: get_opt_id(meta, keys::BOS, n)?,
            eos: get_opt_id(meta, keys::EOS, n)?,
            eot: get_opt_id(meta, keys::EOT, n)?,
            eom: get_opt_id(meta, keys::EOM, n)?,
            pad: get_opt_id(meta, keys::PAD, n)?,
            add_bos: get_opt_bool(meta, keys::ADD_BOS)?.unwrap_or(false),
            add_eos: get_opt_bool(meta, keys::ADD_EOS)?.unwrap_or(false),
        };
        Tokenizer::build(&tokens, types, &merges, config)
    }

    fn build(
        tokens: &[&str],
        types: Vec<TokenType>,
        merges: &[&str],
        config: Config,
    ) -> Result<Tokenizer, TokenizerError> {
        if tokens.is_empty() {
            return Err(TokenizerError::Invalid {
                key: keys::TOKENS,
                why: "the vocabulary is empty".into(),
            });
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(TokenizerError::Invalid {
                key: keys::TOKENS,
                why: "too many tokens".into(),
            });
        }
        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            // First occurrence wins for duplicated texts.
            vocab.entry((*t).to_string()).or_insert(i as u32);
        }

        let bl = ByteLevel::new();
        let mut byte_ids = [u32::MAX; 256];
        let mut buf = [0u8; 4];
        for b in 0..=255u8 {
            if let Some(&id) = vocab.get(&*bl.char_of(b).encode_utf8(&mut buf)) {
                byte_ids[b as usize] = id;
            }
        }
        // Byte-level BPE starts every word from one token per byte; a byte
        // without one would be dropped from the text without a word (the
        // output of `tokenize` was `[]`). Refuse such a vocabulary at load.
        let missing: Vec<u8> = (0..=255u8)
            .filter(|&b| byte_ids[b as usize] == u32::MAX)
            .collect();
        if !missing.is_empty() {
            let list: Vec<String> = missing
                .iter()
                .take(8)
                .map(|&b| format!("0x{b:02X} ({:?})", bl.char_of(b)))
                .collect();
            let more = if missing.len() > 8 { ", ..." } else { "" };
            return Err(TokenizerError::Invalid {
                key: keys::TOKENS,
                why: format!(
                    "no token for {} of the 256 bytes ({}{more}): byte-level BPE needs one token per byte",
                    missing.len(),
                    list.join(", ")
                ),
            });
        }

        let mut table = Merges::with_capacity(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            let Some((a, b)) = m.split_once(' ') else {
                return Err(TokenizerError::Invalid {
                    key: keys::MERGES,
                    why: format!("merge {rank} ({m:?}) is not two tokens separated by a space"),
                });
            };
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            // A merge whose parts or result is not in the vocabulary can never
            // apply; skip it as llama.cpp does.
            if let (Some(&ia), Some(&ib), Some(&im)) =
                (vocab.get(a), vocab.get(b), vocab.get(joined.as_str()))
            {
                table.insert(ia, ib, rank as u32, im);
            }
        }

        let mut pieces = Vec::new();
        let mut piece_offs = Vec::with_capacity(tokens.len() + 1);
        piece_offs.push(0);
        for (t, ty) in tokens.iter().zip(&types) {
            match ty {
                TokenType::Control | TokenType::UserDefined | TokenType::Unused => {
                    pieces.extend_from_slice(t.as_bytes())
                }
                _ => match ByteLevel::decode(t) {
                    Some(b) => pieces.extend_from_slice(&b),
                    None => pieces.extend_from_slice(t.as_bytes()),
                },
            }
            piece_offs.push(pieces.len());
        }

        let mut specials: Vec<(String, u32, bool)> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (t, ty))| {
                !t.is_empty() && matches!(ty, TokenType::Control | TokenType::UserDefined)
            })
            .map(|(i, (t, ty))| ((*t).to_string(), i as u32, *ty == TokenType::Control))
            .collect();
        // Longest first; ties by id so the order is deterministic.
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));

        let find = |s: &str| vocab.get(s).copied();
        let eot = config
            .eot
            .or_else(|| find("<|im_end|>"))
            .or_else(|| find("<|eot_id|>"))
            .or(config.eos);
        let mut eog: Vec<u32> = [
            config.eos,
            eot,
            config.eom,
            find("<|im_end|>"),
            find("<|endoftext|>"),
        ]
        .into_iter()
        .flatten()
        .collect();
        eog.sort_unstable();
        eog.dedup();

        Ok(Tokenizer {
            tokens: tokens.iter().map(|s| (*s).to_string()).collect(),
            types,
            pieces,
            piece_offs,
            vocab,
            byte_ids,
            merges: table,
            specials,
            bos: config.bos,
            eos: config.eos,
            eot,
            pad: config.pad,
            add_bos: config.add_bos,
            add_eos: config.add_eos,
            eog,
        })
    }

    // ----------------------------------------------------------- encode ----

    /// Tokenize `text`. With `parse_special`, CONTROL tokens written in the
    /// text (e.g. `<|im_start|>`) become their ids; USER_DEFINED tokens
    /// (e.g. `<tool_call>`) are always matched, as in llama.cpp. BOS / EOS
    /// are added only when the file says `add_bos_token` / `add_eos_token`.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let control = if parse_special {
            Control::All
        } else {
            Control::None
        };
        self.encode_split(text, control)
    }

    /// Tokenize `text` with CONTROL tokens matched everywhere except inside
    /// the byte ranges of `plain` (sorted or not), where their text stays
    /// text, as with `encode(text, false)`. A chat prompt uses this to keep
    /// the template's markup special while a message that writes
    /// `<|im_end|>` cannot close its own turn. Text on both sides of a
    /// range boundary is tokenized as one piece, so a prompt without
    /// control text in `plain` gives the same ids as `encode(text, true)`.
    pub fn encode_with_plain(&self, text: &str, plain: &[std::ops::Range<usize>]) -> Vec<u32> {
        self.encode_split(text, Control::Outside(plain))
    }

    /// The CONTROL tokens (text and id), e.g. `<|im_start|>`.
    pub fn control_tokens(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.specials
            .iter()
            .filter(|s| s.2)
            .map(|(t, id, _)| (t.as_str(), *id))
    }

    fn encode_split(&self, text: &str, control: Control<'_>) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if self.add_bos {
            out.extend(self.bos);
        }
        let mut st = EncodeState::default();
        for seg in self.split_special(text, control) {
            match seg {
                Seg::Token(id) => out.push(id),
                Seg::Text(t) => self.encode_text(t, &mut out, &mut st),
            }
        }
        if self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    fn split_special<'t>(&self, text: &'t str, control: Control<'_>) -> Vec<Seg<'t>> {
        let base = text.as_ptr() as usize;
        let mut segs = vec![Seg::Text(text)];
        for (tok, id, is_control) in &self.specials {
            if *is_control && matches!(control, Control::None) {
                continue;
            }
            if !text.contains(tok.as_str()) {
                continue;
            }
            let mut next = Vec::with_capacity(segs.len() + 2);
            for seg in segs {
                let Seg::Text(mut rest) = seg else {
                    next.push(seg);
                    continue;
                };
                // `rest[..from]` has been searched and holds no match.
                let mut from = 0;
                while let Some(q) = rest[from..].find(tok.as_str()) {
                    let p = from + q;
                    let at = rest.as_ptr() as usize - base + p;
                    if *is_control && !control.allows(at, at + tok.len()) {
                        from = p + 1;
                        while !rest.is_char_boundary(from) {
                            from += 1;
                        }
                        continue;
                    }
                    if p > 0 {
                        next.push(Seg::Text(&rest[..p]));
                    }
                    next.push(Seg::Token(*id));
                    rest = &rest[p + tok.len()..];
                    from = 0;
                }
                if !rest.is_empty() {
                    next.push(Seg::Text(rest));
                }
            }
            segs = next;
        }
        segs
    }

    fn encode_text<'t>(&self, text: &'t str, out: &mut Vec<u32>, st: &mut EncodeState<'t>) {
        let EncodeState {
            pre,
            bpe: bpe_scratch,
            cache,
            ids,
        } = st;
        pretok::split(text, pre, |word| {
            if let Some(&(start, len)) = cache.get(word) {
                let start = start as usize;
                out.extend_from_within(start..start + len as usize);
                return;
            }
            ids.clear();
            ids.extend(word.bytes().map(|b| self.byte_ids[b as usize]));
            bpe::merge(&self.merges, ids, bpe_scratch);
            let start = out.len();
            out.extend(ids.iter().copied().filter(|&id| id != u32::MAX));
            if let (Ok(s), Ok(l)) = (u32::try_from(start), u32::try_from(out.len() - start)) {
                cache.insert(word, (s, l));
            }
        });
    }

    // ----------------------------------------------------------- decode ----

    /// The bytes a token stands for (special tokens as their text); empty for
    /// an unknown id.
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_offs.len() {
            return &[];
        }
        &self.pieces[self.piece_offs[i]..self.piece_offs[i + 1]]
    }

    /// Text of the tokens; invalid UTF-8 becomes U+FFFD. Special tokens are
    /// included as their text; unknown ids are skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// [`decode`](Self::decode), optionally leaving out CONTROL tokens.
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if skip_special && self.token_type(id) == Some(TokenType::Control) {
                continue;
            }
            bytes.extend_from_slice(self.token_to_piece(id));
        }
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// A decoder for token-by-token streaming.
    pub fn stream_decoder(&self) -> crate::StreamDecoder<'_> {
        crate::StreamDecoder::new(self)
    }

    // ------------------------------------------------------------ vocab ----

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// A token's text as stored in the vocabulary (byte-level alphabet for
    /// normal tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// A token's type.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The id of a token given its vocabulary text.
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).copied()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }
    /// End of turn (`<|im_end|>` for Qwen).
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }
    /// Whether [`encode`](Self::encode) adds BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether [`encode`](Self::encode) adds EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// End of generation: EOS, end of turn, `<|im_end|>`, `<|endoftext|>`.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }
}

struct Config {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

/// Per-call buffers and word cache: (start, len) of a word's ids in the output.
#[derive(Default)]
struct EncodeState<'t> {
    pre: pretok::Scratch,
    bpe: BpeScratch,
    cache: IntMap<&'t str, (u32, u32)>,
    ids: Vec<u32>,
}
