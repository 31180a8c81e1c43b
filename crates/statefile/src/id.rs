//! Which model a state belongs to.

use redlite_gguf::GgufFile;

/// A model's identity: its architecture and a hash of its tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelId {
    pub arch: String,
    /// FNV-1a (64 bits) over every tensor's name, type, dimensions, offset
    /// and size, in file order: two files with the same table lay out the
    /// same weights, and a re-quantised or re-converted file differs.
    pub tensor_hash: u64,
    pub n_tensors: u64,
    pub n_vocab: u64,
}

impl ModelId {
    /// The identity of `file`, run as `arch` with `n_vocab` logits.
    pub fn of(file: &GgufFile, arch: &str, n_vocab: usize) -> ModelId {
        let mut h = Fnv1a64::new();
        for t in file.tensors() {
            h.write(&(t.name.len() as u64).to_le_bytes());
            h.write(t.name.as_bytes());
            h.write(&(t.ty as u32).to_le_bytes());
            h.write(&(t.dims.len() as u64).to_le_bytes());
            for d in &t.dims {
                h.write(&d.to_le_bytes());
            }
            h.write(&t.offset.to_le_bytes());
            h.write(&t.n_bytes.to_le_bytes());
        }
        ModelId {
            arch: arch.to_string(),
            tensor_hash: h.finish(),
            n_tensors: file.tensors().len() as u64,
            n_vocab: n_vocab as u64,
        }
    }

    /// What differs between `self` (a file's) and `other` (the model's),
    /// None when they are the same model.
    pub fn difference(&self, other: &ModelId) -> Option<String> {
        if self.arch != other.arch {
            return Some(format!(
                "architecture {}, this model is {}",
                self.arch, other.arch
            ));
        }
        if self.n_vocab != other.n_vocab {
            return Some(format!(
                "a vocabulary of {}, this model has {}",
                self.n_vocab, other.n_vocab
            ));
        }
        if self.n_tensors != other.n_tensors || self.tensor_hash != other.tensor_hash {
            return Some(format!(
                "tensor table hash {:016x} ({} tensors), this model's is {:016x} ({} tensors)",
                self.tensor_hash, self.n_tensors, other.tensor_hash, other.n_tensors
            ));
        }
        None
    }
}

/// FNV-1a, 64 bits (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
struct Fnv1a64(u64);

impl Fnv1a64 {
    fn new() -> Fnv1a64 {
        Fnv1a64(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// FNV-1a (64 bits) of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a64::new();
    h.write(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_published_test_vectors() {
        // From the test suite published with the FNV reference code
        // (Landon Curt Noll's fnv-5.0.3 test_fnv.c, fnv1a_64_vector).
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }
}
