//! Changes to an input: byte-level damage (a flipped bit, a cut, inserted
//! garbage), and protobuf-level ones (two encodings of the same message
//! concatenated merge into one, so an input grows by a generated part).

use crate::rng::{Edges, Rng};

/// A changed copy of `input`; `extra` is another input of the same
/// message to splice in.
pub fn mutate(input: &[u8], extra: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(3) {
        match rng.below(7) {
            // Merge with another message of the same type.
            0 | 1 => out.extend_from_slice(extra),
            // Flip a bit.
            2 if !out.is_empty() => {
                let i = rng.below(out.len() as u64) as usize;
                out[i] ^= 1 << rng.below(8);
            }
            // Set a byte to an interesting value.
            3 if !out.is_empty() => {
                let i = rng.below(out.len() as u64) as usize;
                out[i] = [0x00, 0x7f, 0x80, 0xff, 0x0a, 0x12][rng.below(6) as usize];
            }
            // Cut the end.
            4 if !out.is_empty() => {
                let keep = rng.below(out.len() as u64) as usize;
                out.truncate(keep);
            }
            // Insert random bytes.
            5 => {
                let at = rng.below(out.len() as u64 + 1) as usize;
                let junk = rng.junk(8);
                out.splice(at..at, junk);
            }
            // A huge length prefix (a field that claims more than follows).
            _ => out.extend_from_slice(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]),
        }
    }
    out
}
