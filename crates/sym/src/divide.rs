//! Exact division of symbolic dims (what a reshape's `-1` needs).

use crate::expr::AtomView;
use crate::SymExpr;

fn atom_expr(a: &AtomView<'_>) -> Option<SymExpr> {
    Some(match a {
        AtomView::Sym(s) => SymExpr::symbol(s),
        AtomView::Div(e, c) => e.try_floor_div(*c).ok()?,
        AtomView::Mod(e, c) => e.try_rem(*c).ok()?,
        AtomView::Min(v) => SymExpr::minmax(v.to_vec(), false),
        AtomView::Max(v) => SymExpr::minmax(v.to_vec(), true),
    })
}

impl SymExpr {
    /// `self / d` when the division is exact for every binding: `d` a non-zero
    /// constant dividing every coefficient, or a single term whose factors appear
    /// in every term of `self` (`12*batch*seq / (4*seq) = 3*batch`). `None` when
    /// exactness cannot be shown this way.
    pub fn try_div_exact(&self, d: &SymExpr) -> Option<SymExpr> {
        let dterms: Vec<(i64, Vec<(AtomView<'_>, u32)>)> = d.terms().collect();
        let [(dc, datoms)] = dterms.as_slice() else { return None };
        if *dc == 0 {
            return None;
        }
        let dfactors: Vec<(SymExpr, u32)> =
            datoms.iter().map(|(a, p)| Some((atom_expr(a)?, *p))).collect::<Option<_>>()?;
        let mut q = SymExpr::constant(0);
        for (c, atoms) in self.terms() {
            if c % dc != 0 {
                return None;
            }
            let mut factors: Vec<(SymExpr, u32)> =
                atoms.iter().map(|(a, p)| Some((atom_expr(a)?, *p))).collect::<Option<_>>()?;
            for (f, p) in &dfactors {
                let slot = factors.iter_mut().find(|(g, _)| g == f)?;
                slot.1 = slot.1.checked_sub(*p)?;
            }
            let mut term = SymExpr::constant(c / dc);
            for (f, p) in factors {
                for _ in 0..p {
                    term = term.try_mul(&f).ok()?;
                }
            }
            q = q.try_add(&term).ok()?;
        }
        (q.try_mul(d).ok()? == *self).then_some(q)
    }
}
