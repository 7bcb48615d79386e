//! Fused attention steps on the GPU (`plan::gpu`'s attention kernel): what
//! a step launches at a shape, decided once when the shape is planned. The
//! kernel reads Q, K and V in place through their strided views (a batch
//! entry's offsets listed in its descriptor, so grouped-query attention's
//! shared key/value heads need no copies) and writes O; its logits come from
//! the step's online softmax program, which reads the model's other buffers
//! (a mask) through its own buffer table and a dim table in which its chunk
//! is the whole row of keys.

use plan::gpu::{
    attention_partials, attention_smem, attention_splits, ATTENTION_HEADER, ATTENTION_POINTERS,
    ATTENTION_ROWS, LOOP_MAX_BLOCKS,
};
use plan::{AttentionStep, BufId};

use crate::shape::AttentionShape;
use crate::RunError;

/// The attention kernel a step runs: its index in the device's code and the
/// head dimension it is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttentionChoice {
    pub index: usize,
    pub head: usize,
}

/// A fused attention step at one shape.
#[derive(Clone, Debug)]
pub struct AttentionLaunch {
    pub kernel: usize,
    pub blocks: u32,
    /// Bytes of shared memory a block asks for.
    pub smem: u32,
    /// The descriptor's words after its pointers (the status word's, Q's, K's,
    /// V's, O's, the partials' and the counters': filled per call), then the
    /// entries' offsets.
    pub words: Vec<i64>,
    /// Blocks of query rows (one split counter each, zeroed per call) and the
    /// bytes of the split keys' partials (none when the keys are not split).
    pub row_blocks: usize,
    pub splits: usize,
    pub partials: usize,
    /// The kernel's dim table: the shape's with these slots set (its chunk
    /// the whole row of keys); steps whose slots say the same share a copy.
    pub dims: [(usize, i64); 2],
    /// Its buffer table: the online program's parameters, `None` for the
    /// tiles it never reads (the scores, probabilities, running maxima and the
    /// logits it stores).
    pub table: Vec<Option<BufId>>,
    /// The buffers behind the descriptor's Q, K, V and O pointers.
    pub operands: [BufId; 4],
}

impl AttentionLaunch {
    /// Words of the descriptor, pointers included.
    pub fn descriptor_len(&self) -> usize {
        ATTENTION_POINTERS + self.words.len()
    }
}

/// What step `i`, fused attention `a` run by kernel `choice`, launches at
/// shape `s` whose dim table has `dims_len` slots.
pub fn launch(
    i: usize,
    a: &AttentionStep,
    s: &AttentionShape,
    dims_len: usize,
    choice: AttentionChoice,
) -> Result<AttentionLaunch, RunError> {
    let bad = |why: String| RunError::Internal(format!("step {i} (fused attention): {why}"));
    let online = a.online.as_ref().ok_or_else(|| bad("no online softmax program".into()))?;
    let (sc, out) = (&s.scores, &s.output);
    if sc.taps.is_some() || out.taps.is_some() {
        return Err(bad("a product reads convolution taps".into()));
    }
    let (lq, lk, d) = (sc.m, sc.n, sc.k);
    if out.m != lq || out.k != lk || out.n != d || out.entries.len() != sc.entries.len() {
        return Err(bad(format!(
            "scores {lq}x{lk}x{d} and output {}x{}x{} over {} and {} entries",
            out.m,
            out.n,
            out.k,
            sc.entries.len(),
            out.entries.len()
        )));
    }
    if d != choice.head {
        return Err(bad(format!("head dimension {d}, the kernel's is {}", choice.head)));
    }
    let qblocks = lq.div_ceil(ATTENTION_ROWS);
    let row_blocks = qblocks.saturating_mul(sc.entries.len());
    // Few blocks of rows (a decode step) against many keys: the keys split.
    let splits = attention_splits(row_blocks, lk);
    let units = row_blocks.saturating_mul(splits);
    let blocks = units.clamp(1, LOOP_MAX_BLOCKS) as u32;
    let w = |x: usize| x as i64;
    let mut words = Vec::with_capacity(ATTENTION_HEADER - ATTENTION_POINTERS + 4 * sc.entries.len());
    words.extend([
        w(lq),
        w(lk),
        w(qblocks),
        w(sc.entries.len()),
        w(splits),
        w(sc.rs[0]),
        w(sc.cs[0]),
        // Kᵀ's element (d, key) is at `rs·d + cs·key`: keys `cs` apart.
        w(sc.cs[1]),
        w(sc.rs[1]),
        w(out.rs[1]),
        w(out.cs[1]),
        w(out.rs[2]),
        w(out.cs[2]),
    ]);
    debug_assert_eq!(ATTENTION_POINTERS + words.len(), ATTENTION_HEADER);
    for (se, oe) in sc.entries.iter().zip(&out.entries) {
        words.extend([w(se[0]), w(se[1]), w(oe[1]), w(oe[2])]);
    }
    let dims = [(online.offset_slot as usize, 0), (online.len_slot as usize, w(lk))];
    if let Some((slot, _)) = dims.iter().find(|(slot, _)| *slot >= dims_len) {
        return Err(bad(format!("no dim slot {slot}")));
    }
    let mut table: Vec<Option<BufId>> = a
        .args
        .iter()
        .enumerate()
        .map(|(k, b)| (k != a.scores_param && k != a.probs_param).then_some(*b))
        .collect();
    table.extend([None, None]);
    Ok(AttentionLaunch {
        kernel: choice.index,
        blocks,
        smem: attention_smem(d) as u32,
        words,
        row_blocks,
        splits,
        partials: attention_partials(row_blocks, splits, d),
        dims,
        table,
        operands: [a.scores.a.buf, a.scores.b.buf, a.output.b.buf, a.output.c.buf],
    })
}

/// The distinct dim tables of `launches` (by the slots each sets), in the
/// order of their first use.
pub fn dim_tables<'a>(launches: impl IntoIterator<Item = &'a AttentionLaunch>) -> Vec<[(usize, i64); 2]> {
    let mut out: Vec<[(usize, i64); 2]> = Vec::new();
    for a in launches {
        if !out.contains(&a.dims) {
            out.push(a.dims);
        }
    }
    out
}
