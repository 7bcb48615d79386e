//! DietCode's categorization (§5) for a known shape distribution: when the user
//! gives the shapes a contraction will meet (`anyshape tune --samples FILE`), keep
//! only the micro-kernels those shapes need, trading the number of kernels kept
//! (compile time, code size, candidates to rank at dispatch) against predicted
//! performance.
//!
//! DietCode learns its categories jointly with its cost model on GPU samples; here
//! the analytical model is already there, so the categorization is a greedy
//! backward elimination over it: start from the whole family, and at each step drop
//! the kernel whose loss raises the samples' weighted mean predicted slowdown the
//! least (a shape left with no candidate forbids the drop). The path from the whole
//! family down to one kernel is the trade-off curve; the caller picks a point on it.

use kernels::schedule::{candidates, KernelFamily, Problem};
use kernels::{CostModel, MachineModel};
use kernels::{Dispatcher, KernelError, Target};

/// One micro-kernel of a family: its form and tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct KernelId {
    pub direct: bool,
    pub mr: usize,
    pub nr: usize,
}

impl std::fmt::Display for KernelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}x{}", if self.direct { "direct " } else { "" }, self.mr, self.nr)
    }
}

/// A shape of the distribution and how often it comes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub problem: Problem,
    pub weight: f64,
}

/// One point of the trade-off: the kernels kept, and the samples' predicted
/// slowdown against the whole family (1.0 = none).
#[derive(Clone, Debug, PartialEq)]
pub struct TradeOff {
    pub kernels: Vec<KernelId>,
    /// The weighted mean of `cost(sample, kept) / cost(sample, whole family)`.
    pub mean_slowdown: f64,
    pub max_slowdown: f64,
}

/// Every kernel of `fam`.
pub fn kernel_ids(fam: &KernelFamily) -> Vec<KernelId> {
    let packed = fam.variants().iter().map(|v| KernelId { direct: false, mr: v.kernel.mr, nr: v.kernel.nr });
    let direct =
        fam.direct_variants().iter().map(|v| KernelId { direct: true, mr: v.kernel.mr, nr: v.kernel.nr });
    let mut ids: Vec<KernelId> = packed.chain(direct).collect();
    ids.sort_unstable();
    ids
}

/// `fam` with only the kernels in `keep` (at least one packed kernel must stay).
pub fn restrict(fam: &KernelFamily, keep: &[KernelId]) -> Result<KernelFamily, KernelError> {
    let kept = |direct: bool, mr: usize, nr: usize| keep.contains(&KernelId { direct, mr, nr });
    let packed: Vec<_> =
        fam.variants().iter().filter(|v| kept(false, v.kernel.mr, v.kernel.nr)).copied().collect();
    let direct: Vec<_> =
        fam.direct_variants().iter().filter(|v| kept(true, v.kernel.mr, v.kernel.nr)).copied().collect();
    KernelFamily::new(packed)?.with_direct(direct)
}

/// The model's best predicted cost of each sample with `fam`; `None` when a sample
/// has no candidate.
fn best_costs(
    t: &Target,
    machine: &MachineModel,
    model: CostModel,
    fam: &KernelFamily,
    samples: &[Sample],
) -> Option<Vec<f64>> {
    let d = Dispatcher::new(t.clone(), fam.clone(), *machine, model);
    samples
        .iter()
        .map(|s| {
            let p = &s.problem;
            if candidates(t, machine.threads, fam, p).is_empty() {
                return None;
            }
            let choice = d.choose(p).ok()?;
            Some(model.cost(machine, fam, p, &choice))
        })
        .collect()
}

/// The trade-off curve of `samples` over `fam`, from the whole family (first) down
/// to the smallest family that still serves every sample (last).
pub fn categorize(
    t: &Target,
    machine: &MachineModel,
    model: CostModel,
    fam: &KernelFamily,
    samples: &[Sample],
) -> Result<Vec<TradeOff>, KernelError> {
    if samples.is_empty() {
        return Err(KernelError::Shape("no sample shapes to categorize".into()));
    }
    if samples.iter().any(|s| !(s.weight > 0.0 && s.weight.is_finite())) {
        return Err(KernelError::Shape("sample weights must be positive".into()));
    }
    let full = best_costs(t, machine, model, fam, samples)
        .ok_or_else(|| KernelError::Shape("a sample shape has no schedule with this family".into()))?;
    let total: f64 = samples.iter().map(|s| s.weight).sum();
    let score = |costs: &[f64]| -> (f64, f64) {
        let ratios = costs.iter().zip(&full).map(|(c, f)| c / f.max(1e-30));
        let mean = ratios.clone().zip(samples).map(|(r, s)| r * s.weight).sum::<f64>() / total;
        (mean, ratios.fold(1.0, f64::max))
    };
    let mut kept = kernel_ids(fam);
    let (mean, max) = score(&full);
    let mut curve = vec![TradeOff { kernels: kept.clone(), mean_slowdown: mean, max_slowdown: max }];
    while kept.len() > 1 {
        let mut best: Option<(f64, f64, usize)> = None;
        for i in 0..kept.len() {
            let mut trial = kept.clone();
            trial.remove(i);
            let Ok(sub) = restrict(fam, &trial) else { continue };
            let Some(costs) = best_costs(t, machine, model, &sub, samples) else { continue };
            let (mean, max) = score(&costs);
            if best.is_none_or(|(m, _, _)| mean < m) {
                best = Some((mean, max, i));
            }
        }
        let Some((mean, max, i)) = best else { break };
        kept.remove(i);
        curve.push(TradeOff { kernels: kept.clone(), mean_slowdown: mean, max_slowdown: max });
    }
    Ok(curve)
}

/// The smallest family on `curve` whose predicted mean slowdown is within
/// `tolerance` (0.02: 2%) of the whole family's.
pub fn pick(curve: &[TradeOff], tolerance: f64) -> Option<&TradeOff> {
    curve.iter().filter(|c| c.mean_slowdown <= 1.0 + tolerance).min_by_key(|c| c.kernels.len())
}

/// One line of a samples file: `m,n,k[,batch[,weight]]` (batch 1 and weight 1 when
/// left out); blank lines and `#` comments are skipped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleShape {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub weight: f64,
}

/// Parse a samples file; errors name the line.
pub fn parse_samples(text: &str) -> Result<Vec<SampleShape>, KernelError> {
    let mut out = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| KernelError::Shape(format!("line {}: `{line}`: {why}", no + 1));
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if !(3..=5).contains(&fields.len()) {
            return Err(bad("expected m,n,k[,batch[,weight]]"));
        }
        let dim = |i: usize| -> Result<usize, KernelError> {
            let v: usize = fields[i].parse().map_err(|_| bad("extents are positive integers"))?;
            if v == 0 || v > 1 << 24 {
                return Err(bad("extents are between 1 and 2^24"));
            }
            Ok(v)
        };
        let batch = if fields.len() > 3 { dim(3)? } else { 1 };
        let weight: f64 = match fields.get(4) {
            Some(w) => w.parse().map_err(|_| bad("the weight is a number"))?,
            None => 1.0,
        };
        if !(weight > 0.0 && weight.is_finite()) {
            return Err(bad("the weight must be positive"));
        }
        out.push(SampleShape { batch, m: dim(0)?, n: dim(1)?, k: dim(2)?, weight });
    }
    if out.is_empty() {
        return Err(KernelError::Shape("the samples file lists no shape".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_parse_and_bad_lines_are_named() {
        let s = parse_samples("# BERT\n16,2304,768\n 128 , 2304, 768, 1, 3.5\n\n16,16,64,12\n").unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[1], SampleShape { batch: 1, m: 128, n: 2304, k: 768, weight: 3.5 });
        assert_eq!(s[2].batch, 12);
        for (text, line) in [("1,2\n", "line 1"), ("1,2,3\n0,2,3\n", "line 2"), ("1,2,3,1,-1", "line 1")] {
            let e = parse_samples(text).unwrap_err().to_string();
            assert!(e.contains(line), "{e}");
        }
        assert!(parse_samples("# nothing\n").is_err());
    }
}
