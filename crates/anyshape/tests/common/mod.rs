//! Helpers shared by the compiled-model tests: seeded inputs at given dims.

use anyshape::TensorType;

/// A linear congruential generator: a test's inputs from its seed.
pub struct Lcg(u64);

impl Lcg {
    const A: u64 = 6364136223846793005;
    const C: u64 = 1442695040888963407;

    pub fn new(seed: u64) -> Lcg {
        Lcg(seed.wrapping_mul(Self::A).wrapping_add(Self::C))
    }
    pub fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(Self::A).wrapping_add(Self::C);
        (self.0 >> 33) as u32
    }
    /// A float in [-2, 2) (`next` gives 31 bits).
    pub fn unit(&mut self) -> f32 {
        self.next() as f32 / (1u64 << 31) as f32 * 4.0 - 2.0
    }
}

/// The shape of `ty` with its symbols bound to `dims`.
pub fn shape_at(ty: &TensorType, dims: &[(&str, usize)]) -> Vec<usize> {
    ty.shape
        .iter()
        .map(|d| d.eval(&|s| dims.iter().find(|(n, _)| *n == s).map(|x| x.1 as i64)).expect("dim") as usize)
        .collect()
}
