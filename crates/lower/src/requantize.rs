//! A requantization of codes in one rounding. A quantized residual block's
//! sum, `q(dq(q(acc)) + dq(shortcut))`, reaches its last rounding through the
//! operations the graph spells: each code less its zero point, times its
//! scale, the two added, the sum divided by the output's scale. That value is
//! an affine function of two codes (the product's, an integer the program
//! computed, and the shortcut's byte), so the program computes it as
//! `mul_add(q, a, mul_add(r, b, c))` instead, where that rounds to the same
//! integer as the graph's operations for every pair of codes: the rewrite is
//! checked on all of them (at most 65,536) when the model is lowered, with
//! the constant `c` moved by a few units in the last place where the first
//! one misses a pair, and not made where no candidate gives every pair's
//! integer. The generated code then has two multiply-adds where it had two
//! subtractions, three products, a sum and a quotient.

use plan::{Activation, MatEpilogue, Pointwise, PwBinary, PwOp, PwUnary};

/// The most combinations of codes checked.
const MAX_CHECKED: usize = 1 << 16;

/// How many units in the last place the constant is moved each way.
const NUDGES: u32 = 8;

/// `e` with its program's last quantization computed in one rounding where
/// [`in_one_rounding`] finds it can be, and a signed code's shift to a byte's
/// after it moved into it where [`shift_folded`] can; `sums`: the most an
/// integer product's accumulator can be (`None`: not known).
pub(crate) fn requantized(e: MatEpilogue, sums: Option<f64>) -> MatEpilogue {
    let Activation::Pointwise(p) = e.activation else { return e };
    let residual_codes = e.residual.is_some() && e.residual_codes;
    let p = in_one_rounding(&p, residual_codes).unwrap_or(p);
    // The program's input is the accumulator (times a scale): nothing else
    // is added to it first.
    let alone = e.column_scale.is_none() && e.bias.is_none() && (e.residual.is_none() || p.reads_residual());
    let input = sums.filter(|_| alone).map(|m| m * f64::from(e.scale.unwrap_or(1.0).abs()));
    let p = input.and_then(|m| shift_folded(&p, m, residual_codes)).unwrap_or(p);
    MatEpilogue { activation: Activation::Pointwise(p), ..e }
}

/// `p` ending in `integer(round(y), offset, lo, hi) + k` (or `- k`, an
/// integral constant: an int8 code made a byte's, `q + 128`) as
/// `integer(round(y), offset + k, lo + k, hi + k)`: the same value wherever
/// the integer of `round(y)` plus either offset stays inside i32 (a wrap
/// would tell them apart), which holds where `|y|` is below 2^30 for every
/// input within `±input` (an interval of `y` through the program's
/// operations) and the offsets, bounds and `k` are within ±2^24 (where the
/// program's f32 sum is exact too). Then the program ends in its quantization, which the kernels
/// store on integers. `None` where it does not apply or is not shown safe.
pub(crate) fn shift_folded(p: &Pointwise, input: f64, residual_codes: bool) -> Option<Pointwise> {
    let ops = p.ops();
    let last = ops.len().checked_sub(1)?;
    let PwOp::Binary(op @ (PwBinary::Add | PwBinary::Sub), a, b) = ops[last] else { return None };
    let PwOp::Integer { x: rounded, offset, lo, hi } = ops[a as usize] else { return None };
    let PwOp::Const(bits) = ops[b as usize] else { return None };
    let PwOp::Unary(PwUnary::Round, y) = ops[rounded as usize] else { return None };
    let k = f64::from(f32::from_bits(bits)) * if op == PwBinary::Sub { -1.0 } else { 1.0 };
    // Every integer involved within f32's exact ones (the program adds `k`
    // in f32), far from i32's ends.
    const EXACT: u32 = 1 << 24;
    let small = [offset, lo, hi].iter().all(|v| v.unsigned_abs() <= EXACT);
    if k.fract() != 0.0 || k.abs() > f64::from(EXACT) || !small {
        return None;
    }
    let (ylo, yhi) = interval(ops, y, input, residual_codes)?;
    if ylo.abs().max(yhi.abs()) >= f64::from(1 << 30) {
        return None;
    }
    let k = k as i32;
    let (lo, hi) = (lo + k, hi + k);
    if lo.unsigned_abs().max(hi.unsigned_abs()) > EXACT {
        return None;
    }
    let mut out = Pointwise::empty();
    for op in &ops[..a as usize] {
        out.push(*op)?;
    }
    out.push(PwOp::Integer { x: rounded, offset: offset + k, lo, hi })?;
    Some(out)
}

/// Bounds of operation `i`'s values where the input lies within `±input`:
/// through constants, codes, sums, differences, negations, products,
/// quotients by a constant away from zero, multiply-adds and roundings;
/// `None` for anything else (or a bound that is not finite).
fn interval(ops: &[PwOp], i: u8, input: f64, residual_codes: bool) -> Option<(f64, f64)> {
    let at = |j: u8| interval(ops, j, input, residual_codes);
    let mul = |(a, b): (f64, f64), (c, d): (f64, f64)| {
        let v = [a * c, a * d, b * c, b * d];
        (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
    };
    // One unit in f32's last place at the largest bound, each way: a rounded
    // operation's error.
    let widen = |(a, b): (f64, f64)| {
        let ulp = a.abs().max(b.abs()) * f64::from(f32::EPSILON);
        (a - ulp, b + ulp)
    };
    let r = match ops[i as usize] {
        PwOp::Input => (-input, input),
        PwOp::Const(bits) => {
            let c = f64::from(f32::from_bits(bits));
            (c, c)
        }
        PwOp::Residual if residual_codes => (0.0, 255.0),
        PwOp::Integer { lo, hi, .. } => (f64::from(lo), f64::from(hi)),
        PwOp::Unary(PwUnary::Neg, a) => {
            let (l, h) = at(a)?;
            (-h, -l)
        }
        PwOp::Unary(PwUnary::Round, a) => {
            let (l, h) = at(a)?;
            (l - 0.5, h + 0.5)
        }
        PwOp::Binary(PwBinary::Add, a, b) => {
            let ((p, q), (r, s)) = (at(a)?, at(b)?);
            widen((p + r, q + s))
        }
        PwOp::Binary(PwBinary::Sub, a, b) => {
            let ((p, q), (r, s)) = (at(a)?, at(b)?);
            widen((p - s, q - r))
        }
        PwOp::Binary(PwBinary::Mul, a, b) => widen(mul(at(a)?, at(b)?)),
        PwOp::Binary(PwBinary::Div, a, b) => {
            let (c, d) = at(b)?;
            if c != d || c == 0.0 {
                return None;
            }
            widen(mul(at(a)?, (1.0 / c, 1.0 / c)))
        }
        PwOp::MulAdd(a, b, c) => {
            let ((p, q), (r, s)) = (mul(at(a)?, at(b)?), at(c)?);
            widen((p + r, q + s))
        }
        _ => return None,
    };
    (r.0.is_finite() && r.1.is_finite()).then_some(r)
}

/// A code the value depends on: the operation computing it, and its values
/// (`lo..=hi`, every one an integer).
#[derive(Clone, Copy, PartialEq)]
struct Code {
    at: u8,
    lo: i32,
    hi: i32,
}

/// An affine function of the codes (at most two): coefficients and constant,
/// in f64.
#[derive(Clone, Copy)]
struct Affine {
    k: [f64; 2],
    c: f64,
}

impl Affine {
    fn constant(c: f64) -> Self {
        Affine { k: [0.0; 2], c }
    }
    fn is_constant(&self) -> bool {
        self.k == [0.0; 2]
    }
    fn combine(self, o: Affine, f: impl Fn(f64, f64) -> f64) -> Self {
        Affine { k: [f(self.k[0], o.k[0]), f(self.k[1], o.k[1])], c: f(self.c, o.c) }
    }
    fn scaled(self, s: f64) -> Self {
        Affine { k: self.k.map(|k| k * s), c: self.c * s }
    }
}

/// `p` (constants not yet parameters) with the value that its last operation,
/// `integer(round(y), ...)`, rounds computed as an affine function of codes in
/// fused multiply-adds, where `y` is one and the rewrite gives the same
/// integer for every combination of codes; `residual_codes`: the residual
/// ([`PwOp::Residual`]) is a byte's value. `None` where it does not apply or
/// would not be smaller.
pub(crate) fn in_one_rounding(p: &Pointwise, residual_codes: bool) -> Option<Pointwise> {
    let ops = p.ops();
    let last = u8::try_from(ops.len().checked_sub(1)?).ok()?;
    // The last quantization: what comes after it (a signed code made a
    // byte's, `q + 128`) reads it and constants alone.
    let at = (0..=last)
        .rev()
        .find(|&i| matches!(ops[i as usize], PwOp::Integer { .. }) && only_from(ops, last, i))?;
    let PwOp::Integer { x: rounded, offset, lo, hi } = ops[at as usize] else { return None };
    let PwOp::Unary(PwUnary::Round, y) = ops[rounded as usize] else { return None };
    // A signed code made a byte's after it (`q + 128`) moves into the
    // quantization's offset and bounds, where the sum cannot wrap (the check
    // below compares the program's own values).
    let shifted = match ops[last as usize] {
        PwOp::Binary(op @ (PwBinary::Add | PwBinary::Sub), a, b) if a == at => match ops[b as usize] {
            PwOp::Const(bits) => {
                let k = f64::from(f32::from_bits(bits)) * if op == PwBinary::Sub { -1.0 } else { 1.0 };
                let fits = k.fract() == 0.0 && k.abs() <= f64::from(1 << 24);
                fits.then(|| (offset + k as i32, lo + k as i32, hi + k as i32))
            }
            _ => None,
        },
        _ => None,
    };
    let (checked, (offset, lo, hi)) = match shifted {
        Some(bounds) => (*p, bounds),
        None => (p.prefix(at + 1), (offset, lo, hi)),
    };
    let (mut codes, mut spelled) = (Vec::new(), 0usize);
    let f = affine(ops, y, residual_codes, &mut codes, &mut spelled)?;
    // A code the value does not depend on after all stays out.
    let used: Vec<usize> = (0..codes.len()).filter(|&i| f.k[i] != 0.0).collect();
    if used.is_empty() || spelled <= used.len() || ![f.c, f.k[0], f.k[1]].iter().all(|v| v.is_finite()) {
        return None;
    }
    let mut codes: Vec<Code> = used.iter().map(|&i| codes[i]).collect();
    let mut k: Vec<f32> = used.iter().map(|&i| f.k[i] as f32).collect();
    // The residual inner, the product's code outer, in whatever order the
    // graph adds them: layers that differ in that share a kernel.
    if codes.len() == 2 && ops[codes[0].at as usize] == PwOp::Residual {
        codes.swap(0, 1);
        k.swap(0, 1);
    }
    let count = codes.iter().map(|c| (c.hi - c.lo) as usize + 1).product::<usize>();
    if count > MAX_CHECKED || k.iter().any(|k| !k.is_finite() || *k == 0.0) {
        return None;
    }
    // Every combination of the codes' values and the integer the program
    // quantizes them to (what follows it is a function of that alone), or,
    // shifted, the program's value.
    let mut cases = Vec::with_capacity(count);
    each_combination(&codes, |v| {
        let fixed: Vec<(u8, f32)> = codes.iter().zip(v).map(|(c, v)| (c.at, *v)).collect();
        let want = checked.eval_fixing(f32::NAN, f32::NAN, &[], &fixed);
        cases.push(([v[0], v.get(1).copied().unwrap_or(0.0)], want));
        true
    });
    let k2 = [k[0], k.get(1).copied().unwrap_or(0.0)];
    let (swap, k2, c) = search(&cases, codes.len(), k2, f.c as f32, (offset, lo, hi))?;
    k = k2[..codes.len()].to_vec();
    if swap {
        codes.swap(0, 1);
        k.swap(0, 1);
    }
    // The new program: each code's own computation, then the multiply-adds.
    let mut out = Pointwise::empty();
    let mut map = std::collections::HashMap::new();
    let code_at: Vec<u8> =
        codes.iter().map(|code| copy(ops, code.at, &mut out, &mut map)).collect::<Option<_>>()?;
    let constant = |out: &mut Pointwise, v: f32| out.push(PwOp::Const(v.to_bits()));
    let mut sum = constant(&mut out, c)?;
    for (i, code) in code_at.iter().enumerate().rev() {
        let k = constant(&mut out, k[i])?;
        sum = out.push(PwOp::MulAdd(*code, k, sum))?;
    }
    let r = out.push(PwOp::Unary(PwUnary::Round, sum))?;
    let q = out.push(PwOp::Integer { x: r, offset, lo, hi })?;
    if shifted.is_none() {
        map.insert(at, q);
        copy(ops, last, &mut out, &mut map)?;
    }
    Some(out)
}

/// Whether the value of operation `i` depends on operation `on` and constants alone.
fn only_from(ops: &[PwOp], i: u8, on: u8) -> bool {
    if i == on {
        return true;
    }
    match ops[i as usize] {
        PwOp::Const(_) => true,
        PwOp::Input | PwOp::Residual | PwOp::Param(_) => false,
        PwOp::Unary(_, a) | PwOp::Integer { x: a, .. } => only_from(ops, a, on),
        PwOp::Binary(_, a, b) => only_from(ops, a, on) && only_from(ops, b, on),
        PwOp::MulAdd(a, b, c) => [a, b, c].into_iter().all(|x| only_from(ops, x, on)),
        PwOp::Select(_, a, b, t, f) => [a, b, t, f].into_iter().all(|x| only_from(ops, x, on)),
    }
}

/// A multiply-add form that gives every case's integer: whether the codes
/// swap places (the second the outer multiply-add), the coefficients and the
/// constant. The coefficients are tried as rounded and a unit in the last
/// place each way, the constant as rounded and up to [`NUDGES`] units each
/// way; the cases a candidate missed are checked first for the next.
fn search(
    cases: &[([f32; 2], f32)],
    n: usize,
    k: [f32; 2],
    c: f32,
    (offset, lo, hi): (i32, i32, i32),
) -> Option<(bool, [f32; 2], f32)> {
    let ulps = |v: f32, n: u32| -> [f32; 2] {
        let (mut up, mut down) = (v, v);
        (0..n).for_each(|_| (up, down) = (up.next_up(), down.next_down()));
        [up, down]
    };
    let around = |v: f32, most: u32| std::iter::once(v).chain((1..=most).flat_map(move |n| ulps(v, n)));
    let form = |[q, r]: [f32; 2], swap: bool, [k0, k1]: [f32; 2], c: f32| {
        let y = match (n, swap) {
            (1, _) => q.mul_add(k0, c),
            (_, false) => q.mul_add(k0, r.mul_add(k1, c)),
            (_, true) => r.mul_add(k1, q.mul_add(k0, c)),
        };
        plan::integer(y.round_ties_even(), offset, lo, hi)
    };
    let mut hard: Vec<usize> = Vec::new();
    for swap in [false, true].into_iter().take(n) {
        for k0 in around(k[0], 1) {
            for k1 in around(k[1], if n == 2 { 1 } else { 0 }) {
                for c in around(c, NUDGES) {
                    let miss = |i: &usize| form(cases[*i].0, swap, [k0, k1], c) != cases[*i].1;
                    if hard.iter().any(miss) {
                        continue;
                    }
                    match (0..cases.len()).find(miss) {
                        Some(i) => hard.push(i),
                        None => return Some((swap, [k0, k1], c)),
                    }
                }
            }
        }
    }
    None
}

/// Whether `check` holds for every combination of the codes' values.
fn each_combination(codes: &[Code], mut check: impl FnMut(&[f32]) -> bool) -> bool {
    let mut v: Vec<i32> = codes.iter().map(|c| c.lo).collect();
    loop {
        let values: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        if !check(&values) {
            return false;
        }
        // The next combination, the last code fastest.
        let mut i = codes.len();
        loop {
            if i == 0 {
                return true;
            }
            i -= 1;
            if v[i] < codes[i].hi {
                v[i] += 1;
                break;
            }
            v[i] = codes[i].lo;
        }
    }
}

/// The value of operation `i` as an affine function of codes: a residual of
/// bytes, or an integer the program computed with at most 256 values (adding
/// them to `codes`, at most two), through constants, sums, differences,
/// negations, products with a constant and quotients by one; `spelled`
/// counts the operations it goes through. `None` where it is not one.
fn affine(
    ops: &[PwOp],
    i: u8,
    residual_codes: bool,
    codes: &mut Vec<Code>,
    spelled: &mut usize,
) -> Option<Affine> {
    let mut code = |c: Code| -> Option<Affine> {
        let slot = match codes.iter().position(|d| *d == c) {
            Some(s) => s,
            None if codes.len() < 2 => {
                codes.push(c);
                codes.len() - 1
            }
            None => return None,
        };
        let mut k = [0.0; 2];
        k[slot] = 1.0;
        Some(Affine { k, c: 0.0 })
    };
    let f = match ops[i as usize] {
        PwOp::Const(bits) => return Some(Affine::constant(f64::from(f32::from_bits(bits)))),
        PwOp::Residual if residual_codes => return code(Code { at: i, lo: 0, hi: 255 }),
        PwOp::Integer { lo, hi, .. } if i64::from(hi) - i64::from(lo) < 256 => {
            return code(Code { at: i, lo, hi })
        }
        PwOp::Unary(PwUnary::Neg, a) => affine(ops, a, residual_codes, codes, spelled)?.scaled(-1.0),
        PwOp::Binary(op, a, b) => {
            let x = affine(ops, a, residual_codes, codes, spelled)?;
            let y = affine(ops, b, residual_codes, codes, spelled)?;
            match op {
                PwBinary::Add => x.combine(y, |p, q| p + q),
                PwBinary::Sub => x.combine(y, |p, q| p - q),
                PwBinary::Mul if y.is_constant() => x.scaled(y.c),
                PwBinary::Mul if x.is_constant() => y.scaled(x.c),
                PwBinary::Div if y.is_constant() && y.c != 0.0 => x.scaled(1.0 / y.c),
                _ => return None,
            }
        }
        _ => return None,
    };
    *spelled += 1;
    Some(f)
}

/// Copy operation `i` and what it reads into `out` (each once: `map` maps
/// `ops`' indices to `out`'s).
fn copy(ops: &[PwOp], i: u8, out: &mut Pointwise, map: &mut std::collections::HashMap<u8, u8>) -> Option<u8> {
    if let Some(&j) = map.get(&i) {
        return Some(j);
    }
    let mut m = |a: u8, out: &mut Pointwise| copy(ops, a, out, map);
    let op = match ops[i as usize] {
        op @ (PwOp::Input | PwOp::Residual | PwOp::Const(_) | PwOp::Param(_)) => op,
        PwOp::Unary(u, a) => PwOp::Unary(u, m(a, out)?),
        PwOp::Binary(b, x, y) => {
            let x = m(x, out)?;
            PwOp::Binary(b, x, m(y, out)?)
        }
        PwOp::Select(c, a, b, t, f) => {
            let [a, b, t, f] = [m(a, out)?, m(b, out)?, m(t, out)?, m(f, out)?];
            PwOp::Select(c, a, b, t, f)
        }
        PwOp::MulAdd(a, b, c) => {
            let [a, b, c] = [m(a, out)?, m(b, out)?, m(c, out)?];
            PwOp::MulAdd(a, b, c)
        }
        PwOp::Integer { x, offset, lo, hi } => PwOp::Integer { x: m(x, out)?, offset, lo, hi },
    };
    let j = out.push(op)?;
    map.insert(i, j);
    Some(j)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quantized residual block's sum as the graph spells it:
    /// `q(dq(q(x), z, s0) + dq(r, 0, s1), 0, s2)`.
    fn residual_sum(z: f32, s0: f32, s1: f32, s2: f32) -> Pointwise {
        residual_sum_of((0, 255), [z, s0, s1, s2], (0, 0, 255))
    }

    /// The same of codes within `lo..=hi`, its output quantized with
    /// `(offset, lo, hi)`.
    fn residual_sum_of((lo, hi): (i32, i32), [z, s0, s1, s2]: [f32; 4], out: (i32, i32, i32)) -> Pointwise {
        let mut p = Pointwise::empty();
        let mut push = |op| p.push(op).expect("room");
        let x = push(PwOp::Input);
        let r = push(PwOp::Unary(PwUnary::Round, x));
        let q = push(PwOp::Integer { x: r, offset: z as i32, lo, hi });
        let [z, s0, s1, s2] = [z, s0, s1, s2].map(|v| push(PwOp::Const(v.to_bits())));
        let d = push(PwOp::Binary(PwBinary::Sub, q, z));
        let d = push(PwOp::Binary(PwBinary::Mul, d, s0));
        let res = push(PwOp::Residual);
        let e = push(PwOp::Binary(PwBinary::Mul, res, s1));
        let sum = push(PwOp::Binary(PwBinary::Add, d, e));
        let y = push(PwOp::Binary(PwBinary::Div, sum, s2));
        let r = push(PwOp::Unary(PwUnary::Round, y));
        push(PwOp::Integer { x: r, offset: out.0, lo: out.1, hi: out.2 });
        p
    }

    /// Both programs' values where the product's code is `q` (an integer
    /// input, which the inner quantization keeps) and the shortcut's `r`, at
    /// every pair; and at inputs between integers, past the codes' range,
    /// infinite and NaN (the inner quantization is copied as it is).
    fn assert_same(p: &Pointwise, q: &Pointwise, offset: i32) {
        for c in 0..=255 {
            for r in 0..=255 {
                let x = (c - offset) as f32;
                let (a, b) = (p.eval_at(x, r as f32, &[]), q.eval_at(x, r as f32, &[]));
                assert_eq!(a.to_bits(), b.to_bits(), "code {c}, residual {r}: {p} is {a}, {q} is {b}");
            }
        }
        for x in
            [0.5f32, -0.5, 1.5, 77.49, -300.0, 1e9, 3e10, -3e10, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]
        {
            for r in [0.0f32, 1.0, 254.0, 255.0] {
                assert_eq!(p.eval_at(x, r, &[]).to_bits(), q.eval_at(x, r, &[]).to_bits(), "{x}, {r}");
            }
        }
    }

    /// A residual block's sum (scales of QDQ ResNet-50's) is computed in two
    /// multiply-adds, the product's code outer, that give every pair of codes
    /// the graph's integer; so is one whose shortcut is added first.
    #[test]
    fn a_residual_blocks_sum_is_requantized_in_one_rounding() {
        let p = residual_sum(127.0, 0.01975097, 0.008843038, 0.013575584);
        let q = in_one_rounding(&p, true).expect("rewritten");
        let text = q.to_string();
        assert!(
            text.starts_with("integer(round(mul_add(integer(round(x), 127, 0..=255), 1.45")
                && text.contains(", mul_add(residual, 0.65")
                && text.ends_with("))), 0, 0..=255)"),
            "{text}"
        );
        assert!(q.ops().len() < p.ops().len(), "{q} is no shorter than {p}");
        assert_same(&p, &q, 127);
        assert_eq!(in_one_rounding(&p, false), None, "a residual of floats is no code");
    }

    /// Where rounded coefficients and a constant moved by a few units in the
    /// last place all miss a pair (the graph's roundings put a value just past
    /// a half that is just below one, and another the other way), the program
    /// is kept as it is.
    #[test]
    fn a_sum_no_multiply_add_rounds_alike_is_kept() {
        let p = residual_sum(139.0, 0.03195672, 0.022827238, 0.030112226);
        assert_eq!(in_one_rounding(&p, true), None);
    }

    /// A signed code made a byte's after the quantization (`q + 128`, as the
    /// product stores int8 activations for u8·s8) moves into the
    /// quantization's offset and bounds.
    #[test]
    fn a_signed_codes_shift_moves_into_the_quantization() {
        let scales = [-42.0, 0.047906358, 0.012259409, 0.03584665];
        let mut p = residual_sum_of((-128, 127), scales, (-128, -128, 127));
        let m = p.push(PwOp::Const((-128.0f32).to_bits())).expect("room");
        p.push(PwOp::Binary(PwBinary::Sub, m - 1, m)).expect("room");
        let q = in_one_rounding(&p, true).expect("rewritten");
        assert!(q.to_string().ends_with("))), 0, 0..=255)"), "{q}");
        for c in -128..=127 {
            for r in 0..=255 {
                let x = (c + 42) as f32;
                assert_eq!(
                    p.eval_at(x, r as f32, &[]),
                    q.eval_at(x, r as f32, &[]),
                    "code {c}, residual {r}"
                );
            }
        }
    }

    /// An int8 quantization made a byte's (`q + 128`, `quantize_static`'s default
    /// activations stored for u8·s8) ends in the quantization itself, its
    /// offset and bounds moved, where the accumulator (within ±2^31 here) keeps
    /// `round(y)` far from i32's ends; the same value at those ends and past
    /// them, NaN and infinities included, where it holds. Not where a scale
    /// could take `y` near them, nor for an input of unknown bounds.
    #[test]
    fn an_int8_codes_shift_to_bytes_moves_into_the_quantization() {
        let program = |s0: f32, s1: f32| {
            let mut p = Pointwise::empty();
            let mut push = |op| p.push(op).expect("room");
            let x = push(PwOp::Input);
            let [s0, s1, m] = [s0, s1, -128.0f32].map(|v| push(PwOp::Const(v.to_bits())));
            let y = push(PwOp::Binary(PwBinary::Mul, x, s0));
            let y = push(PwOp::Binary(PwBinary::Div, y, s1));
            let r = push(PwOp::Unary(PwUnary::Round, y));
            let q = push(PwOp::Integer { x: r, offset: -128, lo: -128, hi: 127 });
            push(PwOp::Binary(PwBinary::Sub, q, m));
            p
        };
        let p = program(3.0409823e-5, 0.006851318);
        let acc = 2f64.powi(31);
        let q = shift_folded(&p, acc, false).expect("folded");
        assert_eq!(q.to_string(), "integer(round(div(mul(x, 3.0409823e-5), 0.006851318)), 0, 0..=255)");
        for i in 0..=4096 {
            let x = (-2_147_483_648.0 + f64::from(i) * 1_048_576.0) as f32;
            for x in [x, x / 4096.0 + 0.37, x / 65536.0] {
                assert_eq!(p.eval(x).to_bits(), q.eval(x).to_bits(), "{x}");
            }
        }
        for x in [0.0f32, -0.0, 112.6, -112.6, 2_147_483_520.0, -2_147_483_648.0, f32::NAN] {
            assert_eq!(p.eval(x).to_bits(), q.eval(x).to_bits(), "{x}");
        }
        assert_eq!(shift_folded(&program(1.0, 0.5), acc, false), None, "y up to 2^32");
        assert_eq!(shift_folded(&p, f64::INFINITY, false), None, "an input of unknown bounds");
    }

    /// Programs whose rounded value is no affine function of codes, or whose
    /// last operation is no quantization, are kept.
    #[test]
    fn other_programs_are_kept() {
        let mut relu = Pointwise::empty();
        let x = relu.push(PwOp::Input).expect("room");
        let r = relu.push(PwOp::Unary(PwUnary::Round, x)).expect("room");
        relu.push(PwOp::Integer { x: r, offset: 0, lo: 0, hi: 255 }).expect("room");
        assert_eq!(in_one_rounding(&relu, true), None, "a value of the input itself");
        let mut sq = residual_sum(127.0, 0.02, 0.01, 0.013);
        let at = sq.ops().len() as u8 - 3;
        let mut ops = sq.ops().to_vec();
        ops[at as usize] = PwOp::Binary(PwBinary::Mul, at - 1, at - 1);
        sq = Pointwise::empty();
        ops.into_iter().for_each(|op| _ = sq.push(op).expect("room"));
        assert_eq!(in_one_rounding(&sq, true), None, "a square: {sq}");
        let mut after = residual_sum(127.0, 0.02, 0.01, 0.013);
        let r = after.push(PwOp::Residual).expect("room");
        after.push(PwOp::Binary(PwBinary::Add, 14, r)).expect("room");
        assert_eq!(in_one_rounding(&after, true), None, "the residual added after the quantization: {after}");
    }

    /// What follows the last quantization (reading it and constants alone)
    /// follows its rewrite.
    #[test]
    fn what_follows_the_quantization_is_kept() {
        let mut p = residual_sum(127.0, 0.02, 0.01, 0.013);
        p.push(PwOp::Unary(PwUnary::Tanh, 14)).expect("room");
        let q = in_one_rounding(&p, true).expect("rewritten");
        assert!(q.to_string().starts_with("tanh(integer(round(mul_add("), "{q}");
        assert_same(&p, &q, 127);
    }
}
