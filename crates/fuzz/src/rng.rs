//! The seeded generator of the harnesses (the same seed gives the same
//! inputs, so a run can be repeated exactly), with the values a fuzzer
//! wants more of: integers and floats at their edges, random bytes.

pub use agentry_testkit::rng::Rng;

/// Values at the edges.
pub trait Edges {
    /// An integer that is often at an edge.
    fn int(&mut self) -> u64;
    /// A float that is often special.
    fn float(&mut self) -> f64;
    /// Random bytes, fewer than `max`.
    fn junk(&mut self, max: u64) -> Vec<u8>;
    /// `len` random bytes.
    fn bytes(&mut self, len: usize) -> Vec<u8>;
}

impl Edges for Rng {
    fn int(&mut self) -> u64 {
        const EDGES: &[u64] = &[
            0,
            1,
            2,
            u64::MAX,
            i64::MAX as u64,
            i64::MIN as u64,
            u32::MAX as u64,
            i32::MAX as u64,
            i32::MIN as i64 as u64,
            1 << 53,
            1_000,
            86_400_000,
            4_102_444_800_000,
        ];
        match self.below(4) {
            0 => EDGES[self.below(EDGES.len() as u64) as usize],
            1 => self.below(16),
            2 => self.below(100_000),
            _ => self.next_u64(),
        }
    }

    fn float(&mut self) -> f64 {
        const SPECIAL: &[f64] = &[
            0.0,
            -0.0,
            1.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN_POSITIVE,
            1e-300,
        ];
        if self.chance(0.5) {
            SPECIAL[self.below(SPECIAL.len() as u64) as usize]
        } else {
            f64::from_bits(self.next_u64())
        }
    }

    fn junk(&mut self, max: u64) -> Vec<u8> {
        let len = self.below(max) as usize;
        self.bytes(len)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}
