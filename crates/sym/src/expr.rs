//! `SymExpr`: a symbolic dimension in canonical form.
//!
//! An expression is a polynomial with integer coefficients over *atoms*: symbols and
//! the non-polynomial operators floor-div and mod by a positive constant, min and max.
//! Every constructor returns the canonical form, so structural equality is semantic
//! equality for everything the rules below can prove (`batch*seq*12/12 == seq*batch`).
//!
//! Canonical rules (each holds for every integer binding of the symbols):
//! - sums and products are expanded, like terms merged, zero terms dropped;
//! - `(c*q + r)/c = q + r/c` for integer `q`: coefficients are split by Euclidean
//!   division, so the argument of a remaining floor-div has coefficients in `[0, c)`;
//! - common factors are cancelled: for `g` the gcd of `c` and the non-constant
//!   coefficients, `(g*m + k)/(g*c') = (m + k/g)/c'` and
//!   `(g*m + k)%(g*c') = g*((m + k/g)%c') + k%g`;
//! - `(m + x/a)/c = (a*m + x)/(a*c)` (so `(x/a)/b = x/(a*b)`; kept nested when
//!   `a*c` overflows), and `(m + k*(x%a))%c = (m + k*x)%c` when `c` divides `a`;
//! - `r%c = r` and `r/c = 0` when `0 <= r < c` follows from the ranges of the `x%a`
//!   atoms of `r` alone (`(x%a)%c = x%a` when `a <= c`);
//! - `min`/`max` are flattened (also through a constant offset), de-duplicated,
//!   constant-folded; an argument that differs from another by a constant is
//!   dropped when dominated; the smallest constant term is pulled out
//!   (`max(a+2, b+1) = max(a+1, b)+1`) and the arguments are sorted.
//!
//! The rules are sound, not complete: `x - 2*(x/2)` and `x%2` stay different, as do
//! some divisions of expressions that already hold divisions or remainders
//! (`2*(a%3)/3` and `5*(a%3)/7` are both 0).
//!
//! Arithmetic is checked: the `try_` methods and [`SymExpr::eval`] return
//! [`SymError::Overflow`] instead of wrapping or panicking; only the `+`, `-`, `*`
//! operators panic on overflow.
//!
//! `SymExpr` deliberately has no `Ord` impl: `Ord::min`/`Ord::max` would shadow the
//! symbolic [`SymExpr::min`]/[`SymExpr::max`] on owned values and silently compare
//! structure. [`SymExpr::canonical_cmp`] is the (structural) total order.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use crate::SymError;

/// A symbolic dimension in canonical form. Cheap to clone for the common cases.
#[derive(Clone, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct SymExpr {
    /// Terms sorted by monomial; no zero coefficients; the constant term has the
    /// empty monomial (which sorts first).
    terms: Vec<(Monomial, i64)>,
}

/// A product of atoms with positive powers, sorted by atom.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize)]
struct Monomial(Vec<(Atom, u32)>);

#[derive(Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
enum Atom {
    Sym(Arc<str>),
    Div(Box<SymExpr>, i64),
    Mod(Box<SymExpr>, i64),
    Min(Vec<SymExpr>),
    Max(Vec<SymExpr>),
}

fn overflow() -> SymError {
    SymError::Overflow
}

impl Ord for Atom {
    fn cmp(&self, o: &Atom) -> Ordering {
        fn rank(a: &Atom) -> u8 {
            match a {
                Atom::Sym(_) => 0,
                Atom::Div(..) => 1,
                Atom::Mod(..) => 2,
                Atom::Min(_) => 3,
                Atom::Max(_) => 4,
            }
        }
        fn list(a: &[SymExpr], b: &[SymExpr]) -> Ordering {
            a.iter().map(|e| &e.terms).cmp(b.iter().map(|e| &e.terms))
        }
        match (self, o) {
            (Atom::Sym(a), Atom::Sym(b)) => a.cmp(b),
            (Atom::Div(a, c), Atom::Div(b, d)) | (Atom::Mod(a, c), Atom::Mod(b, d)) => {
                a.canonical_cmp(b).then(c.cmp(d))
            }
            (Atom::Min(a), Atom::Min(b)) | (Atom::Max(a), Atom::Max(b)) => list(a, b),
            _ => rank(self).cmp(&rank(o)),
        }
    }
}

impl PartialOrd for Atom {
    fn partial_cmp(&self, o: &Atom) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl SymExpr {
    /// The integer constant `v`.
    pub fn constant(v: i64) -> SymExpr {
        if v == 0 {
            return SymExpr::default();
        }
        SymExpr { terms: vec![(Monomial::default(), v)] }
    }

    /// The symbol named `name`.
    pub fn symbol(name: &str) -> SymExpr {
        SymExpr::from_atom(Atom::Sym(Arc::from(name)))
    }

    fn from_atom(a: Atom) -> SymExpr {
        SymExpr { terms: vec![(Monomial(vec![(a, 1)]), 1)] }
    }

    /// A total order on canonical forms: structural, not numeric (`a` sorts before
    /// `2*a`, constants before symbols). Used to sort `min`/`max` arguments.
    pub fn canonical_cmp(&self, other: &SymExpr) -> Ordering {
        self.terms.cmp(&other.terms)
    }

    /// `Some(v)` when the expression is the constant `v`.
    pub fn as_const(&self) -> Option<i64> {
        match self.terms.as_slice() {
            [] => Some(0),
            [(m, c)] if m.0.is_empty() => Some(*c),
            _ => None,
        }
    }

    /// `Some(name)` when the expression is exactly one symbol.
    pub fn as_symbol(&self) -> Option<&str> {
        match self.terms.as_slice() {
            [(m, 1)] => match m.0.as_slice() {
                [(Atom::Sym(s), 1)] => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether a `min` or `max` occurs anywhere in the expression.
    pub fn has_minmax(&self) -> bool {
        self.terms.iter().any(|(m, _)| {
            m.0.iter().any(|(a, _)| match a {
                Atom::Min(_) | Atom::Max(_) => true,
                Atom::Div(e, _) | Atom::Mod(e, _) => e.has_minmax(),
                Atom::Sym(_) => false,
            })
        })
    }

    /// `Some((is_max, args))` when the expression is exactly one `min`/`max`.
    pub fn as_minmax(&self) -> Option<(bool, &[SymExpr])> {
        match self.single_atom() {
            Some((Atom::Min(v), 1)) => Some((false, v)),
            Some((Atom::Max(v), 1)) => Some((true, v)),
            _ => None,
        }
    }

    /// The constant term.
    pub fn constant_term(&self) -> i64 {
        match self.terms.first() {
            Some((m, c)) if m.0.is_empty() => *c,
            _ => 0,
        }
    }

    /// Every symbol the expression mentions, at any depth.
    pub fn symbols(&self) -> BTreeSet<Arc<str>> {
        let mut out = BTreeSet::new();
        self.collect_symbols(&mut out);
        out
    }

    fn collect_symbols(&self, out: &mut BTreeSet<Arc<str>>) {
        for (m, _) in &self.terms {
            for (a, _) in &m.0 {
                match a {
                    Atom::Sym(s) => {
                        out.insert(s.clone());
                    }
                    Atom::Div(e, _) | Atom::Mod(e, _) => e.collect_symbols(out),
                    Atom::Min(v) | Atom::Max(v) => v.iter().for_each(|e| e.collect_symbols(out)),
                }
            }
        }
    }

    /// `a + b`.
    pub fn try_add(&self, other: &SymExpr) -> Result<SymExpr, SymError> {
        let mut terms = Vec::with_capacity(self.terms.len() + other.terms.len());
        let (mut i, mut j) = (0, 0);
        while i < self.terms.len() || j < other.terms.len() {
            let ord = match (self.terms.get(i), other.terms.get(j)) {
                (Some(a), Some(b)) => a.0.cmp(&b.0),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            match ord {
                std::cmp::Ordering::Less => {
                    terms.push(self.terms[i].clone());
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    terms.push(other.terms[j].clone());
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    let c = self.terms[i].1.checked_add(other.terms[j].1).ok_or_else(overflow)?;
                    if c != 0 {
                        terms.push((self.terms[i].0.clone(), c));
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        Ok(SymExpr { terms })
    }

    /// `k * a`.
    pub fn try_scale(&self, k: i64) -> Result<SymExpr, SymError> {
        if k == 0 {
            return Ok(SymExpr::default());
        }
        let terms = self
            .terms
            .iter()
            .map(|(m, c)| Ok((m.clone(), c.checked_mul(k).ok_or_else(overflow)?)))
            .collect::<Result<_, SymError>>()?;
        Ok(SymExpr { terms })
    }

    /// `a - b`.
    pub fn try_sub(&self, other: &SymExpr) -> Result<SymExpr, SymError> {
        self.try_add(&other.try_scale(-1)?)
    }

    /// `a * b`, expanded.
    pub fn try_mul(&self, other: &SymExpr) -> Result<SymExpr, SymError> {
        if let Some(k) = other.as_const() {
            return self.try_scale(k);
        }
        if let Some(k) = self.as_const() {
            return other.try_scale(k);
        }
        let mut acc = SymExpr::default();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let c = ca.checked_mul(*cb).ok_or_else(overflow)?;
                let term = SymExpr { terms: vec![(ma.mul(mb)?, c)] };
                acc = acc.try_add(&term)?;
            }
        }
        Ok(acc)
    }

    /// Floor division by the positive constant `c`.
    pub fn try_floor_div(&self, c: i64) -> Result<SymExpr, SymError> {
        if c <= 0 {
            return Err(SymError::NonPositiveDivisor(c));
        }
        if c == 1 {
            return Ok(self.clone());
        }
        let (q, r) = self.split_by(c);
        let rest = if let Some(rv) = r.as_const() {
            SymExpr::constant(rv.div_euclid(c))
        } else {
            let (r, c, _) = r.cancel_common(c);
            if c == 1 {
                r
            } else if let Some(e) = r.merge_nested_div(c) {
                e?
            } else if r.mod_bound().is_some_and(|b| b < c) {
                // 0 <= r < c
                SymExpr::default()
            } else {
                SymExpr::from_atom(Atom::Div(Box::new(r), c))
            }
        };
        q.try_add(&rest)
    }

    /// `(m + x/a)/c = (a*m + x)/(a*c)` for the first term `x/a` (coefficient 1) of
    /// `self`; `None` when there is none, or when the rewrite would overflow (the
    /// nested form is exact, just not representable merged).
    fn merge_nested_div(&self, c: i64) -> Option<Result<SymExpr, SymError>> {
        let at =
            self.terms.iter().position(|(m, k)| *k == 1 && matches!(m.0.as_slice(), [(Atom::Div(..), 1)]))?;
        let [(Atom::Div(x, a), 1)] = self.terms[at].0 .0.as_slice() else { return None };
        let mut m = self.clone();
        m.terms.remove(at);
        let ac = a.checked_mul(c)?;
        let num = m.try_scale(*a).and_then(|am| am.try_add(x)).ok()?;
        Some(num.try_floor_div(ac))
    }

    /// Ceiling division by the positive constant `c`: `(a - 1)/c + 1`.
    pub fn try_ceil_div(&self, c: i64) -> Result<SymExpr, SymError> {
        if c <= 0 {
            return Err(SymError::NonPositiveDivisor(c));
        }
        self.try_sub(&SymExpr::constant(1))?.try_floor_div(c)?.try_add(&SymExpr::constant(1))
    }

    /// Euclidean remainder by the positive constant `c` (result in `[0, c)`).
    pub fn try_rem(&self, c: i64) -> Result<SymExpr, SymError> {
        if c <= 0 {
            return Err(SymError::NonPositiveDivisor(c));
        }
        let (_, r) = self.split_by(c);
        if let Some(rv) = r.as_const() {
            return Ok(SymExpr::constant(rv.rem_euclid(c)));
        }
        let (r, cc, low) = r.cancel_common(c);
        let g = c / cc;
        // self % c = g*(r % cc) + low
        let low = SymExpr::constant(low);
        if cc == 1 {
            return Ok(low);
        }
        // (m + k*(x%a)) % cc = (m + k*x) % cc when cc divides a.
        let nested = r.terms.iter().enumerate().find_map(|(i, (m, k))| match m.0.as_slice() {
            [(Atom::Mod(x, a), 1)] if a % cc == 0 => Some((i, x, *k)),
            _ => None,
        });
        if let Some((i, x, k)) = nested {
            let mut m = r.clone();
            m.terms.remove(i);
            if let Ok(e) = x.try_scale(k).and_then(|kx| kx.try_add(&m)) {
                return e.try_rem(cc)?.try_scale(g)?.try_add(&low);
            }
        }
        let inner = if r.mod_bound().is_some_and(|b| b < cc) {
            r // 0 <= r < cc
        } else {
            SymExpr::from_atom(Atom::Mod(Box::new(r), cc))
        };
        inner.try_scale(g)?.try_add(&low)
    }

    /// `min(a, b)`.
    pub fn min(&self, other: &SymExpr) -> SymExpr {
        SymExpr::minmax(vec![self.clone(), other.clone()], false)
    }

    /// `max(a, b)`.
    pub fn max(&self, other: &SymExpr) -> SymExpr {
        SymExpr::minmax(vec![self.clone(), other.clone()], true)
    }

    /// `min(args...)` (`is_max == false`) or `max(args...)`, canonical.
    /// `args` should not be empty; an empty list gives `0`.
    ///
    /// Nested calls of the same kind are flattened, also through a constant offset
    /// (`max(max(a, b) - 1, c) = max(a - 1, b - 1, c)`); an argument dominated by
    /// another that differs from it by a constant is dropped; and the smallest
    /// constant term is pulled out (`max(a + 2, b + 1) = max(a + 1, b) + 1`), so
    /// that a shifted `min`/`max` has one form.
    pub fn minmax(args: Vec<SymExpr>, is_max: bool) -> SymExpr {
        let mut flat: Vec<SymExpr> = Vec::new();
        for a in args {
            let d = a.constant_term();
            let body = SymExpr { terms: a.terms.iter().filter(|(m, _)| !m.0.is_empty()).cloned().collect() };
            let inner = match body.single_atom() {
                Some((Atom::Max(v), 1)) if is_max => Some(v),
                Some((Atom::Min(v), 1)) if !is_max => Some(v),
                _ => None,
            };
            let shifted = inner
                .map(|v| v.iter().map(|e| e.try_add(&SymExpr::constant(d))).collect::<Result<Vec<_>, _>>());
            match shifted {
                Some(Ok(v)) => flat.extend(v),
                _ => flat.push(a),
            }
        }
        // Drop an argument dominated by another that differs from it by a constant.
        let mut keep: Vec<SymExpr> = Vec::new();
        'outer: for a in flat {
            for k in keep.iter_mut() {
                if let Ok(d) = a.try_sub(k) {
                    if let Some(d) = d.as_const() {
                        if (d > 0) == is_max && d != 0 {
                            *k = a;
                        }
                        continue 'outer;
                    }
                }
            }
            keep.push(a);
        }
        if keep.len() <= 1 {
            return keep.pop().unwrap_or_default();
        }
        // Pull out the smallest constant term (unless that would overflow).
        let d = keep.iter().map(SymExpr::constant_term).min().unwrap_or(0);
        let pulled = keep.iter().map(|e| e.try_sub(&SymExpr::constant(d))).collect::<Result<Vec<_>, _>>();
        let (mut keep, d) = match pulled {
            Ok(v) => (v, d),
            Err(_) => (keep, 0),
        };
        keep.sort_by(SymExpr::canonical_cmp);
        let atom = SymExpr::from_atom(if is_max { Atom::Max(keep) } else { Atom::Min(keep) });
        atom.try_add(&SymExpr::constant(d)).unwrap_or(atom)
    }

    /// For `self = g*m + k` (`k` the constant term, `0 <= k < c`, as `split_by`
    /// leaves it) and `g = gcd(coefficients of m, c)`: `(m + k/g, c/g, k%g)`, as
    /// `self/c = (m + k/g)/(c/g)` and `self%c = g*((m + k/g)%(c/g)) + k%g`.
    fn cancel_common(&self, c: i64) -> (SymExpr, i64, i64) {
        let k = self.constant_term();
        let m = SymExpr { terms: self.terms.iter().filter(|(m, _)| !m.0.is_empty()).cloned().collect() };
        let g = gcd(m.content(), c);
        if g <= 1 {
            return (self.clone(), c, 0);
        }
        let mut r = m.exact_div(g);
        if k.div_euclid(g) != 0 {
            r.terms.insert(0, (Monomial::default(), k.div_euclid(g)));
        }
        (r, c / g, k.rem_euclid(g))
    }

    /// The largest value of an expression whose coefficients are non-negative and
    /// whose atoms are all `x%a` (each in `[0, a)`), so its value is in
    /// `[0, bound]`; `None` for any other expression (or on overflow).
    fn mod_bound(&self) -> Option<i64> {
        let mut acc: i64 = 0;
        for (m, k) in &self.terms {
            let mut t = (*k >= 0).then_some(*k)?;
            for (a, p) in &m.0 {
                let Atom::Mod(_, a) = a else { return None };
                t = t.checked_mul((a - 1).checked_pow(*p)?)?;
            }
            acc = acc.checked_add(t)?;
        }
        Some(acc)
    }

    /// Split into `(q, r)` with `self = c*q + r` and every coefficient of `r` in `[0, c)`.
    fn split_by(&self, c: i64) -> (SymExpr, SymExpr) {
        let mut q = Vec::new();
        let mut r = Vec::new();
        for (m, k) in &self.terms {
            let (kq, kr) = (k.div_euclid(c), k.rem_euclid(c));
            if kq != 0 {
                q.push((m.clone(), kq));
            }
            if kr != 0 {
                r.push((m.clone(), kr));
            }
        }
        (SymExpr { terms: q }, SymExpr { terms: r })
    }

    /// gcd of all coefficients (0 for the zero expression; see [`gcd`] for the one
    /// exception).
    pub(crate) fn content(&self) -> i64 {
        self.terms.iter().fold(0, |g, (_, c)| gcd(g, *c))
    }

    /// Divide every coefficient by `g`, which must divide them all.
    pub(crate) fn exact_div(&self, g: i64) -> SymExpr {
        SymExpr { terms: self.terms.iter().map(|(m, c)| (m.clone(), c / g)).collect() }
    }

    fn single_atom(&self) -> Option<(&Atom, i64)> {
        match self.terms.as_slice() {
            [(m, c)] => match m.0.as_slice() {
                [(a, 1)] => Some((a, *c)),
                _ => None,
            },
            _ => None,
        }
    }

    /// Evaluate under `bind` (symbol name → value), with overflow checks.
    pub fn eval(&self, bind: &dyn Fn(&str) -> Option<i64>) -> Result<i64, SymError> {
        let mut acc: i64 = 0;
        for (m, c) in &self.terms {
            let mut t = *c;
            for (a, p) in &m.0 {
                let v = a.eval(bind)?.checked_pow(*p).ok_or_else(overflow)?;
                t = t.checked_mul(v).ok_or_else(overflow)?;
            }
            acc = acc.checked_add(t).ok_or_else(overflow)?;
        }
        Ok(acc)
    }

    /// Replace symbols: `f(name)` gives the replacement, `None` keeps the symbol.
    pub fn substitute(&self, f: &dyn Fn(&str) -> Option<SymExpr>) -> Result<SymExpr, SymError> {
        let mut acc = SymExpr::default();
        for (m, c) in &self.terms {
            let mut t = SymExpr::constant(*c);
            for (a, p) in &m.0 {
                t = t.try_mul(&a.substitute(f)?.try_pow(*p)?)?;
            }
            acc = acc.try_add(&t)?;
        }
        Ok(acc)
    }

    /// `self^p` by repeated squaring.
    fn try_pow(&self, mut p: u32) -> Result<SymExpr, SymError> {
        let (mut acc, mut base) = (SymExpr::constant(1), self.clone());
        loop {
            if p & 1 == 1 {
                acc = acc.try_mul(&base)?;
            }
            p >>= 1;
            if p == 0 {
                return Ok(acc);
            }
            base = base.try_mul(&base)?;
        }
    }

    /// When `name` occurs only as a bare linear term `k*name`, returns `(k, rest)`
    /// with `self = k*name + rest` and `name` absent from `rest`.
    pub fn linear_in(&self, name: &str) -> Option<(i64, SymExpr)> {
        let mut coef = None;
        let mut rest = Vec::new();
        for (m, c) in &self.terms {
            match m.0.as_slice() {
                [(Atom::Sym(s), 1)] if &**s == name => coef = Some(*c),
                _ => rest.push((m.clone(), *c)),
            }
        }
        let rest = SymExpr { terms: rest };
        if rest.symbols().iter().any(|s| &**s == name) {
            return None;
        }
        coef.map(|k| (k, rest))
    }

    /// Every term `k*(x/c)` (`is_mod == false`) or `k*(x%c)` of `self` whose
    /// monomial is that one atom, as `(k, x, c, is_mod, rest)` with
    /// `self = k*atom + rest`; used by the prover.
    pub(crate) fn div_mod_terms(&self) -> Vec<(i64, &SymExpr, i64, bool, SymExpr)> {
        let mut out = Vec::new();
        for (i, (m, k)) in self.terms.iter().enumerate() {
            let (x, c, is_mod) = match m.0.as_slice() {
                [(Atom::Div(x, c), 1)] => (x, *c, false),
                [(Atom::Mod(x, c), 1)] => (x, *c, true),
                _ => continue,
            };
            let mut rest = self.clone();
            rest.terms.remove(i);
            out.push((*k, &**x, c, is_mod, rest));
        }
        out
    }

    /// Visit every term as `(coefficient, [(atom view, power)])`; used by the prover.
    pub(crate) fn terms(&self) -> impl Iterator<Item = (i64, Vec<(AtomView<'_>, u32)>)> + '_ {
        self.terms.iter().map(|(m, c)| (*c, m.0.iter().map(|(a, p)| (a.view(), *p)).collect()))
    }
}

/// A read-only view of an atom, for the prover's interval arithmetic.
pub(crate) enum AtomView<'a> {
    Sym(&'a str),
    Div(&'a SymExpr, i64),
    Mod(&'a SymExpr, i64),
    Min(&'a [SymExpr]),
    Max(&'a [SymExpr]),
}

impl Atom {
    fn view(&self) -> AtomView<'_> {
        match self {
            Atom::Sym(s) => AtomView::Sym(s),
            Atom::Div(e, c) => AtomView::Div(e, *c),
            Atom::Mod(e, c) => AtomView::Mod(e, *c),
            Atom::Min(v) => AtomView::Min(v),
            Atom::Max(v) => AtomView::Max(v),
        }
    }

    fn eval(&self, bind: &dyn Fn(&str) -> Option<i64>) -> Result<i64, SymError> {
        Ok(match self {
            Atom::Sym(s) => bind(s).ok_or_else(|| SymError::Unbound(s.to_string()))?,
            Atom::Div(e, c) => e.eval(bind)?.div_euclid(*c),
            Atom::Mod(e, c) => e.eval(bind)?.rem_euclid(*c),
            Atom::Min(v) => fold_eval(v, bind, i64::min)?,
            Atom::Max(v) => fold_eval(v, bind, i64::max)?,
        })
    }

    fn substitute(&self, f: &dyn Fn(&str) -> Option<SymExpr>) -> Result<SymExpr, SymError> {
        Ok(match self {
            Atom::Sym(s) => f(s).unwrap_or_else(|| SymExpr::symbol(s)),
            Atom::Div(e, c) => e.substitute(f)?.try_floor_div(*c)?,
            Atom::Mod(e, c) => e.substitute(f)?.try_rem(*c)?,
            Atom::Min(v) | Atom::Max(v) => {
                let args = v.iter().map(|e| e.substitute(f)).collect::<Result<Vec<_>, _>>()?;
                SymExpr::minmax(args, matches!(self, Atom::Max(_)))
            }
        })
    }
}

fn fold_eval(
    v: &[SymExpr],
    bind: &dyn Fn(&str) -> Option<i64>,
    f: fn(i64, i64) -> i64,
) -> Result<i64, SymError> {
    let mut it = v.iter();
    let mut acc = it.next().map(|e| e.eval(bind)).transpose()?.unwrap_or(0);
    for e in it {
        acc = f(acc, e.eval(bind)?);
    }
    Ok(acc)
}

impl Monomial {
    fn mul(&self, other: &Monomial) -> Result<Monomial, SymError> {
        let mut v: Vec<(Atom, u32)> = Vec::with_capacity(self.0.len() + other.0.len());
        let (mut i, mut j) = (0, 0);
        while i < self.0.len() || j < other.0.len() {
            let ord = match (self.0.get(i), other.0.get(j)) {
                (Some(a), Some(b)) => a.0.cmp(&b.0),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            match ord {
                std::cmp::Ordering::Less => {
                    v.push(self.0[i].clone());
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    v.push(other.0[j].clone());
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    let p = self.0[i].1.checked_add(other.0[j].1).ok_or_else(overflow)?;
                    v.push((self.0[i].0.clone(), p));
                    i += 1;
                    j += 1;
                }
            }
        }
        Ok(Monomial(v))
    }
}

/// The greatest common divisor of `a` and `b` (0 when both are 0), except that
/// 2^63 (`gcd(i64::MIN, i64::MIN)`), which `i64` cannot hold, gives the common
/// divisor 2^62.
pub(crate) fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i64::try_from(a).unwrap_or(1 << 62)
}

impl From<i64> for SymExpr {
    fn from(v: i64) -> SymExpr {
        SymExpr::constant(v)
    }
}

macro_rules! std_op {
    ($tr:ident, $f:ident, $try:ident) => {
        /// Panics on coefficient overflow; fallible code uses the `try_` form.
        impl std::ops::$tr<&SymExpr> for &SymExpr {
            type Output = SymExpr;
            fn $f(self, rhs: &SymExpr) -> SymExpr {
                self.$try(rhs).expect("symbolic coefficient overflow")
            }
        }
        impl std::ops::$tr<SymExpr> for SymExpr {
            type Output = SymExpr;
            fn $f(self, rhs: SymExpr) -> SymExpr {
                (&self).$f(&rhs)
            }
        }
        impl std::ops::$tr<i64> for SymExpr {
            type Output = SymExpr;
            fn $f(self, rhs: i64) -> SymExpr {
                (&self).$f(&SymExpr::constant(rhs))
            }
        }
    };
}
std_op!(Add, add, try_add);
std_op!(Sub, sub, try_sub);
std_op!(Mul, mul, try_mul);

// ---------------------------------------------------------------- printing

impl fmt::Display for SymExpr {
    /// Non-constant terms first, the constant last: `h+1`, `2*n-1`, `-h/2+3`. A
    /// leading `-` negates the whole first term, as the parser reads it. `i64::MIN`
    /// has no literal, so it is written as a difference: `-9223372036854775807-1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return write!(f, "0");
        }
        let mut first = true;
        for (m, c) in self.terms.iter().filter(|(m, _)| !m.0.is_empty()) {
            if *c == i64::MIN {
                write_term(f, &mut first, m, -i64::MAX)?;
                write_term(f, &mut first, m, -1)?;
            } else {
                write_term(f, &mut first, m, *c)?;
            }
        }
        match self.constant_term() {
            0 => Ok(()),
            i64::MIN => write!(f, "-{}-1", i64::MAX),
            c if first || c < 0 => write!(f, "{c}"),
            c => write!(f, "+{c}"),
        }
    }
}

/// One non-constant term `c*m` (`c != i64::MIN`), with its sign.
fn write_term(f: &mut fmt::Formatter<'_>, first: &mut bool, m: &Monomial, c: i64) -> fmt::Result {
    if c < 0 {
        write!(f, "-")?;
    } else if !*first {
        write!(f, "+")?;
    }
    *first = false;
    let k = c.unsigned_abs();
    let lone = m.0.len() == 1 && m.0[0].1 == 1;
    if k != 1 {
        write!(f, "{k}*")?;
    }
    m.fmt_with(f, k != 1 || !lone)
}

impl Monomial {
    /// `in_product`: the monomial stands beside other factors, so a `/` or `%`
    /// atom needs parentheses (`2*(h/2)` is not `2*h/2`).
    fn fmt_with(&self, f: &mut fmt::Formatter<'_>, in_product: bool) -> fmt::Result {
        let mut first = true;
        for (a, p) in &self.0 {
            for _ in 0..*p {
                if !first {
                    write!(f, "*")?;
                }
                let paren = matches!(a, Atom::Div(..) | Atom::Mod(..)) && (in_product || !first);
                if paren {
                    write!(f, "({a})")?;
                } else {
                    write!(f, "{a}")?;
                }
                first = false;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Sym(s) => write!(f, "{s}"),
            Atom::Div(e, c) | Atom::Mod(e, c) => {
                let op = if matches!(self, Atom::Div(..)) { "/" } else { "%" };
                if e.terms.len() > 1 {
                    write!(f, "({e}){op}{c}")
                } else {
                    write!(f, "{e}{op}{c}")
                }
            }
            Atom::Min(v) | Atom::Max(v) => {
                write!(f, "{}(", if matches!(self, Atom::Min(_)) { "min" } else { "max" })?;
                for (i, e) in v.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{e}")?;
                }
                write!(f, ")")
            }
        }
    }
}

impl fmt::Debug for SymExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SymExpr({self})")
    }
}
