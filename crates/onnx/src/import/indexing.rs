//! Indexing operators written with the primitives: element-wise and N-d
//! gathers become one `Gather` from the flattened data at computed linear
//! indices, each index first checked and wrapped by a `Gather` from an `Iota`
//! of its axis (so an out-of-range index is an error naming that axis, never a
//! read elsewhere); arg-reductions, one-hot encodings and identity-like
//! matrices compare an `Iota` with values.

use ir::{BinaryOp as B, DType, Op, ReduceOp, SliceAxis, TensorType, UnaryOp as U, ValueId};
use sym::SymExpr;

use super::{norm_axis, Importer, Node, R};

/// `Iota` along `axis` of an i64 tensor of `shape`.
pub(crate) fn iota(imp: &mut Importer, shape: &[SymExpr], axis: usize) -> R<ValueId> {
    imp.emit(Op::Iota { axis }, vec![], Some(TensorType::new(DType::I64, shape.to_vec())))
}

/// A rank-0 i64 value of the symbolic `e`.
pub(crate) fn dim_scalar(imp: &mut Importer, e: &SymExpr) -> R<ValueId> {
    imp.emit(Op::SymConst(vec![e.clone()]), vec![], Some(TensorType::new(DType::I64, vec![])))
}

fn product(dims: &[SymExpr]) -> R<SymExpr> {
    dims.iter().try_fold(SymExpr::constant(1), |a, d| a.try_mul(d)).map_err(|e| e.to_string())
}

/// `idx` (any integer dtype) checked against an axis of extent `n` and wrapped
/// (negative counts from the end), as i64: a `Gather` from `0..n`.
fn checked_index(imp: &mut Importer, idx: ValueId, n: &SymExpr) -> R<ValueId> {
    let idx = match imp.ty(idx).dtype {
        DType::I64 | DType::I32 => idx,
        other => return Err(format!("indices must be int32 or int64, got {other}")),
    };
    let positions = iota(imp, std::slice::from_ref(n), 0)?;
    imp.emit(Op::Gather { axis: 0 }, vec![positions, idx], None)
}

/// `acc + v · stride` (i64, `v` of `acc`'s shape, `stride` a dim).
fn add_scaled(imp: &mut Importer, acc: Option<ValueId>, v: ValueId, stride: &SymExpr) -> R<ValueId> {
    let term = if stride.as_const() == Some(1) {
        v
    } else {
        let s = dim_scalar(imp, stride)?;
        imp.binary(B::Mul, v, s)?
    };
    match acc {
        Some(a) => imp.binary(B::Add, a, term),
        None => Ok(term),
    }
}

/// ONNX `GatherElements`: `out[i] = data[i with i[axis] = indices[i]]`.
pub(crate) fn gather_elements(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (data, indices) = (n.input(0)?, n.input(1)?);
    let r = imp.rank(data);
    if imp.rank(indices) != r {
        return Err(format!("indices of rank {} for data of rank {r}", imp.rank(indices)));
    }
    let axis = norm_axis(n.int("axis", 0), r)?;
    let (ds, is) = (imp.shape(data), imp.shape(indices));
    // Row-major strides of the data; the indices' position on every other axis.
    let mut linear = None;
    for d in 0..r {
        let stride = product(&ds[d + 1..])?;
        let along = if d == axis { checked_index(imp, indices, &ds[d])? } else { iota(imp, &is, d)? };
        linear = Some(add_scaled(imp, linear, along, &stride)?);
    }
    let linear = match linear {
        Some(l) => l,
        None => return Err("GatherElements of a scalar".into()),
    };
    let flat = imp.reshape(data, vec![product(&ds)?])?;
    imp.emit(Op::Gather { axis: 0 }, vec![flat, linear], None)
}

/// `linear` plus the row-major position, among `axes`, of each index tuple (the
/// last axis of `indices`, one column per axis, each checked against its
/// axis), shaped `picks` (the indices' other axes).
fn add_index_columns(
    imp: &mut Importer,
    mut linear: Option<ValueId>,
    indices: ValueId,
    picks: &[SymExpr],
    axes: &[SymExpr],
) -> R<Option<ValueId>> {
    let is = imp.shape(indices);
    let last = is.len() - 1;
    for j in 0..axes.len() {
        let mut shape = is.clone();
        shape[last] = SymExpr::constant(1);
        let cut = vec![SliceAxis { axis: last, start: SymExpr::constant(j as i64), step: 1 }];
        let ty = TensorType::new(imp.ty(indices).dtype, shape);
        let col = imp.emit(Op::Slice { axes: cut }, vec![indices], Some(ty))?;
        let col = imp.reshape(col, picks.to_vec())?;
        let at = checked_index(imp, col, &axes[j])?;
        let stride = product(&axes[j + 1..])?;
        linear = Some(add_scaled(imp, linear, at, &stride)?);
    }
    Ok(linear)
}

/// ONNX `GatherND`: the last axis of `indices` (of constant extent `q`) picks
/// an element or a slice of `data` after its `batch_dims` leading axes.
pub(crate) fn gather_nd(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (data, indices) = (n.input(0)?, n.input(1)?);
    let b = usize::try_from(n.int("batch_dims", 0)).map_err(|_| "batch_dims must be >= 0")?;
    let (ds, is) = (imp.shape(data), imp.shape(indices));
    let ir = is.len();
    let q = ir
        .checked_sub(1)
        .and_then(|l| is[l].as_const())
        .ok_or("GatherND needs indices of rank >= 1 whose last dim is a constant")? as usize;
    if q == 0 || b >= ir || b + q > ds.len() {
        return Err(format!(
            "batch_dims {b} and {q} indexed axes for data of rank {}, indices of rank {ir}",
            ds.len()
        ));
    }
    for t in 0..b {
        if !imp.same_shape(&ds[t..=t], &is[t..=t]) {
            imp.broadcast_shapes(&[vec![ds[t].clone()], vec![is[t].clone()]])?;
        }
    }
    // Each index tuple picks a row of data seen as [Π batch · Π indexed, Π rest].
    let picks = is[..ir - 1].to_vec();
    let mut linear = None;
    for t in 0..b {
        let stride = product(&ds[t + 1..b + q])?;
        let pos = iota(imp, &picks, t)?;
        linear = Some(add_scaled(imp, linear, pos, &stride)?);
    }
    let linear = add_index_columns(imp, linear, indices, &picks, &ds[b..b + q])?
        .ok_or("GatherND needs indices whose last dim is at least 1")?;
    let rest = ds[b + q..].to_vec();
    let rows = imp.reshape(data, vec![product(&ds[..b + q])?, product(&rest)?])?;
    let picked = imp.emit(Op::Gather { axis: 0 }, vec![rows, linear], None)?;
    let mut out = picks;
    out.extend(rest);
    imp.reshape(picked, out)
}

/// How a scatter combines an update with what is there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Combine {
    /// The update replaces the value (the last of several to one place wins).
    Replace,
    Add,
    Mul,
    Max,
    Min,
}

fn combine_of(n: &Node) -> R<Combine> {
    Ok(match n.string("reduction").as_deref().unwrap_or("none") {
        "none" => Combine::Replace,
        "add" => Combine::Add,
        "mul" => Combine::Mul,
        "max" => Combine::Max,
        "min" => Combine::Min,
        r => return Err(format!("reduction '{r}' (none, add, mul, max or min)")),
    })
}

/// `rows` (`[P, T]`) with the updates `upd` (`[U, T]`) combined into row
/// `at[u]` (`[U]`, i64, checked below `P`). Written with the primitives: each
/// row reduces over the updates that target it (a `[P, U, T]` space the fused
/// loop never stores), so the cost is `P·U·T`: fine for the index writes of
/// exported models (a cache position, a mask), slow for a large scatter.
fn scatter_rows(imp: &mut Importer, rows: ValueId, at: ValueId, upd: ValueId, how: Combine) -> R<ValueId> {
    let (rs, us) = (imp.shape(rows), imp.shape(upd));
    let (p, u, t) = (rs[0].clone(), us[0].clone(), rs[1].clone());
    let one = SymExpr::constant(1);
    let dt = imp.ty(rows).dtype;
    // hits[p, u]: update u goes to row p.
    let row = iota(imp, &[p.clone(), u.clone()], 0)?;
    let at2 = imp.reshape(at, vec![one.clone(), u.clone()])?;
    let hits = imp.binary(B::Equal, row, at2)?;
    if how == Combine::Replace {
        // The last update to each row, if any.
        let which = iota(imp, &[p.clone(), u.clone()], 1)?;
        let none = imp.scalar(DType::I64, -1.0)?;
        let cand = imp.select(hits, which, none)?;
        let last = imp.reduce(ReduceOp::Max, cand, vec![1], false)?;
        let zero = imp.scalar(DType::I64, 0.0)?;
        let some = imp.binary(B::GreaterEq, last, zero)?;
        let safe = imp.binary(B::Max, last, zero)?;
        let taken = imp.emit(Op::Gather { axis: 0 }, vec![upd, safe], None)?;
        let some = imp.reshape(some, vec![p, one])?;
        return imp.select(some, taken, rows);
    }
    let (neutral, op) = match how {
        Combine::Add => (0.0, ReduceOp::Sum),
        Combine::Mul => (1.0, ReduceOp::Prod),
        Combine::Max if dt.is_float() => (f64::NEG_INFINITY, ReduceOp::Max),
        Combine::Min if dt.is_float() => (f64::INFINITY, ReduceOp::Min),
        Combine::Max => (int_limit(dt, false)?, ReduceOp::Max),
        Combine::Min => (int_limit(dt, true)?, ReduceOp::Min),
        Combine::Replace => unreachable!("handled above"),
    };
    let hits3 = imp.reshape(hits, vec![p.clone(), u.clone(), one.clone()])?;
    let upd3 = imp.reshape(upd, vec![one, u, t.clone()])?;
    let fill = imp.scalar(dt, neutral)?;
    let each = imp.select(hits3, upd3, fill)?;
    let total = imp.reduce(op, each, vec![1], false)?;
    let b = match how {
        Combine::Add => B::Add,
        Combine::Mul => B::Mul,
        Combine::Max => B::Max,
        _ => B::Min,
    };
    imp.binary(b, rows, total)
}

/// The smallest (or, `high`, largest) value of an integer dtype.
fn int_limit(dt: DType, high: bool) -> R<f64> {
    Ok(match (dt, high) {
        (DType::I8, false) => i8::MIN as f64,
        (DType::I8, true) => i8::MAX as f64,
        (DType::U8, false) => 0.0,
        (DType::U8, true) => u8::MAX as f64,
        (DType::I32, false) => i32::MIN as f64,
        (DType::I32, true) => i32::MAX as f64,
        (DType::I64, false) => i64::MIN as f64,
        (DType::I64, true) => i64::MAX as f64,
        (other, _) => return Err(format!("a scatter reduction on {other}")),
    })
}

/// ONNX `ScatterElements`: `out = data` with `out[j with j[axis] = indices[j]]`
/// combined with `updates[j]` for every position `j` of the updates.
pub(crate) fn scatter_elements(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (data, indices, updates) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let how = combine_of(n)?;
    let r = imp.rank(data);
    if imp.rank(indices) != r || imp.rank(updates) != r || r == 0 {
        return Err(format!(
            "data, indices and updates of ranks {r}, {}, {}",
            imp.rank(indices),
            imp.rank(updates)
        ));
    }
    let axis = norm_axis(n.int("axis", 0), r)?;
    let (ds, is) = (imp.shape(data), imp.shape(indices));
    if !imp.same_shape(&is, &imp.shape(updates)) {
        return Err("indices and updates differ in shape".into());
    }
    let mut linear = None;
    for d in 0..r {
        let stride = product(&ds[d + 1..])?;
        let along = if d == axis { checked_index(imp, indices, &ds[d])? } else { iota(imp, &is, d)? };
        linear = Some(add_scaled(imp, linear, along, &stride)?);
    }
    let linear = linear.ok_or("ScatterElements of a scalar")?;
    let count = product(&is)?;
    let at = imp.reshape(linear, vec![count.clone()])?;
    let one = SymExpr::constant(1);
    let rows = imp.reshape(data, vec![product(&ds)?, one.clone()])?;
    let upd = imp.reshape(updates, vec![count, one])?;
    let out = scatter_rows(imp, rows, at, upd, how)?;
    imp.reshape(out, ds)
}

/// ONNX `ScatterND`: `out = data` with the element or slice that each index
/// tuple (the last axis of `indices`, of constant extent `q`) addresses
/// combined with its slice of `updates`.
pub(crate) fn scatter_nd(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (data, indices, updates) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let how = combine_of(n)?;
    let (ds, is) = (imp.shape(data), imp.shape(indices));
    let ir = is.len();
    let q = ir
        .checked_sub(1)
        .and_then(|l| is[l].as_const())
        .ok_or("ScatterND needs indices of rank >= 1 whose last dim is a constant")? as usize;
    if q == 0 || q > ds.len() {
        return Err(format!("{q} indexed axes for data of rank {}", ds.len()));
    }
    let picks = is[..ir - 1].to_vec();
    let rest = ds[q..].to_vec();
    let mut want = picks.clone();
    want.extend(rest.iter().cloned());
    if !imp.same_shape(&want, &imp.shape(updates)) {
        return Err(format!("updates of shape [{}], expected [{}]", list(&imp.shape(updates)), list(&want)));
    }
    let linear = add_index_columns(imp, None, indices, &picks, &ds[..q])?
        .ok_or("ScatterND needs indices whose last dim is at least 1")?;
    let count = product(&picks)?;
    let at = imp.reshape(linear, vec![count.clone()])?;
    let width = product(&rest)?;
    let rows = imp.reshape(data, vec![product(&ds[..q])?, width.clone()])?;
    let upd = imp.reshape(updates, vec![count, width])?;
    let out = scatter_rows(imp, rows, at, upd, how)?;
    imp.reshape(out, ds)
}

/// ONNX `TensorScatter` (opset 24: a static KV cache's update): `past_cache`
/// with `update` written along `axis` from each batch entry's `write_indices`
/// (`linear`: past the cache's end is an error; `circular`: wrapping). Written as
/// a gather: every cache position reads the update it falls in, if any.
pub(crate) fn tensor_scatter(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (past, update) = (n.input(0)?, n.input(1)?);
    let r = imp.rank(past);
    if imp.rank(update) != r || r < 2 {
        return Err(format!(
            "past_cache and update of ranks {r} and {} (equal, at least 2)",
            imp.rank(update)
        ));
    }
    let axis = norm_axis(n.int("axis", -2), r)?;
    if axis == 0 {
        return Err("axis 0 is the batch axis".into());
    }
    let circular = match n.string("mode").as_deref().unwrap_or("linear") {
        "linear" => false,
        "circular" => true,
        m => return Err(format!("mode '{m}' (linear or circular)")),
    };
    let (ps, us) = (imp.shape(past), imp.shape(update));
    for d in (0..r).filter(|d| *d != axis) {
        if !imp.same_shape(&ps[d..=d], &us[d..=d]) {
            imp.broadcast_shapes(&[vec![ps[d].clone()], vec![us[d].clone()]])?;
        }
    }
    let (cache, len) = (ps[axis].clone(), us[axis].clone());
    // Where each batch entry starts writing, as [batch, 1, …, 1].
    let mut at_shape = vec![SymExpr::constant(1); r];
    at_shape[0] = ps[0].clone();
    let start = match n.opt_input(2) {
        Some(w) => {
            let w = imp.cast(w, DType::I64)?;
            let w = if !circular && len.as_const() != Some(0) {
                // The last position written, checked against the cache (read back
                // through the check, so that it stays in the graph).
                let l = dim_scalar(imp, &len)?;
                let past_end = imp.binary(B::Add, w, l)?;
                let last = imp.binary_scalar(B::Sub, past_end, 1.0)?;
                let last = checked_index(imp, last, &cache)?;
                let l = dim_scalar(imp, &len)?;
                let w = imp.binary(B::Sub, last, l)?;
                imp.binary_scalar(B::Add, w, 1.0)?
            } else {
                w
            };
            imp.reshape(w, at_shape)?
        }
        None => imp.scalar(DType::I64, 0.0)?,
    };
    let j = iota(imp, &ps, axis)?;
    let mut rel = imp.binary(B::Sub, j, start)?;
    if circular {
        let c = dim_scalar(imp, &cache)?;
        rel = imp.binary(B::Mod, rel, c)?;
    }
    let zero = imp.scalar(DType::I64, 0.0)?;
    let l = dim_scalar(imp, &len)?;
    let (ge0, below) = (imp.binary(B::GreaterEq, rel, zero)?, imp.binary(B::Less, rel, l)?);
    let inside = imp.binary(B::And, ge0, below)?;
    let along = imp.select(inside, rel, zero)?;
    let mut linear = None;
    for d in 0..r {
        let stride = product(&us[d + 1..])?;
        let pos = if d == axis { along } else { iota(imp, &ps, d)? };
        linear = Some(add_scaled(imp, linear, pos, &stride)?);
    }
    let linear = linear.ok_or("TensorScatter of a scalar")?;
    let flat = imp.reshape(update, vec![product(&us)?])?;
    let taken = imp.emit(Op::Gather { axis: 0 }, vec![flat, linear], None)?;
    imp.select(inside, taken, past)
}

fn list(s: &[SymExpr]) -> String {
    s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

/// ONNX `ArgMax`/`ArgMin`: the first (or last, `select_last_index`) position of
/// the extreme along `axis`, as i64.
pub(crate) fn arg_extreme(imp: &mut Importer, n: &Node, max: bool) -> R<ValueId> {
    let x = n.input(0)?;
    let r = imp.rank(x);
    let axis = norm_axis(n.int("axis", 0), r.max(1))?;
    let keep = n.int("keepdims", 1) != 0;
    let at = arg_positions(imp, x, axis, max, n.int("select_last_index", 0) != 0)?;
    if keep {
        Ok(at)
    } else {
        let mut shape = imp.shape(at);
        shape.remove(axis);
        imp.reshape(at, shape)
    }
}

/// The position (i64, the axis kept as 1) of `x`'s first or last extreme along `axis`.
fn arg_positions(imp: &mut Importer, x: ValueId, axis: usize, max: bool, last: bool) -> R<ValueId> {
    let shape = imp.shape(x);
    let extreme = imp.reduce(if max { ReduceOp::Max } else { ReduceOp::Min }, x, vec![axis], true)?;
    let hit = imp.binary(B::Equal, x, extreme)?;
    let pos = iota(imp, &shape, axis)?;
    // Positions that are not the extreme lose the min (or max) over the axis.
    let other = imp.fill_like(pos, if last { -1.0 } else { i64::MAX as f64 })?;
    let cand = imp.emit(Op::Select, vec![hit, pos, other], None)?;
    imp.reduce(if last { ReduceOp::Max } else { ReduceOp::Min }, cand, vec![axis], true)
}

/// ONNX `Hardmax` (opset 13): 1 at the first maximum along `axis`, 0 elsewhere.
pub(crate) fn hardmax(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let axis = norm_axis(n.int("axis", -1), imp.rank(x))?;
    let at = arg_positions(imp, x, axis, true, false)?;
    let shape = imp.shape(x);
    let pos = iota(imp, &shape, axis)?;
    let hit = imp.binary(B::Equal, pos, at)?;
    imp.cast(hit, imp.ty(x).dtype)
}

/// ONNX `OneHot` with a constant depth: `values[1]` where the position along
/// the new axis equals the index (negative: from the end), `values[0]` elsewhere.
pub(crate) fn one_hot(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (indices, depth, values) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let depth = match imp.const_f64(depth).as_deref() {
        Some([d]) if d.fract() == 0.0 && *d >= 1.0 => *d as i64,
        _ => return Err("OneHot's depth must be a constant of one positive integer value".into()),
    };
    let mut shape = imp.shape(indices);
    let axis = norm_axis(n.int("axis", -1), shape.len() + 1)?;
    shape.insert(axis, SymExpr::constant(depth));
    let idx = match imp.ty(indices).dtype {
        DType::F32 | DType::F64 => {
            let f = imp.unary(U::Floor, indices)?;
            imp.cast(f, DType::I64)?
        }
        _ => imp.cast(indices, DType::I64)?,
    };
    let neg = imp.binary_scalar(B::Less, idx, 0.0)?;
    let wrapped = imp.binary_scalar(B::Add, idx, depth as f64)?;
    let idx = imp.emit(Op::Select, vec![neg, wrapped, idx], None)?;
    let mut expanded = imp.shape(idx);
    expanded.insert(axis, SymExpr::constant(1));
    let idx = imp.reshape(idx, expanded)?;
    let pos = iota(imp, &shape, axis)?;
    let hit = imp.binary(B::Equal, pos, idx)?;
    let pick = |imp: &mut Importer, i: i64| -> R<ValueId> {
        let ty = TensorType::new(imp.ty(values).dtype, vec![SymExpr::constant(1)]);
        let axes = vec![SliceAxis { axis: 0, start: SymExpr::constant(i), step: 1 }];
        let v = imp.emit(Op::Slice { axes }, vec![values], Some(ty))?;
        imp.expand_to(v, &shape)
    };
    if imp.shape(values).first().and_then(|d| d.as_const()) != Some(2) || imp.rank(values) != 1 {
        return Err("OneHot's values must be [off_value, on_value]".into());
    }
    let (off, on) = (pick(imp, 0)?, pick(imp, 1)?);
    imp.emit(Op::Select, vec![hit, on, off], None)
}

/// ONNX `EyeLike`: ones on the `k`-th diagonal of a 2-D tensor shaped like the input.
pub(crate) fn eye_like(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let dtype = match n.int("dtype", 0) as i32 {
        0 => imp.ty(x).dtype,
        code => crate::load::dtype_of(code)
            .ok_or_else(|| format!("EyeLike to {} is not supported", crate::load::dtype_name(code)))?,
    };
    let shape = imp.shape(x);
    if shape.len() != 2 {
        return Err("EyeLike takes a 2-D input".into());
    }
    let rows = iota(imp, &shape, 0)?;
    let cols = iota(imp, &shape, 1)?;
    let diff = imp.binary(B::Sub, cols, rows)?;
    let on = imp.binary_scalar(B::Equal, diff, n.int("k", 0) as f64)?;
    imp.cast(on, dtype)
}

/// The most TopK elements unrolled (one arg-extreme per element).
const TOPK_MAX: i64 = 64;

/// ONNX `TopK` with a constant `k` (at most [`TOPK_MAX`]): the `k` largest (or
/// smallest) values along `axis` and their positions, extreme first, ties in
/// index order (also for `sorted=0`, which allows any order). One arg-extreme
/// per element, over the positions not yet taken.
pub(crate) fn top_k(imp: &mut Importer, n: &Node) -> R<Vec<ValueId>> {
    let x = n.input(0)?;
    let k = match imp.const_ints(n.input(1)?, "TopK's k")?.as_slice() {
        [k] => *k,
        other => return Err(format!("TopK's k must be one value, got {} values", other.len())),
    };
    if !(1..=TOPK_MAX).contains(&k) {
        return Err(format!("TopK with k = {k}: 1 to {TOPK_MAX} are supported"));
    }
    let shape = imp.shape(x);
    let axis = norm_axis(n.int("axis", -1), shape.len())?;
    if shape[axis].as_const().is_some_and(|d| d < k) {
        return Err(format!("TopK's k = {k} exceeds the axis's extent {}", shape[axis]));
    }
    let largest = n.int("largest", 1) != 0;
    let dt = imp.ty(x).dtype;
    // What a taken position reads as: never the extreme of what is left.
    let sentinel = match (dt.is_float(), largest) {
        (true, true) => f64::NEG_INFINITY,
        (true, false) => f64::INFINITY,
        (false, true) => -(2f64.powi(62)),
        (false, false) => 2f64.powi(62),
    };
    let pos = iota(imp, &shape, axis)?;
    let mut taken = imp.fill_like(pos, 0.0)?;
    taken = imp.cast(taken, DType::Bool)?;
    let (mut values, mut indices) = (Vec::new(), Vec::new());
    for _ in 0..k {
        let hidden = imp.fill_like(x, sentinel)?;
        let left = imp.emit(Op::Select, vec![taken, hidden, x], None)?;
        let op = if largest { ReduceOp::Max } else { ReduceOp::Min };
        let extreme = imp.reduce(op, left, vec![axis], true)?;
        let hit = imp.binary(B::Equal, x, extreme)?;
        let free = imp.unary(U::Not, taken)?;
        let hit = imp.binary(B::And, hit, free)?;
        let none = imp.fill_like(pos, i64::MAX as f64)?;
        let cand = imp.emit(Op::Select, vec![hit, pos, none], None)?;
        let at = imp.reduce(ReduceOp::Min, cand, vec![axis], true)?;
        let now = imp.binary(B::Equal, pos, at)?;
        taken = imp.binary(B::Or, taken, now)?;
        values.push(extreme);
        indices.push(at);
    }
    let join = |imp: &mut Importer, parts: Vec<ValueId>| -> R<ValueId> {
        if parts.len() == 1 {
            return Ok(parts[0]);
        }
        let mut out = imp.shape(parts[0]);
        out[axis] = SymExpr::constant(parts.len() as i64);
        let ty = TensorType::new(imp.ty(parts[0]).dtype, out);
        imp.emit(Op::Concat { axis }, parts, Some(ty))
    };
    Ok(vec![join(imp, values)?, join(imp, indices)?])
}
