//! Incremental decoding for token-by-token streaming.

use crate::Tokenizer;

/// Turns tokens into text as they come, holding back an incomplete UTF-8
/// sequence at the end until the next token completes it. Bytes that can
/// never be valid UTF-8 become U+FFFD right away. The concatenation of all
/// [`push`](Self::push) results and [`finish`](Self::finish) equals
/// [`Tokenizer::decode`] of the same ids.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer) -> StreamDecoder<'a> {
        StreamDecoder {
            tok,
            pending: Vec::new(),
        }
    }

    /// Add one token; returns the text that is now complete (maybe empty).
    pub fn push(&mut self, id: u32) -> String {
        self.pending.extend_from_slice(self.tok.token_to_piece(id));
        self.take_complete()
    }

    /// Add raw bytes (e.g. from [`Tokenizer::token_to_piece`]).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        self.take_complete()
    }

    /// Bytes held back, waiting for the rest of a UTF-8 sequence.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// End of stream: held-back bytes become U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is valid UTF-8 by construction.
                    out.push_str(&String::from_utf8_lossy(good));
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &bad[n..];
                        }
                        None => {
                            // Incomplete sequence at the end: keep it.
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }
}
