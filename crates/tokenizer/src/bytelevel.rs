//! The GPT-2 byte-level alphabet: every byte is shown as one printable char.
//!
//! Printable Latin-1 bytes (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for
//! themselves; the other 68 bytes get the chars U+0100, U+0101, ... in byte
//! order (so a space is `Ġ`, a newline `Ċ`).

/// Byte -> char of the byte-level alphabet.
pub(crate) struct ByteLevel {
    to_char: [char; 256],
}

fn is_self_mapped(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

impl ByteLevel {
    pub(crate) fn new() -> ByteLevel {
        let mut to_char = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            to_char[b as usize] = if is_self_mapped(b) {
                char::from(b)
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                c
            };
        }
        ByteLevel { to_char }
    }

    pub(crate) fn char_of(&self, b: u8) -> char {
        self.to_char[b as usize]
    }

    /// The byte a char of the alphabet stands for.
    pub(crate) fn byte_of(c: char) -> Option<u8> {
        let u = c as u32;
        if u < 256 && is_self_mapped(u as u8) {
            return Some(u as u8);
        }
        if !(256..256 + 68).contains(&u) {
            return None;
        }
        // The n-th non-self-mapped byte.
        let mut n = u - 256;
        for b in 0..=255u8 {
            if !is_self_mapped(b) {
                if n == 0 {
                    return Some(b);
                }
                n -= 1;
            }
        }
        None
    }

    /// Decode a token's text in the alphabet to bytes; `None` if some char is
    /// not in the alphabet.
    pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
        text.chars().map(ByteLevel::byte_of).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_all_bytes() {
        let bl = ByteLevel::new();
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = bl.char_of(b);
            assert!(seen.insert(c));
            assert_eq!(ByteLevel::byte_of(c), Some(b));
        }
        assert_eq!(bl.char_of(b' '), 'Ġ');
        assert_eq!(bl.char_of(b'\n'), 'Ċ');
        assert_eq!(ByteLevel::byte_of('\u{3000}'), None);
        assert_eq!(ByteLevel::decode("ĠhiĊ").unwrap(), b" hi\n");
    }
}
