//! A small seeded generator (SplitMix64): the same seed gives the same
//! inputs, so a run can be repeated exactly.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }

    /// An integer that is often at an edge.
    pub fn int(&mut self) -> u64 {
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
            _ => self.next(),
        }
    }

    /// A float that is often special.
    pub fn float(&mut self) -> f64 {
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
            f64::from_bits(self.next())
        }
    }

    /// Random bytes, fewer than `max`.
    pub fn junk(&mut self, max: u64) -> Vec<u8> {
        let len = self.below(max) as usize;
        self.bytes(len)
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}
