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

/// `graph` with the softmax `%p` (of type `p_ty`, `[b, h, q, k]`) that `%o`
/// multiplies made NaN-free as PyTorch's scaled-dot-product attention
/// exports it (`select(is_nan(p), 0, p)`), and its mask `%lmask` renamed
/// `%emask` (see [`empty_rows_mask`]).
#[allow(dead_code)] // Not every test binary guards a softmax.
pub fn guard_softmax_nans(graph: &str, p_ty: &str) -> String {
    let guard = format!(
        "  %nan: bool{p_ty} = is_nan %p
  %zero: f32[1, 1, 1, 1] = constant [0.0]
  %zb: f32{p_ty} = broadcast %zero
  %pz: f32{p_ty} = select %nan, %zb, %p
"
    );
    let at = graph.find("  %o: ").expect("an output %o");
    let (head, tail) = graph.split_at(at);
    format!("{head}{guard}{}", tail.replacen("matmul %p, %v", "matmul %pz, %v", 1))
        .replace("%lmask", "%emask")
}

/// An additive mask of `n` values over rows of `keys`: -inf over the first
/// third of the first row's keys and every key of the later rows (whose
/// attention rows are then empty), 0 elsewhere.
#[allow(dead_code)] // Not every test binary guards a softmax.
pub fn empty_rows_mask(n: usize, keys: usize) -> Vec<f32> {
    (0..n).map(|i| if i >= keys || i % keys < keys / 3 { f32::NEG_INFINITY } else { 0.0 }).collect()
}
