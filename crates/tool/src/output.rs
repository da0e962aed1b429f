//! Output capped to a size, keeping its head and its tail.

/// Collects bytes up to a limit: the first half of the limit is kept from the
/// start, the second half from the end, and the middle is replaced by a
/// marker saying how much was cut.
#[derive(Debug)]
pub struct CappedOutput {
    head: Vec<u8>,
    tail: Vec<u8>,
    head_cap: usize,
    tail_cap: usize,
    dropped: u64,
}

impl CappedOutput {
    /// A collector keeping at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        let head_cap = limit / 2;
        Self {
            head: Vec::new(),
            tail: Vec::new(),
            head_cap,
            tail_cap: limit - head_cap,
            dropped: 0,
        }
    }

    /// Adds bytes.
    pub fn push(&mut self, mut bytes: &[u8]) {
        if self.head.len() < self.head_cap {
            let take = bytes.len().min(self.head_cap - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.is_empty() {
            return;
        }
        self.tail.extend_from_slice(bytes);
        // Trim in bulk so that pushing stays linear.
        if self.tail.len() > self.tail_cap.saturating_mul(2).max(4096) {
            let excess = self.tail.len() - self.tail_cap;
            self.dropped += excess as u64;
            self.tail.drain(..excess);
        }
    }

    /// The text (invalid UTF-8 replaced) and whether anything was cut.
    pub fn finish(mut self) -> (String, bool) {
        if self.tail.len() > self.tail_cap {
            let excess = self.tail.len() - self.tail_cap;
            self.dropped += excess as u64;
            self.tail.drain(..excess);
        }
        let head = String::from_utf8_lossy(&self.head).into_owned();
        if self.dropped == 0 {
            return (head + &String::from_utf8_lossy(&self.tail), false);
        }
        let text = format!(
            "{head}\n[... {} bytes of output cut ...]\n{}",
            self.dropped,
            String::from_utf8_lossy(&self.tail)
        );
        (text, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut c = CappedOutput::new(100);
        c.push(b"hello ");
        c.push(b"world");
        assert_eq!(c.finish(), ("hello world".to_string(), false));
    }

    #[test]
    fn long_output_keeps_head_and_tail_with_marker() {
        let mut c = CappedOutput::new(10);
        for chunk in [b"01234".as_slice(), b"56789", b"abcdefghij", b"KLMNO"] {
            c.push(chunk);
        }
        let (text, cut) = c.finish();
        assert!(cut);
        assert_eq!(text, "01234\n[... 15 bytes of output cut ...]\nKLMNO");
    }
}
