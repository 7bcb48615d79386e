//! `ShapeEnv`: everything known about a model's symbols, and the one place every
//! stage asks "can we prove this about a shape" (BladeDISC §3.1, TSCompiler §4.1).
//!
//! Facts:
//! - per symbol: a value range and a known divisor;
//! - equalities, kept as substitutions `s := expr` (dim equality when `expr` is a
//!   symbol, dim collapse equality such as `s3 := batch*seq` otherwise), so every
//!   query first rewrites both sides into surviving symbols;
//! - relations that cannot be solved for a symbol (`2*a == b*c`) and ranges of
//!   eliminated symbols that now constrain an expression: checked when binding.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use crate::expr::{gcd, AtomView};
use crate::{SymError, SymExpr};

/// An inclusive integer interval; `i64::MIN`/`i64::MAX` stand for unbounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    fn add(self, o: Range) -> Range {
        Range { lo: self.lo.saturating_add(o.lo), hi: self.hi.saturating_add(o.hi) }
    }
    fn mul(self, o: Range) -> Range {
        let c =
            [sat_mul(self.lo, o.lo), sat_mul(self.lo, o.hi), sat_mul(self.hi, o.lo), sat_mul(self.hi, o.hi)];
        Range { lo: *c.iter().min().unwrap_or(&0), hi: *c.iter().max().unwrap_or(&0) }
    }
}

/// Saturating multiplication where the bounds stand for infinity (0 * inf = 0).
fn sat_mul(a: i64, b: i64) -> i64 {
    if a == 0 || b == 0 {
        0
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SymOrigin {
    /// Declared by the user (`--dim seq=1..512`).
    User,
    /// An ONNX `dim_param` name.
    Param,
    /// Made up for an unnamed dynamic dim or an op's data-dependent output.
    Fresh,
}

/// What is known about one symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Constraint {
    /// `lhs == rhs`.
    Equal(SymExpr, SymExpr, String),
    /// `expr` lies in `range` (the range of an eliminated symbol).
    InRange(SymExpr, Range, String),
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
#[derive(Clone, Debug, Default)]
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

    /// Declare a symbol (or narrow an existing one) with a value range.
    pub fn declare(&mut self, name: &str, range: Range, origin: SymOrigin) -> Result<SymExpr, SymError> {
        if !crate::parse::is_valid_symbol_name(name) {
            return Err(SymError::BadName(name.to_string()));
        }
        if let Some(e) = self.subst.get(name).cloned() {
            // Already eliminated: the range now constrains its replacement.
            self.constrain_range(&e, range, &format!("range of {name}"))?;
            return Ok(SymExpr::symbol(name));
        }
        if let Some(info) = self.symbols.get_mut(name) {
            let r = info.range.intersect(&range);
            if r.is_empty() {
                return Err(SymError::Contradiction(format!(
                    "{name} cannot be in both {} and {range}",
                    info.range
                )));
            }
            info.range = r;
            info.origin = info.origin.min(origin);
        } else {
            if range.is_empty() {
                return Err(SymError::Contradiction(format!("{name} has an empty range {range}")));
            }
            let order = self.next_order;
            self.next_order += 1;
            self.symbols
                .insert(Arc::from(name), SymInfo { name: Arc::from(name), range, divisor: 1, origin, order });
        }
        Ok(SymExpr::symbol(name))
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

    /// Record that `name` is a multiple of `d`.
    pub fn set_divisor(&mut self, name: &str, d: i64) -> Result<(), SymError> {
        if d <= 0 {
            return Err(SymError::NonPositiveDivisor(d));
        }
        let info = self.symbols.get_mut(name).ok_or_else(|| SymError::Unbound(name.to_string()))?;
        let g = gcd(info.divisor, d);
        info.divisor = (info.divisor / g).checked_mul(d).ok_or(SymError::Overflow)?;
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

    /// Rewrite `e` into surviving symbols.
    pub fn normalize(&self, e: &SymExpr) -> SymExpr {
        if self.subst.is_empty() {
            return e.clone();
        }
        // Substitution right-hand sides only mention surviving symbols, and the
        // result of re-canonicalizing can only shrink coefficients' magnitude or
        // reproduce terms of the (representable) originals, so this cannot overflow
        // for expressions the env itself produced; fall back to `e` if it does.
        e.substitute(&|s| self.subst.get(s).cloned()).unwrap_or_else(|_| e.clone())
    }

    /// Record `a == b`. Errors when the facts so far prove them different.
    pub fn equate(&mut self, a: &SymExpr, b: &SymExpr) -> Result<(), SymError> {
        let (na, nb) = (self.normalize(a), self.normalize(b));
        let d = na.try_sub(&nb)?;
        if let Some(c) = d.as_const() {
            if c == 0 {
                return Ok(());
            }
            return Err(SymError::Contradiction(format!("{a} == {b} is impossible ({na} != {nb})")));
        }
        if !self.range(&d).contains(0) {
            return Err(SymError::Contradiction(format!(
                "{a} == {b} is impossible: {na} - {nb} is in {}",
                self.range(&d)
            )));
        }
        // Solve for a symbol appearing as a bare term with coefficient ±1; prefer
        // eliminating fresh symbols, then the most recently declared.
        let mut cands: Vec<(&SymInfo, i64, SymExpr)> = d
            .symbols()
            .iter()
            .filter_map(|s| {
                let (k, rest) = d.linear_in(s)?;
                let info = self.symbols.get(&**s)?;
                (k == 1 || k == -1).then_some((info, k, rest))
            })
            .collect();
        cands.sort_by_key(|(i, _, _)| (std::cmp::Reverse(i.origin), std::cmp::Reverse(i.order)));
        let Some((info, k, rest)) = cands.into_iter().next() else {
            self.constraints.push(Constraint::Equal(na.clone(), nb.clone(), format!("{a} == {b}")));
            return Ok(());
        };
        let info = info.clone();
        // d = k*s + rest = 0  =>  s = -k*rest (k = ±1).
        let value = rest.try_scale(-k)?;
        self.eliminate(&info, value)
    }

    fn eliminate(&mut self, info: &SymInfo, value: SymExpr) -> Result<(), SymError> {
        let name = info.name.clone();
        self.symbols.remove(&name);
        let rewrite = |e: &SymExpr| e.substitute(&|s| (s == &*name).then(|| value.clone()));
        for v in self.subst.values_mut() {
            *v = rewrite(v)?;
        }
        self.subst.insert(name.clone(), value.clone());
        // The eliminated symbol's range and divisor now constrain `value`.
        if let Some(t) = value.as_symbol().map(str::to_string) {
            let (range, divisor) = (info.range, info.divisor);
            let tinfo = self.symbols.get_mut(t.as_str()).ok_or(SymError::Unbound(t.clone()))?;
            let r = tinfo.range.intersect(&range);
            if r.is_empty() {
                return Err(SymError::Contradiction(format!(
                    "{name} == {t} but {name} is in {range} and {t} in {}",
                    tinfo.range
                )));
            }
            tinfo.range = r;
            tinfo.origin = tinfo.origin.min(info.origin);
            self.set_divisor(&t, divisor)?;
        } else {
            self.constrain_range(
                &value,
                info.range,
                &format!("{name} == {value}, {name} in {}", info.range),
            )?;
        }
        let old = std::mem::take(&mut self.constraints);
        for c in old {
            self.constraints.push(match c {
                Constraint::Equal(a, b, why) => Constraint::Equal(rewrite(&a)?, rewrite(&b)?, why),
                Constraint::InRange(e, r, why) => Constraint::InRange(rewrite(&e)?, r, why),
            });
        }
        Ok(())
    }

    fn constrain_range(&mut self, e: &SymExpr, r: Range, why: &str) -> Result<(), SymError> {
        let have = self.range(e);
        if have.intersect(&r).is_empty() {
            return Err(SymError::Contradiction(format!("{why}: {e} is in {have}")));
        }
        if !(r.lo <= have.lo && have.hi <= r.hi) {
            self.constraints.push(Constraint::InRange(self.normalize(e), r, why.to_string()));
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
        let r = match na.try_sub(&nb) {
            Ok(d) => self.range(&d),
            Err(_) => return false,
        };
        if r == Range::point(0) {
            return true;
        }
        self.constraints.iter().any(|c| match c {
            Constraint::Equal(x, y, _) => (x == &na && y == &nb) || (x == &nb && y == &na),
            Constraint::InRange(..) => false,
        })
    }

    /// Provably `k` divides `e` for every binding.
    pub fn divides(&self, k: i64, e: &SymExpr) -> bool {
        if k == 0 {
            return self.equal(e, &SymExpr::constant(0));
        }
        let k = k.unsigned_abs() as u128;
        let e = self.normalize(e);
        let all = e.terms().all(|(c, atoms)| {
            let mut acc = (c.unsigned_abs() as u128) % k;
            for (a, p) in atoms {
                let d = match a {
                    AtomView::Sym(s) => self.symbols.get(s).map_or(1, |i| i.divisor),
                    _ => 1,
                };
                for _ in 0..p {
                    acc = acc * (d.unsigned_abs() as u128 % k) % k;
                }
            }
            acc == 0
        });
        all
    }

    /// A range containing every value `e` can take (interval arithmetic).
    pub fn range(&self, e: &SymExpr) -> Range {
        self.range_normalized(&self.normalize(e))
    }

    fn range_normalized(&self, e: &SymExpr) -> Range {
        let mut acc = Range::point(0);
        for (c, atoms) in e.terms() {
            let mut t = Range::point(c);
            for (a, p) in atoms {
                let r = self.atom_range(&a);
                // Even powers are non-negative.
                let mut pr = r;
                for _ in 1..p {
                    pr = pr.mul(r);
                }
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
    /// Dims that are a single symbol bind it; a dim that is linear in one unbound
    /// symbol (`seq+1`, `2*n`) is solved for it; every dim is then re-evaluated and
    /// compared, and every range, divisor and constraint is checked. Errors name the
    /// dim (`fact.what`) and the rule it breaks.
    pub fn bind(&self, facts: &[DimFact]) -> Result<Bindings, SymError> {
        let mut b = Bindings::default();
        let norm: Vec<SymExpr> = facts.iter().map(|f| self.normalize(&f.expr)).collect();
        loop {
            let mut progress = false;
            for (f, e) in facts.iter().zip(&norm) {
                let unbound: Vec<_> = e.symbols().into_iter().filter(|s| b.get(s).is_none()).collect();
                if let [s] = unbound.as_slice() {
                    if let Some((k, rest)) = e.linear_in(s) {
                        let r = rest.eval(&|n| b.get(n)).map_err(|err| self.fact_error(f, e, &b, err))?;
                        let num = f.value.checked_sub(r).ok_or(SymError::Overflow)?;
                        if num % k != 0 {
                            return Err(self.mismatch(f, e, &b, None));
                        }
                        b.insert(s, num / k);
                        progress = true;
                    }
                }
            }
            if !progress {
                break;
            }
        }
        for (f, e) in facts.iter().zip(&norm) {
            let v = e.eval(&|n| b.get(n)).map_err(|err| self.fact_error(f, e, &b, err))?;
            if v != f.value {
                return Err(self.mismatch(f, e, &b, Some(v)));
            }
        }
        self.check(&b)?;
        Ok(b)
    }

    /// Check symbol ranges, divisors and the recorded constraints under `b`.
    pub fn check(&self, b: &Bindings) -> Result<(), SymError> {
        for info in self.symbols.values() {
            let Some(v) = b.get(&info.name) else { continue };
            if !info.range.contains(v) {
                return Err(SymError::Violation(format!(
                    "{} = {v} is outside its range {}",
                    info.name, info.range
                )));
            }
            if v % info.divisor != 0 {
                return Err(SymError::Violation(format!(
                    "{} = {v} is not a multiple of {}",
                    info.name, info.divisor
                )));
            }
        }
        let ev = |e: &SymExpr| e.eval(&|n| b.get(n)).ok();
        for c in &self.constraints {
            match c {
                Constraint::Equal(x, y, why) => {
                    if let (Some(xv), Some(yv)) = (ev(x), ev(y)) {
                        if xv != yv {
                            return Err(SymError::Violation(format!(
                                "{why} does not hold: {x} = {xv}, {y} = {yv}"
                            )));
                        }
                    }
                }
                Constraint::InRange(e, r, why) => {
                    if let Some(v) = ev(e) {
                        if !r.contains(v) {
                            return Err(SymError::Violation(format!("{why}: {e} = {v} is outside {r}")));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn fact_error(&self, f: &DimFact, e: &SymExpr, _b: &Bindings, err: SymError) -> SymError {
        match err {
            SymError::Unbound(s) => SymError::Violation(format!(
                "{} is {} = {e}, but no input dim determines {s}",
                f.what, f.value
            )),
            other => other,
        }
    }

    fn mismatch(&self, f: &DimFact, e: &SymExpr, b: &Bindings, got: Option<i64>) -> SymError {
        let known: Vec<String> =
            e.symbols().iter().filter_map(|s| b.get(s).map(|v| format!("{s} = {v}"))).collect();
        let expect = match got {
            Some(v) => format!("must be {e} = {v}"),
            None => format!("must be {e}"),
        };
        let ctx = if known.is_empty() { String::new() } else { format!(" (bound: {})", known.join(", ")) };
        SymError::Violation(format!("{} is {} but {expect}{ctx}", f.what, f.value))
    }

    /// Evaluate `e` under `b` after rewriting it into surviving symbols.
    pub fn eval(&self, e: &SymExpr, b: &Bindings) -> Result<i64, SymError> {
        self.normalize(e).eval(&|n| b.get(n))
    }
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
            }
        }
        Ok(())
    }
}

/// Counts how many times each surviving symbol is used, for reports.
pub fn symbol_histogram<'a>(exprs: impl Iterator<Item = &'a SymExpr>) -> HashMap<Arc<str>, usize> {
    let mut h = HashMap::new();
    for e in exprs {
        for s in e.symbols() {
            *h.entry(s).or_insert(0) += 1;
        }
    }
    h
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
            let value = crate::parse_expr(value)?;
            self.subst.insert(Arc::from(name), value);
            Ok(())
        } else if let Some(rest) = line.strip_prefix("assert ") {
            if let Some((a, b)) = rest.split_once("==") {
                let (a, b) = (crate::parse_expr(a)?, crate::parse_expr(b)?);
                self.constraints.push(Constraint::Equal(a, b, rest.to_string()));
            } else if let Some((e, r)) = rest.rsplit_once(" in ") {
                let r = parse_range(r.trim()).ok_or_else(|| bad("bad range"))?;
                self.constraints.push(Constraint::InRange(crate::parse_expr(e)?, r, rest.to_string()));
            } else {
                return Err(bad("expected `assert A == B` or `assert E in LO..HI`"));
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
