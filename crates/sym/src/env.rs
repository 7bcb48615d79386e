//! `ShapeEnv`: everything known about a model's symbols, and the one place every
//! stage asks "can we prove this about a shape" (BladeDISC §3.1, TSCompiler §4.1).
//!
//! Facts:
//! - per symbol: a value range and a known divisor (the range is kept rounded to
//!   multiples of the divisor; a symbol whose range is one value *is* that value);
//! - equalities, kept as substitutions `s := expr` (dim equality when `expr` is a
//!   symbol, dim collapse equality such as `s3 := batch*seq` otherwise), so every
//!   query first rewrites both sides into surviving symbols. An equation is divided
//!   by the gcd of its coefficients and solved for a symbol with coefficient ±1:
//!   fresh symbols go first, then undeclared ones, then the latest declared;
//! - the range and divisor of an eliminated symbol move to what it equals: onto the
//!   symbol itself when that is `k*t + c`, as constraints otherwise;
//! - relations that cannot be solved for a symbol (`2*a == b*c`) and such range and
//!   divisor constraints: used by `equal`/`divides`, checked when binding, and
//!   re-examined (solved, dropped or found contradictory) after every elimination.
//!
//! Every mutation is all-or-nothing: on error the env is unchanged.
//!
//! Queries are sound (`true` is a proof) but not complete. `range` is interval
//! arithmetic in which `i64::MIN`/`i64::MAX` stand for infinities, tightened for
//! `x/c` and `x%c` terms by `x - (c-1) <= c*(x/c) <= x`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::expr::{gcd, AtomView};
use crate::{SymError, SymExpr};

/// An inclusive integer interval; `i64::MIN`/`i64::MAX` stand for unbounded (so
/// interval arithmetic treats them as infinities).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Range {
    pub lo: i64,
    pub hi: i64,
}

impl Range {
    pub const ALL: Range = Range { lo: i64::MIN, hi: i64::MAX };

    pub fn new(lo: i64, hi: i64) -> Range {
        Range { lo, hi }
    }
    pub fn point(v: i64) -> Range {
        Range { lo: v, hi: v }
    }
    /// `lo..` with no upper bound.
    pub fn at_least(lo: i64) -> Range {
        Range { lo, hi: i64::MAX }
    }
    pub fn contains(&self, v: i64) -> bool {
        self.lo <= v && v <= self.hi
    }
    pub fn intersect(&self, o: &Range) -> Range {
        Range { lo: self.lo.max(o.lo), hi: self.hi.min(o.hi) }
    }
    pub fn is_empty(&self) -> bool {
        self.lo > self.hi
    }
    /// Interval sum; an unbounded end stays unbounded (`i64::MIN + 5` is not a
    /// bound), and an overflowing one becomes unbounded.
    fn add(self, o: Range) -> Range {
        let lo =
            if self.lo == i64::MIN || o.lo == i64::MIN { i64::MIN } else { self.lo.saturating_add(o.lo) };
        let hi =
            if self.hi == i64::MAX || o.hi == i64::MAX { i64::MAX } else { self.hi.saturating_add(o.hi) };
        Range { lo, hi }
    }
    fn mul(self, o: Range) -> Range {
        let c =
            [sat_mul(self.lo, o.lo), sat_mul(self.lo, o.hi), sat_mul(self.hi, o.lo), sat_mul(self.hi, o.hi)];
        Range { lo: *c.iter().min().unwrap_or(&0), hi: *c.iter().max().unwrap_or(&0) }
    }
}

/// Multiplication of interval ends, where `i64::MIN`/`i64::MAX` stand for -inf and
/// +inf (and 0 * inf = 0): an infinite factor or an overflowing product gives the
/// infinity of the product's sign.
fn sat_mul(a: i64, b: i64) -> i64 {
    let inf = |v: i64| v == i64::MIN || v == i64::MAX;
    if a == 0 || b == 0 {
        0
    } else if inf(a) || inf(b) {
        if (a < 0) == (b < 0) {
            i64::MAX
        } else {
            i64::MIN
        }
    } else {
        a.saturating_mul(b)
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lo = if self.lo == i64::MIN { String::new() } else { self.lo.to_string() };
        if self.hi == i64::MAX {
            write!(f, "{lo}..")
        } else {
            write!(f, "{lo}..{}", self.hi)
        }
    }
}

/// Where a symbol came from; named symbols survive equalities over fresh ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum SymOrigin {
    /// Declared by the user (`--dim seq=1..512`).
    User,
    /// An ONNX `dim_param` name.
    Param,
    /// Made up for an unnamed dynamic dim or an op's data-dependent output.
    Fresh,
}

/// What is known about one symbol.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SymInfo {
    pub name: Arc<str>,
    pub range: Range,
    /// The symbol is a known multiple of this (1 when nothing is known).
    pub divisor: i64,
    pub origin: SymOrigin,
    /// Declaration order, used to pick which symbol of an equal pair survives.
    order: usize,
}

/// A fact that binding must check because it is not implied by symbol ranges.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Constraint {
    /// `lhs == rhs`.
    Equal(SymExpr, SymExpr, String),
    /// `expr` lies in `range` (the range of an eliminated symbol).
    InRange(SymExpr, Range, String),
    /// `dim == to` or `dim == 1`: a broadcast whose dim may or may not be
    /// stretched, decided by the run-time shapes (numpy's rule, unproven at
    /// compile time; code is versioned on `dim == 1`).
    Broadcast(SymExpr, SymExpr, String),
}

/// A dimension observed at run time: `expr` (from the model) has value `value`.
#[derive(Clone, Debug)]
pub struct DimFact {
    pub expr: SymExpr,
    pub value: i64,
    /// Who saw it, for error messages: `input 'input_ids' dim 1`.
    pub what: String,
}

/// Values of symbols bound from run-time shapes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings(BTreeMap<Arc<str>, i64>);

impl Bindings {
    pub fn get(&self, name: &str) -> Option<i64> {
        self.0.get(name).copied()
    }
    pub fn insert(&mut self, name: &str, v: i64) {
        self.0.insert(Arc::from(name), v);
    }
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.0.iter().map(|(k, v)| (&**k, *v))
    }
    /// Evaluate `e` under these bindings.
    pub fn eval(&self, e: &SymExpr) -> Result<i64, SymError> {
        e.eval(&|s| self.get(s))
    }
}

/// Everything known about the symbols of one model.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ShapeEnv {
    symbols: BTreeMap<Arc<str>, SymInfo>,
    /// `name := expr`, with `expr` written in surviving symbols only.
    subst: BTreeMap<Arc<str>, SymExpr>,
    constraints: Vec<Constraint>,
    next_order: usize,
    next_fresh: usize,
}

impl ShapeEnv {
    pub fn new() -> ShapeEnv {
        ShapeEnv::default()
    }

    /// Declare a symbol (or narrow an existing one) with a value range. The env is
    /// unchanged on error.
    pub fn declare(&mut self, name: &str, range: Range, origin: SymOrigin) -> Result<SymExpr, SymError> {
        if !crate::parse::is_valid_symbol_name(name) {
            return Err(SymError::BadName(name.to_string()));
        }
        if range.is_empty() {
            return Err(SymError::Contradiction(format!("{name} has an empty range {range}")));
        }
        if self.symbols.contains_key(name) || self.subst.contains_key(name) {
            let mut next = self.clone();
            next.declare_inner(name, range, origin)?;
            *self = next;
        } else {
            self.declare_inner(name, range, origin)?; // cannot fail
        }
        Ok(SymExpr::symbol(name))
    }

    fn declare_inner(&mut self, name: &str, range: Range, origin: SymOrigin) -> Result<(), SymError> {
        if let Some(e) = self.subst.get(name).cloned() {
            // Already eliminated: the range now constrains its replacement.
            return self.restrict(&e, range, 1, &format!("{name} == {e}, {name} in {range}"));
        }
        if self.symbols.contains_key(name) {
            self.narrow(name, range)?;
            if let Some(info) = self.symbols.get_mut(name) {
                info.origin = info.origin.min(origin);
            }
        } else {
            let order = self.next_order;
            self.next_order += 1;
            self.symbols
                .insert(Arc::from(name), SymInfo { name: Arc::from(name), range, divisor: 1, origin, order });
        }
        Ok(())
    }

    /// A new symbol (`{hint}{n}`) for a dim nothing names; dims are non-negative.
    pub fn fresh(&mut self, hint: &str) -> SymExpr {
        loop {
            let name = format!("{hint}{}", self.next_fresh);
            self.next_fresh += 1;
            if !self.symbols.contains_key(name.as_str()) && !self.subst.contains_key(name.as_str()) {
                return self
                    .declare(&name, Range::at_least(0), SymOrigin::Fresh)
                    .unwrap_or_else(|_| SymExpr::symbol(&name));
            }
        }
    }

    /// Record that `name` is a multiple of `d`. The range of a surviving symbol is
    /// narrowed to multiples of `d` (an error when it holds none); for an eliminated
    /// symbol the fact constrains what it equals. The env is unchanged on error.
    pub fn set_divisor(&mut self, name: &str, d: i64) -> Result<(), SymError> {
        if d <= 0 {
            return Err(SymError::NonPositiveDivisor(d));
        }
        let mut next = self.clone();
        next.set_divisor_inner(name, d)?;
        *self = next;
        Ok(())
    }

    fn set_divisor_inner(&mut self, name: &str, d: i64) -> Result<(), SymError> {
        if let Some(e) = self.subst.get(name).cloned() {
            return self.restrict(&e, Range::ALL, d, &format!("{name} == {e}, {name} divisible by {d}"));
        }
        let info = self.symbols.get(name).ok_or_else(|| SymError::Unbound(name.to_string()))?;
        let divisor = (info.divisor / gcd(info.divisor, d)).checked_mul(d).ok_or(SymError::Overflow)?;
        let range = info.range;
        if tighten(range, divisor).is_empty() {
            return Err(SymError::Contradiction(format!("{name} in {range} has no multiple of {divisor}")));
        }
        if let Some(info) = self.symbols.get_mut(name) {
            info.divisor = divisor;
        }
        self.narrow(name, Range::ALL)
    }

    /// Intersect the range of the surviving symbol `name` with `r` (and round it to
    /// its divisor).
    fn narrow(&mut self, name: &str, r: Range) -> Result<(), SymError> {
        let info = self.symbols.get_mut(name).ok_or_else(|| SymError::Unbound(name.to_string()))?;
        let n = tighten(info.range.intersect(&r), info.divisor);
        if n.is_empty() {
            let div =
                if info.divisor == 1 { String::new() } else { format!(" (divisible by {})", info.divisor) };
            return Err(SymError::Contradiction(format!(
                "{name} cannot be in both {}{div} and {r}",
                info.range
            )));
        }
        let became_point = n.lo == n.hi && info.range.lo != info.range.hi;
        info.range = n;
        if became_point {
            self.recheck()?;
        }
        Ok(())
    }

    /// The surviving symbols, in declaration order.
    pub fn symbols(&self) -> Vec<&SymInfo> {
        let mut v: Vec<&SymInfo> = self.symbols.values().collect();
        v.sort_by_key(|i| i.order);
        v
    }

    pub fn symbol(&self, name: &str) -> Option<&SymInfo> {
        self.symbols.get(name)
    }

    /// The eliminated symbols and what they equal.
    pub fn substitutions(&self) -> impl Iterator<Item = (&str, &SymExpr)> {
        self.subst.iter().map(|(k, v)| (&**k, v))
    }

    pub fn constraints(&self) -> &[Constraint] {
        &self.constraints
    }

    /// Rewrite `e` into surviving symbols, with every symbol whose range is one
    /// value replaced by that value; on overflow, `e` unchanged (still a correct, if
    /// less useful, answer for every query).
    pub fn normalize(&self, e: &SymExpr) -> SymExpr {
        self.try_normalize(e).unwrap_or_else(|_| e.clone())
    }

    /// Rewrite `e` into surviving symbols, with every symbol whose range is one
    /// value replaced by that value.
    pub fn try_normalize(&self, e: &SymExpr) -> Result<SymExpr, SymError> {
        let e = self.eliminated_out(e)?;
        let point = |s: &str| {
            let r = self.symbols.get(s)?.range;
            (r.lo == r.hi).then(|| SymExpr::constant(r.lo))
        };
        if e.symbols().iter().any(|s| point(s).is_some()) {
            e.substitute(&point)
        } else {
            Ok(e)
        }
    }

    /// `normalize`, then `min`/`max` arguments that the ranges prove dominated
    /// are dropped: `min(64, seq)` is `seq` once `seq <= 64` is known. For the
    /// types a stage writes; `equal` uses it when plain normalization is not enough.
    pub fn simplify(&self, e: &SymExpr) -> SymExpr {
        let n = self.normalize(e);
        if n.has_minmax() {
            self.prune_minmax(&n).unwrap_or(n)
        } else {
            n
        }
    }

    /// Drop `min`/`max` arguments the ranges prove dominated: `min(64, seq)` is
    /// `seq` once `seq <= 64` is known.
    fn prune_minmax(&self, e: &SymExpr) -> Result<SymExpr, SymError> {
        let mut acc = SymExpr::constant(0);
        for (c, atoms) in e.terms() {
            let mut t = SymExpr::constant(c);
            for (a, p) in atoms {
                let v = match a {
                    AtomView::Sym(s) => SymExpr::symbol(s),
                    AtomView::Div(x, k) => self.prune_minmax(x)?.try_floor_div(k)?,
                    AtomView::Mod(x, k) => self.prune_minmax(x)?.try_rem(k)?,
                    AtomView::Min(args) | AtomView::Max(args) => {
                        let is_max = matches!(a, AtomView::Max(_));
                        let args =
                            args.iter().map(|x| self.prune_minmax(x)).collect::<Result<Vec<_>, _>>()?;
                        // Keep an argument unless another one is provably on its side of it.
                        let dominated = |i: usize| {
                            args.iter().enumerate().any(|(j, b)| {
                                j != i && {
                                    let (lo, hi) = if is_max { (&args[i], b) } else { (b, &args[i]) };
                                    // Ties keep the first of the equal arguments.
                                    if self.known_le(lo, hi) && self.known_le(hi, lo) {
                                        j < i
                                    } else {
                                        self.known_le(lo, hi)
                                    }
                                }
                            })
                        };
                        let kept: Vec<SymExpr> =
                            (0..args.len()).filter(|i| !dominated(*i)).map(|i| args[i].clone()).collect();
                        SymExpr::minmax(kept, is_max)
                    }
                };
                for _ in 0..p {
                    t = t.try_mul(&v)?;
                }
            }
            acc = acc.try_add(&t)?;
        }
        Ok(acc)
    }

    /// `e` with the eliminated symbols replaced by what they equal.
    fn eliminated_out(&self, e: &SymExpr) -> Result<SymExpr, SymError> {
        if self.subst.is_empty() {
            return Ok(e.clone());
        }
        // Substitution right-hand sides only mention surviving symbols: one pass.
        e.substitute(&|s| self.subst.get(s).cloned())
    }

    /// Record `a == b`. Errors when the facts so far prove them different; the env
    /// is unchanged on error.
    pub fn equate(&mut self, a: &SymExpr, b: &SymExpr) -> Result<(), SymError> {
        let mut next = self.clone();
        next.equate_inner(a, b, format!("{a} == {b}"))?;
        *self = next;
        Ok(())
    }

    fn equate_inner(&mut self, a: &SymExpr, b: &SymExpr, why: String) -> Result<(), SymError> {
        let (na, nb) = (self.try_normalize(a)?, self.try_normalize(b)?);
        // `x == min(x, c…)` says `x <= c` for each constant `c` (and `max`, `>=`):
        // a range fact, e.g. a sequence no longer than a position table.
        for (x, m) in [(&na, &nb), (&nb, &na)] {
            let (Some(s), Some((is_max, args))) = (x.as_symbol(), m.as_minmax()) else { continue };
            if !args.contains(x) || !args.iter().all(|e| e == x || e.as_const().is_some()) {
                continue;
            }
            let bounds = args.iter().filter_map(SymExpr::as_const);
            let r = if is_max {
                Range::new(bounds.max().unwrap_or(i64::MIN), i64::MAX)
            } else {
                Range::new(i64::MIN, bounds.min().unwrap_or(i64::MAX))
            };
            let s = s.to_string();
            self.declare(&s, r, SymOrigin::Fresh)
                .map_err(|e| SymError::Contradiction(format!("{why}: {e}")))?;
            return Ok(());
        }
        let d = na.try_sub(&nb)?;
        let impossible = |d: &SymExpr, r: String| {
            SymError::Contradiction(format!("{why} is impossible: {na} - {nb} = {d}{r}"))
        };
        // d == 0 iff d/g == 0 for g the gcd of the non-constant coefficients.
        let c0 = d.constant_term();
        let g = d.try_sub(&SymExpr::constant(c0))?.content();
        if g == 0 {
            return if c0 == 0 { Ok(()) } else { Err(impossible(&d, String::new())) };
        }
        if c0 % g != 0 {
            return Err(impossible(&d, format!(", and {c0} is not a multiple of {g}")));
        }
        let d = d.exact_div(g);
        let r = self.range(&d);
        if !r.contains(0) {
            return Err(impossible(&d, format!(" (divided by {g}) is in {r}")));
        }
        // Solve for a symbol appearing as a bare term with coefficient ±1; prefer
        // eliminating fresh symbols, then undeclared ones, then the most recently
        // declared.
        let undeclared = |s: &Arc<str>| SymInfo {
            name: s.clone(),
            range: Range::ALL,
            divisor: 1,
            origin: SymOrigin::Param,
            order: usize::MAX,
        };
        let mut cands: Vec<(SymInfo, i64, SymExpr)> = d
            .symbols()
            .iter()
            .filter_map(|s| {
                let (k, rest) = d.linear_in(s)?;
                let info = self.symbols.get(&**s).cloned().unwrap_or_else(|| undeclared(s));
                (k == 1 || k == -1).then_some((info, k, rest))
            })
            .collect();
        cands.sort_by_key(|(i, _, _)| (std::cmp::Reverse(i.origin), std::cmp::Reverse(i.order)));
        let Some((info, k, rest)) = cands.into_iter().next() else {
            // Recorded even when the ranges prove it now: they may not later, when a
            // symbol they came from is eliminated.
            let known = reduced_diff(&na, &nb);
            let dup = self.constraints.iter().any(|c| match c {
                Constraint::Equal(x, y, _) => reduced_diff(x, y) == known,
                Constraint::InRange(..) | Constraint::Broadcast(..) => false,
            });
            if !dup {
                self.constraints.push(Constraint::Equal(na.clone(), nb.clone(), why));
            }
            return Ok(());
        };
        // d = k*s + rest = 0  =>  s = -k*rest (k = ±1).
        let value = rest.try_scale(-k)?;
        self.eliminate(&info, value)
    }

    fn eliminate(&mut self, info: &SymInfo, value: SymExpr) -> Result<(), SymError> {
        let name = info.name.clone();
        self.symbols.remove(&name);
        self.add_subst(&name, &value)?;
        // The eliminated symbol's range and divisor now constrain `value`.
        let why = format!("{name} == {value}, {name} in {}", info.range);
        self.restrict(&value, info.range, info.divisor, &why)?;
        if let Some(t) = value.as_symbol() {
            if let Some(tinfo) = self.symbols.get_mut(t) {
                tinfo.origin = tinfo.origin.min(info.origin);
            }
        }
        self.recheck()
    }

    /// Re-examine the constraints after a substitution or after a symbol's range
    /// became one value: they may now be solvable, trivial or contradictory.
    fn recheck(&mut self) -> Result<(), SymError> {
        for c in std::mem::take(&mut self.constraints) {
            match c {
                Constraint::Equal(a, b, why) => self.equate_inner(&a, &b, why)?,
                Constraint::InRange(e, r, why) => self.restrict(&e, r, 1, &why)?,
                Constraint::Broadcast(d, to, why) => self.allow_broadcast(&d, &to, &why),
            }
        }
        Ok(())
    }

    /// Record `name := value` and rewrite the other substitutions and the
    /// constraints to match.
    fn add_subst(&mut self, name: &Arc<str>, value: &SymExpr) -> Result<(), SymError> {
        let rewrite = |e: &SymExpr| e.substitute(&|s| (s == &**name).then(|| value.clone()));
        for v in self.subst.values_mut() {
            *v = rewrite(v)?;
        }
        for c in self.constraints.iter_mut() {
            match c {
                Constraint::Equal(a, b, _) | Constraint::Broadcast(a, b, _) => {
                    (*a, *b) = (rewrite(a)?, rewrite(b)?)
                }
                Constraint::InRange(e, _, _) => *e = rewrite(e)?,
            }
        }
        self.subst.insert(name.clone(), value.clone());
        Ok(())
    }

    /// Record that `e` lies in `r` and is a multiple of `d`: an equality when `r`
    /// is one value; directly on the symbol's range and divisor when `e` is
    /// `k*t + c`; as constraints otherwise.
    fn restrict(&mut self, e: &SymExpr, r: Range, d: i64, why: &str) -> Result<(), SymError> {
        let e = self.try_normalize(e)?;
        if r.lo == r.hi {
            self.equate_inner(&e, &SymExpr::constant(r.lo), why.to_string())?;
        } else if let Some((t, k, c)) = self.scaled_symbol(&e) {
            let tr = solve_range(k, c, r);
            self.narrow(&t, tr).map_err(|err| match err {
                SymError::Contradiction(m) => SymError::Contradiction(format!("{why}: {m}")),
                other => other,
            })?;
            if d > 1 && c % d == 0 {
                // d | k*t  <=>  d/gcd(d, k) | t
                return self.set_divisor_inner(&t, d / gcd(d, k));
            }
        } else {
            self.constrain_range(&e, r, why)?;
        }
        if d > 1 && !self.divides(d, &e) {
            let m = self.try_normalize(&e)?.try_rem(d)?;
            self.equate_inner(&m, &SymExpr::constant(0), format!("{why}, divisible by {d}"))?;
        }
        Ok(())
    }

    /// `e == k*t + c` with `k != 0` and `t` a declared symbol.
    fn scaled_symbol(&self, e: &SymExpr) -> Option<(String, i64, i64)> {
        let mut terms = e.terms().filter(|(_, atoms)| !atoms.is_empty());
        let (k, atoms) = terms.next()?;
        if terms.next().is_some() {
            return None;
        }
        match atoms.as_slice() {
            [(AtomView::Sym(t), 1)] if self.symbols.contains_key(*t) => {
                Some((t.to_string(), k, e.constant_term()))
            }
            _ => None,
        }
    }

    fn constrain_range(&mut self, e: &SymExpr, r: Range, why: &str) -> Result<(), SymError> {
        let have = self.range(e);
        if have.intersect(&r).is_empty() {
            return Err(SymError::Contradiction(format!("{why}: {e} is in {have}")));
        }
        if !(r.lo <= have.lo && have.hi <= r.hi) {
            let e = self.try_normalize(e)?;
            let dup = self
                .constraints
                .iter()
                .any(|c| matches!(c, Constraint::InRange(x, q, _) if *x == e && *q == r));
            if !dup {
                self.constraints.push(Constraint::InRange(e, r, why.to_string()));
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------ queries

    /// Provably `a == b`.
    pub fn equal(&self, a: &SymExpr, b: &SymExpr) -> bool {
        let (na, nb) = (self.normalize(a), self.normalize(b));
        if na == nb {
            return true;
        }
        let Some(d) = reduced_diff(&na, &nb) else { return false };
        if self.range(&d) == Range::point(0) {
            return true;
        }
        if self.constraints.iter().any(|c| match c {
            Constraint::Equal(x, y, _) => reduced_diff(x, y).as_ref() == Some(&d),
            Constraint::InRange(..) | Constraint::Broadcast(..) => false,
        }) {
            return true;
        }
        // Last, with dominated min/max arguments dropped by the ranges.
        (na.has_minmax() || nb.has_minmax()) && {
            let (sa, sb) = (self.simplify(&na), self.simplify(&nb));
            sa == sb || reduced_diff(&sa, &sb).is_some_and(|d| self.range(&d) == Range::point(0))
        }
    }

    /// Assume that `e` lies in `r`, a fact the model implies but the ranges do
    /// not prove (a slice bound `total - seq` that ONNX would also read from
    /// the end were it negative): later queries use it, and binding checks it,
    /// so a call that breaks it is refused with `why` rather than computed
    /// under the wrong reading.
    pub fn assume(&mut self, e: &SymExpr, r: Range, why: &str) -> Result<(), SymError> {
        self.restrict(e, r, 1, why)
    }

    /// Record that `dim` broadcasts to `to`: at run time it equals `to` or 1
    /// (checked when shapes are bound). Nothing is recorded when that is
    /// already known.
    pub fn allow_broadcast(&mut self, dim: &SymExpr, to: &SymExpr, why: &str) {
        let (d, t) = (self.normalize(dim), self.normalize(to));
        if self.broadcastable(&d, &t) {
            return;
        }
        self.constraints.push(Constraint::Broadcast(d, t, why.to_string()));
    }

    /// `dim` stretches to `to` for every binding: provably equal, provably 1,
    /// or recorded as a broadcast ([`ShapeEnv::allow_broadcast`]).
    pub fn broadcastable(&self, dim: &SymExpr, to: &SymExpr) -> bool {
        if self.equal(dim, to) || self.equal(dim, &SymExpr::constant(1)) {
            return true;
        }
        let (d, t) = (self.normalize(dim), self.normalize(to));
        self.constraints
            .iter()
            .any(|c| matches!(c, Constraint::Broadcast(x, y, _) if self.equal(x, &d) && self.equal(y, &t)))
    }

    /// Provably `k` divides `e` for every binding.
    pub fn divides(&self, k: i64, e: &SymExpr) -> bool {
        if k == 0 {
            return self.equal(e, &SymExpr::constant(0));
        }
        let e = self.normalize(e);
        let ku = k.unsigned_abs() as u128;
        let all = e.terms().all(|(c, atoms)| {
            let mut acc = (c.unsigned_abs() as u128) % ku;
            for (a, p) in atoms {
                let d = match a {
                    AtomView::Sym(s) => self.symbols.get(s).map_or(1, |i| i.divisor),
                    _ => 1,
                };
                for _ in 0..p.min(128) {
                    acc = acc * (d.unsigned_abs() as u128 % ku) % ku;
                }
            }
            acc == 0
        });
        // Otherwise `e % k == 0` may be a recorded fact (the divisor of an
        // eliminated symbol).
        all || k
            .checked_abs()
            .and_then(|k| e.try_rem(k).ok())
            .is_some_and(|m| self.equal(&m, &SymExpr::constant(0)))
    }

    /// A range containing every value `e` can take (interval arithmetic; bounds
    /// saturate at `i64::MIN`/`i64::MAX`, which stand for unbounded).
    pub fn range(&self, e: &SymExpr) -> Range {
        let e = self.normalize(e);
        let r = self.range_normalized(&e);
        // A range recorded for the expression itself (`assume`, or an
        // eliminated symbol's range carried by its value).
        self.constraints.iter().fold(r, |r, c| match c {
            Constraint::InRange(x, q, _) if *x == e && !r.intersect(q).is_empty() => r.intersect(q),
            _ => r,
        })
    }

    /// Interval arithmetic, tightened by relaxing each top-level `x/c` and `x%c`
    /// term (so that `seq - seq/2` is known non-negative).
    fn range_normalized(&self, e: &SymExpr) -> Range {
        let mut r = self.interval(e);
        for (k, x, c, is_mod, rest) in e.div_mod_terms() {
            if r.lo == r.hi {
                break;
            }
            let relaxed = if is_mod {
                // k*(x%c) = k*x - k*c*(x/c): an identity; then relax that division.
                let div = || -> Result<(Range, Option<Range>), SymError> {
                    let kc = k.checked_mul(c).ok_or(SymError::Overflow)?;
                    let rest = rest.try_add(&x.try_scale(k)?)?;
                    let d = x.try_floor_div(c)?;
                    let whole = rest.try_sub(&d.try_scale(kc)?)?;
                    Ok((self.interval(&whole), self.relax_div(-kc, x, c, &rest)))
                };
                match div() {
                    Ok((a, b)) => Some(b.map_or(a, |b| a.intersect(&b))),
                    Err(_) => None,
                }
            } else {
                self.relax_div(k, x, c, &rest)
            };
            if let Some(t) = relaxed.map(|t| r.intersect(&t)).filter(|t| !t.is_empty()) {
                r = t;
            }
        }
        r
    }

    /// A range of `k*(x/c) + rest` from `x - (c-1) <= c*(x/c) <= x`: with
    /// `L = c*rest + k*x`, `c*value` lies in `[L - k*(c-1), L]` (`k > 0`) or
    /// `[L, L - k*(c-1)]` (`k < 0`). `None` on overflow.
    fn relax_div(&self, k: i64, x: &SymExpr, c: i64, rest: &SymExpr) -> Option<Range> {
        let l = rest.try_scale(c).and_then(|cr| cr.try_add(&x.try_scale(k)?)).ok()?;
        let lr = self.interval(&l);
        let slack = k.checked_abs()?.checked_mul(c - 1)?;
        let (lo_slack, hi_slack) = if k > 0 { (slack, 0) } else { (0, slack) };
        let lo = match lr.lo {
            i64::MIN => i64::MIN,
            v => v
                .checked_sub(lo_slack)
                .map_or(i64::MIN, |v| v.div_euclid(c) + i64::from(v.rem_euclid(c) != 0)),
        };
        let hi = match lr.hi {
            i64::MAX => i64::MAX,
            v => v.checked_add(hi_slack).map_or(i64::MAX, |v| v.div_euclid(c)),
        };
        Some(Range::new(lo, hi))
    }

    /// Plain interval arithmetic over the terms.
    fn interval(&self, e: &SymExpr) -> Range {
        let mut acc = Range::point(0);
        for (c, atoms) in e.terms() {
            let mut t = Range::point(c);
            for (a, p) in atoms {
                let r = self.atom_range(&a);
                let mut pr = r;
                for _ in 1..p {
                    let next = pr.mul(r);
                    if next == pr {
                        break; // saturated (or 0/1): further powers are the same
                    }
                    pr = next;
                }
                // Even powers are non-negative.
                if p % 2 == 0 {
                    pr.lo = pr.lo.max(0);
                }
                t = t.mul(pr);
            }
            acc = acc.add(t);
        }
        acc
    }

    fn atom_range(&self, a: &AtomView<'_>) -> Range {
        match a {
            AtomView::Sym(s) => self.symbols.get(*s).map_or(Range::ALL, |i| i.range),
            AtomView::Div(e, c) => {
                let r = self.range_normalized(e);
                let f = |v: i64| if v == i64::MIN || v == i64::MAX { v } else { v.div_euclid(*c) };
                Range::new(f(r.lo), f(r.hi))
            }
            AtomView::Mod(e, c) => {
                let r = self.range_normalized(e);
                if r.lo >= 0 && r.hi < *c {
                    r
                } else {
                    Range::new(0, c - 1)
                }
            }
            AtomView::Min(v) | AtomView::Max(v) => {
                let is_max = matches!(a, AtomView::Max(_));
                let rs: Vec<Range> = v.iter().map(|e| self.range_normalized(e)).collect();
                let pick =
                    |f: fn(i64, i64) -> i64, g: fn(&Range) -> i64| rs.iter().map(g).reduce(f).unwrap_or(0);
                if is_max {
                    Range::new(pick(i64::max, |r| r.lo), pick(i64::max, |r| r.hi))
                } else {
                    Range::new(pick(i64::min, |r| r.lo), pick(i64::min, |r| r.hi))
                }
            }
        }
    }

    /// Provably `a <= b`.
    pub fn known_le(&self, a: &SymExpr, b: &SymExpr) -> bool {
        b.try_sub(a).map(|d| self.range(&d).lo >= 0).unwrap_or(false)
    }

    /// Provably `a < b`.
    pub fn known_lt(&self, a: &SymExpr, b: &SymExpr) -> bool {
        b.try_sub(a).map(|d| self.range(&d).lo > 0).unwrap_or(false)
    }

    /// Provably `a != b`.
    pub fn known_ne(&self, a: &SymExpr, b: &SymExpr) -> bool {
        b.try_sub(a).map(|d| !self.range(&d).contains(0)).unwrap_or(false)
    }

    // ------------------------------------------------------------ binding

    /// Bind symbols from observed run-time dims and check every fact.
    ///
    /// Dims that are a single symbol bind it; a dim that is linear in its one
    /// unbound symbol once the bound ones are replaced by their values (`seq+1`,
    /// `2*n`, `batch*seq` with `seq` bound) is solved for it; every dim is then re-evaluated and
    /// compared, and every range, divisor and constraint is checked. Errors name the
    /// dim (`fact.what`), the dims that bound the symbols involved, and the rule it
    /// breaks. The result also holds the value of every eliminated symbol whose
    /// replacement is bound, so `Bindings::eval` works on any model dim.
    pub fn bind(&self, facts: &[DimFact]) -> Result<Bindings, SymError> {
        let mut b = Bindings::default();
        // Which fact bound each symbol.
        let mut src: BTreeMap<Arc<str>, usize> = BTreeMap::new();
        let norm: Vec<SymExpr> =
            facts.iter().map(|f| self.try_normalize(&f.expr)).collect::<Result<_, _>>()?;
        loop {
            let mut progress = false;
            for (i, (f, e)) in facts.iter().zip(&norm).enumerate() {
                let unbound: Vec<_> = e.symbols().into_iter().filter(|s| b.get(s).is_none()).collect();
                let [s] = unbound.as_slice() else { continue };
                // With the bound symbols replaced by their values, `batch*seq` is
                // linear in `batch` once `seq` is known.
                let pe = e.substitute(&|n| b.get(n).map(SymExpr::constant))?;
                let Some((k, rest)) = pe.linear_in(s) else { continue };
                let r = rest.eval(&|n| b.get(n)).map_err(|err| self.fact_error(f, e, err))?;
                let num = f.value.checked_sub(r).ok_or(SymError::Overflow)?;
                let v = match (num.checked_rem(k), num.checked_div(k)) {
                    (Some(0), Some(v)) => v,
                    (Some(_), _) => {
                        let why = format!(", not a multiple of {k} after the other terms ({num})");
                        return Err(self.mismatch(f, e, &b, &src, facts, None, &why));
                    }
                    _ => return Err(SymError::Overflow),
                };
                b.insert(s, v);
                src.insert(s.clone(), i);
                progress = true;
            }
            if !progress {
                break;
            }
        }
        for (f, e) in facts.iter().zip(&norm) {
            let v = e.eval(&|n| b.get(n)).map_err(|err| self.fact_error(f, e, err))?;
            if v != f.value {
                return Err(self.mismatch(f, e, &b, &src, facts, Some(v), ""));
            }
        }
        let from = |s: &str| src.get(s).map(|i| facts[*i].what.clone());
        self.check_with(&b, &from)?;
        for info in self.symbols.values().filter(|i| i.range.lo == i.range.hi) {
            if b.get(&info.name).is_none() {
                b.insert(&info.name, info.range.lo);
            }
        }
        for (name, value) in &self.subst {
            match value.eval(&|n| b.get(n)) {
                Ok(v) => b.insert(name, v),
                Err(SymError::Unbound(_)) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(b)
    }

    /// Check symbol ranges, divisors, the recorded constraints and the
    /// substitutions (for eliminated symbols `b` has values for) under `b`. Facts
    /// that mention a symbol `b` lacks are skipped.
    pub fn check(&self, b: &Bindings) -> Result<(), SymError> {
        self.check_with(b, &|_| None)
    }

    /// `check`, with `from(symbol)` naming the dim a symbol's value came from.
    fn check_with(&self, b: &Bindings, from: &dyn Fn(&str) -> Option<String>) -> Result<(), SymError> {
        let origin = |s: &str, v: i64| match from(s) {
            Some(w) => format!("{w} gives {s} = {v}, which"),
            None => format!("{s} = {v}"),
        };
        for info in self.symbols() {
            let Some(v) = b.get(&info.name) else { continue };
            if !info.range.contains(v) {
                return Err(SymError::Violation(format!(
                    "{} is outside its range {}",
                    origin(&info.name, v),
                    info.range
                )));
            }
            if v % info.divisor != 0 {
                return Err(SymError::Violation(format!(
                    "{} is not a multiple of {}",
                    origin(&info.name, v),
                    info.divisor
                )));
            }
        }
        // `None`: not evaluable here (a symbol has no value).
        let ev = |e: &SymExpr| match e.eval(&|n| b.get(n)) {
            Ok(v) => Ok(Some(v)),
            Err(SymError::Unbound(_)) => Ok(None),
            Err(err) => Err(err),
        };
        let whence = |es: &[&SymExpr]| {
            let mut syms: Vec<Arc<str>> = es.iter().flat_map(|e| e.symbols()).collect();
            syms.sort();
            syms.dedup();
            let v: Vec<String> =
                syms.iter().filter_map(|s| Some(format!("{s} = {} from {}", b.get(s)?, from(s)?))).collect();
            if v.is_empty() {
                String::new()
            } else {
                format!(" ({})", v.join(", "))
            }
        };
        for (name, value) in &self.subst {
            let (Some(v), Some(w)) = (b.get(name), ev(value)?) else { continue };
            if v != w {
                return Err(SymError::Violation(format!(
                    "{name} == {value} does not hold: {name} = {v}, {value} = {w}{}",
                    whence(&[value])
                )));
            }
        }
        for c in &self.constraints {
            match c {
                Constraint::Equal(x, y, why) => {
                    if let (Some(xv), Some(yv)) = (ev(x)?, ev(y)?) {
                        if xv != yv {
                            return Err(SymError::Violation(format!(
                                "{why} does not hold: {x} = {xv}, {y} = {yv}{}",
                                whence(&[x, y])
                            )));
                        }
                    }
                }
                Constraint::Broadcast(d, to, why) => {
                    if let (Some(dv), Some(tv)) = (ev(d)?, ev(to)?) {
                        if dv != tv && dv != 1 {
                            return Err(SymError::Violation(format!(
                                "{why} does not hold: {d} = {dv} must be {to} = {tv} or 1{}",
                                whence(&[d, to])
                            )));
                        }
                    }
                }
                Constraint::InRange(e, r, why) => {
                    if let Some(v) = ev(e)? {
                        if !r.contains(v) {
                            return Err(SymError::Violation(format!(
                                "{why}: {e} = {v} is outside {r}{}",
                                whence(&[e])
                            )));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn fact_error(&self, f: &DimFact, e: &SymExpr, err: SymError) -> SymError {
        match err {
            SymError::Unbound(s) => SymError::Violation(format!(
                "{} is {} = {e}, but no input dim determines {s}",
                f.what, f.value
            )),
            other => other,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn mismatch(
        &self,
        f: &DimFact,
        e: &SymExpr,
        b: &Bindings,
        src: &BTreeMap<Arc<str>, usize>,
        facts: &[DimFact],
        got: Option<i64>,
        why: &str,
    ) -> SymError {
        let known: Vec<String> = e
            .symbols()
            .iter()
            .filter_map(|s| {
                let v = b.get(s)?;
                Some(match src.get(s) {
                    Some(i) => format!("{s} = {v} from {}", facts[*i].what),
                    None => format!("{s} = {v}"),
                })
            })
            .collect();
        let expect = match got {
            Some(v) if e.as_const().is_none() => format!("must be {e} = {v}"),
            _ => format!("must be {e}"),
        };
        let ctx = if known.is_empty() { String::new() } else { format!(" ({})", known.join(", ")) };
        SymError::Violation(format!("{} is {} but {expect}{why}{ctx}", f.what, f.value))
    }

    /// Evaluate `e` under `b` after rewriting it into surviving symbols.
    pub fn eval(&self, e: &SymExpr, b: &Bindings) -> Result<i64, SymError> {
        self.try_normalize(e)?.eval(&|n| b.get(n))
    }
}

/// `x - y` divided by the gcd of its coefficients, with the first non-constant
/// term's coefficient positive: equal for two equations that say the same.
fn reduced_diff(x: &SymExpr, y: &SymExpr) -> Option<SymExpr> {
    let d = x.try_sub(y).ok()?;
    let g = d.content();
    let d = if g > 1 { d.exact_div(g) } else { d };
    let lead = d.terms().find(|(_, atoms)| !atoms.is_empty()).map_or(1, |(c, _)| c);
    if lead < 0 {
        d.try_scale(-1).ok()
    } else {
        Some(d)
    }
}

/// The values of `t` for which `k*t + c` (`k != 0`) lies in `r`; unbounded ends
/// of `r` stay unbounded.
fn solve_range(k: i64, c: i64, r: Range) -> Range {
    let floor = |a: i128, b: i128| {
        let q = a / b;
        if a % b != 0 && ((a < 0) != (b < 0)) {
            q - 1
        } else {
            q
        }
    };
    let (k, c) = (k as i128, c as i128);
    // k*t + c >= lo bounds t below when k > 0, above when k < 0; likewise for hi.
    let from_lo = (r.lo != i64::MIN).then(|| (r.lo as i128 - c, true));
    let from_hi = (r.hi != i64::MAX).then(|| (r.hi as i128 - c, false));
    let (mut lo, mut hi) = (i128::from(i64::MIN), i128::from(i64::MAX));
    for (v, is_lo) in [from_lo, from_hi].into_iter().flatten() {
        if is_lo == (k > 0) {
            lo = lo.max(-floor(-v, k)); // ceil(v / k)
        } else {
            hi = hi.min(floor(v, k));
        }
    }
    if lo > hi || lo > i64::MAX as i128 || hi < i64::MIN as i128 {
        return Range::new(1, 0);
    }
    Range::new(lo.max(i64::MIN as i128) as i64, hi.min(i64::MAX as i128) as i64)
}

/// `r` shrunk to the multiples of `d` it holds (empty when none is representable).
fn tighten(r: Range, d: i64) -> Range {
    if d <= 1 || r.is_empty() {
        return r;
    }
    let empty = Range::new(1, 0);
    let lo = if r.lo == i64::MIN {
        i64::MIN
    } else {
        let up = r.lo.div_euclid(d) + i64::from(r.lo.rem_euclid(d) != 0);
        match up.checked_mul(d) {
            Some(v) => v,
            None => return empty,
        }
    };
    let hi = if r.hi == i64::MAX {
        i64::MAX
    } else {
        match r.hi.div_euclid(d).checked_mul(d) {
            Some(v) => v,
            None => return empty,
        }
    };
    Range::new(lo, hi)
}

impl fmt::Display for ShapeEnv {
    /// One fact a line: `sym batch: 1..`, `sym seq: 1..512 divisible by 8`,
    /// `let s3 = batch*seq`, `assert 2*a == b*c`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for info in self.symbols() {
            let origin = match info.origin {
                SymOrigin::User => "user",
                SymOrigin::Param => "param",
                SymOrigin::Fresh => "fresh",
            };
            write!(f, "sym {} {origin} {}", info.name, info.range)?;
            if info.divisor != 1 {
                write!(f, " divisible by {}", info.divisor)?;
            }
            writeln!(f)?;
        }
        for (k, v) in &self.subst {
            writeln!(f, "let {k} = {v}")?;
        }
        for c in &self.constraints {
            match c {
                Constraint::Equal(a, b, _) => writeln!(f, "assert {a} == {b}")?,
                Constraint::InRange(e, r, _) => writeln!(f, "assert {e} in {r}")?,
                Constraint::Broadcast(d, to, _) => writeln!(f, "assert {d} broadcasts to {to}")?,
            }
        }
        Ok(())
    }
}

impl ShapeEnv {
    /// Read back one line of the `Display` form (used by the IR text parser).
    pub fn parse_fact(&mut self, line: &str) -> Result<(), SymError> {
        let bad = |what: &str| SymError::Parse { text: line.to_string(), pos: 0, what: what.to_string() };
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("sym ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(origin), Some(range)) = (it.next(), it.next(), it.next()) else {
                return Err(bad("expected `sym NAME ORIGIN LO..HI`"));
            };
            let origin = match origin {
                "user" => SymOrigin::User,
                "param" => SymOrigin::Param,
                "fresh" => SymOrigin::Fresh,
                _ => return Err(bad("origin must be user, param or fresh")),
            };
            let range = parse_range(range).ok_or_else(|| bad("bad range"))?;
            self.declare(name, range, origin)?;
            match (it.next(), it.next(), it.next()) {
                (None, ..) => Ok(()),
                (Some("divisible"), Some("by"), Some(d)) => {
                    self.set_divisor(name, d.parse().map_err(|_| bad("bad divisor"))?)
                }
                _ => Err(bad("expected `divisible by N`")),
            }
        } else if let Some(rest) = line.strip_prefix("let ") {
            let (name, value) = rest.split_once('=').ok_or_else(|| bad("expected `let NAME = EXPR`"))?;
            let name = name.trim();
            if !crate::parse::is_valid_symbol_name(name) {
                return Err(SymError::BadName(name.to_string()));
            }
            if self.symbols.contains_key(name) || self.subst.contains_key(name) {
                return Err(bad("the symbol is already declared or defined"));
            }
            let value = self.eliminated_out(&crate::parse_expr(value)?)?;
            if value.symbols().iter().any(|s| &**s == name) {
                return Err(bad("a symbol cannot be defined in terms of itself"));
            }
            self.add_subst(&Arc::from(name), &value)
        } else if let Some(rest) = line.strip_prefix("assert ") {
            if let Some((d, to)) = rest.split_once(" broadcasts to ") {
                let (d, to) = (crate::parse_expr(d)?, crate::parse_expr(to)?);
                self.allow_broadcast(&d, &to, rest);
            } else if let Some((a, b)) = rest.split_once("==") {
                let (a, b) = (crate::parse_expr(a)?, crate::parse_expr(b)?);
                self.constraints.push(Constraint::Equal(a, b, rest.to_string()));
            } else if let Some((e, r)) = rest.rsplit_once(" in ") {
                let r = parse_range(r.trim()).ok_or_else(|| bad("bad range"))?;
                self.constraints.push(Constraint::InRange(crate::parse_expr(e)?, r, rest.to_string()));
            } else {
                return Err(bad(
                    "expected `assert A == B`, `assert E in LO..HI` or `assert D broadcasts to E`",
                ));
            }
            Ok(())
        } else {
            Err(bad("expected `sym`, `let` or `assert`"))
        }
    }
}

/// `LO..HI`, `LO..`, `..HI` (inclusive).
pub fn parse_range(s: &str) -> Option<Range> {
    let (lo, hi) = s.split_once("..")?;
    let lo = if lo.is_empty() { i64::MIN } else { lo.trim().parse().ok()? };
    let hi = if hi.is_empty() { i64::MAX } else { hi.trim().trim_start_matches('=').parse().ok()? };
    Some(Range { lo, hi })
}
