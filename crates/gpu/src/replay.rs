//! A device run replayed without the device: `anyshape-gpu bench --json` records each
//! kernel's calibration (the measured lowest level) and every choice's measured time
//! on every product of the sweep (the exhaustive search). From that record the wave
//! model's choices can be taken again, by this build's model, and its regret measured
//! on any machine: a change to the model is judged on the last device run's numbers
//! before a device is at hand. The kernels themselves are not re-run, so a replay
//! says nothing of a changed kernel.

use crate::kernel::{BLayout, GemmKernel, Problem};
use crate::tree::MTree;
use crate::wave::{DeviceLimits, KernelRate, ReduceRate, WaveModel};
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("line {line}: {msg}")]
    Line { line: usize, msg: String },
    #[error("the record calibrates {0}, which this build's family does not have")]
    UnknownKernel(String),
    #[error("the record has no calibration and no product")]
    Empty,
}

/// One product of the sweep and every choice's measured time (seconds), by the
/// choice's name (`WaveModel::describe`).
#[derive(Clone, Debug)]
pub struct Measured {
    pub layout: BLayout,
    pub problem: Problem,
    pub times: Vec<(String, f64)>,
}

/// What a device run recorded.
#[derive(Clone, Debug)]
pub struct Record {
    pub device: DeviceLimits,
    pub rates: Vec<KernelRate>,
    /// The split-K reduction's calibration, where the run measured it.
    pub reduce: Option<ReduceRate>,
    pub products: Vec<Measured>,
    /// Stream-K kernels timed against their tiles (`bench`'s last section).
    pub stream_k: Vec<StreamTimed>,
}

/// A Stream-K kernel's measured time on one product in some blocks.
#[derive(Clone, Debug, Deserialize)]
pub struct StreamTimed {
    #[serde(rename = "stream_k")]
    pub kernel: String,
    pub layout: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub blocks: usize,
    /// Seconds.
    pub s: f64,
}

impl StreamTimed {
    /// This build's price of the timing (`WaveModel::predict_stream_k`) from
    /// the record's calibration of its tile: `None` where the record did not
    /// calibrate the tile, or `family` has no such Stream-K kernel.
    pub fn predicted(&self, record: &Record, family: &[GemmKernel]) -> Option<f64> {
        let k = family.iter().find(|k| k.stream_k && k.name() == self.kernel)?;
        let model = record
            .model(k.b, family.iter().filter(|x| !x.stream_k).copied().collect::<Vec<_>>().as_slice())
            .ok()?;
        let plain = k.unsplit();
        let tile = model.kernels.iter().position(|x| *x == plain)?;
        model.predict_stream_k(tile, k, &Problem::nt(1, self.m, self.n, self.k).with_b(k.b), self.blocks)
    }
}

#[derive(Deserialize)]
struct ProductLine {
    layout: String,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    all: serde_json::Map<String, serde_json::Value>,
}

impl Record {
    /// Reads a `bench --json` file: a line a calibration (`{"calibration": …}`), a
    /// line a product (`{"layout", "batch", "m", "n", "k", "all": {choice: seconds}}`),
    /// the device's limits (`{"device": …}`; a record written before they were kept
    /// gets Hopper's, with the bench's default bandwidth of 4000 GB/s), the split-K
    /// reduction's calibration (`{"reduction": …}`) and the summary, which is
    /// ignored.
    pub fn parse(text: &str) -> Result<Record, ReplayError> {
        let mut record = Record {
            device: DeviceLimits::hopper(4000e9),
            rates: Vec::new(),
            reduce: None,
            products: Vec::new(),
            stream_k: Vec::new(),
        };
        for (i, line) in text.lines().enumerate() {
            let bad = |msg: String| ReplayError::Line { line: i + 1, msg };
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
            if let Some(c) = v.get("calibration") {
                record.rates.push(KernelRate::deserialize(c).map_err(|e| bad(format!("calibration: {e}")))?);
            } else if let Some(r) = v.get("reduction") {
                record.reduce = Some(ReduceRate::deserialize(r).map_err(|e| bad(format!("reduction: {e}")))?);
            } else if let Some(d) = v.get("device") {
                record.device = DeviceLimits::deserialize(d).map_err(|e| bad(format!("device: {e}")))?;
            } else if v.get("all").is_some() {
                let p = ProductLine::deserialize(&v).map_err(|e| bad(format!("product: {e}")))?;
                let layout = match p.layout.as_str() {
                    "nt" => BLayout::KMajor,
                    "nn" => BLayout::NMajor,
                    other => return Err(bad(format!("unknown layout {other:?}"))),
                };
                let mut times = Vec::new();
                for (name, t) in p.all {
                    let t = t
                        .as_f64()
                        .filter(|t| t.is_finite() && *t > 0.0)
                        .ok_or_else(|| bad(format!("{name}: not a time: {t}")))?;
                    times.push((name, t));
                }
                record.products.push(Measured {
                    layout,
                    problem: Problem::nt(p.batch, p.m, p.n, p.k).with_b(layout),
                    times,
                });
            } else if v.get("stream_k").is_some() {
                record
                    .stream_k
                    .push(StreamTimed::deserialize(&v).map_err(|e| bad(format!("Stream-K: {e}")))?);
            } else if v.get("regret").is_none() {
                return Err(bad(
                    "neither a calibration, a product, the device, a Stream-K timing nor the summary".into(),
                ));
            }
        }
        if record.rates.is_empty() && record.products.is_empty() {
            return Err(ReplayError::Empty);
        }
        Ok(record)
    }

    /// The model the run built for `layout`: the calibrated kernels of that B layout,
    /// in the record's order, described by `family` (matched by name).
    pub fn model(&self, layout: BLayout, family: &[GemmKernel]) -> Result<WaveModel, ReplayError> {
        let mut kernels = Vec::new();
        let mut rates = Vec::new();
        for r in &self.rates {
            let k = family
                .iter()
                .find(|k| k.name() == r.name)
                .ok_or_else(|| ReplayError::UnknownKernel(r.name.clone()))?;
            if k.b == layout {
                kernels.push(*k);
                rates.push(r.clone());
            }
        }
        Ok(WaveModel { device: self.device, kernels, rates, reduce: self.reduce })
    }
}

/// One product replayed: the best measured cover, and the model's pick among the
/// covers the run measured, with its measured time (`None` when the run measured
/// none of the model's covers); the model's pick among all its covers where the
/// run did not measure it (`unmeasured`: a two-size cover an older run never
/// timed, with its predicted time); every cover the model considered, by name
/// ([`WaveModel::describe_cover`]), with its predicted and measured time.
#[derive(Clone, Debug)]
pub struct Replayed {
    pub layout: BLayout,
    pub problem: Problem,
    pub best: String,
    pub best_s: f64,
    pub pick: String,
    pub pick_s: Option<f64>,
    pub predicted_s: f64,
    pub unmeasured: Option<(String, f64)>,
    pub choices: Vec<(String, f64, Option<f64>)>,
}

impl Replayed {
    /// The pick's time over the best's, less one (0: the model found the best).
    pub fn regret(&self) -> Option<f64> {
        self.pick_s.map(|t| t / self.best_s - 1.0)
    }
}

/// Every product of `record` through this build's wave model over `family`: the
/// model picks among the covers the run measured (its regret is then exact), and
/// says where it would rather have taken one the run did not.
pub fn replay(record: &Record, family: &[GemmKernel]) -> Result<Vec<Replayed>, ReplayError> {
    let models = [BLayout::KMajor, BLayout::NMajor].map(|l| record.model(l, family).map(|m| (l, m)));
    let models: Vec<(BLayout, WaveModel)> = models.into_iter().collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for m in &record.products {
        let Some((_, model)) = models.iter().find(|(l, _)| *l == m.layout) else { continue };
        let Some((best, best_s)) = m.times.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else { continue };
        let measured = |name: &str| m.times.iter().find(|(n, _)| n == name).map(|x| x.1);
        let p = &m.problem;
        let choices: Vec<(String, f64, Option<f64>)> = model
            .covers(p)
            .iter()
            .map(|c| {
                let name = model.describe_cover(c, p);
                let t = measured(&name);
                (name, model.predict_cover(c, p), t)
            })
            .collect();
        let fastest = |x: &&(String, f64, Option<f64>), y: &&(String, f64, Option<f64>)| x.1.total_cmp(&y.1);
        // The model's own pick (a two-size cover only past its margin), and its
        // pick among what the run measured.
        let Some((overall, overall_s)) = model.choose_cover(p) else { continue };
        let overall = (model.describe_cover(&overall, p), overall_s);
        let unmeasured = measured(&overall.0).is_none().then_some(overall.clone());
        let (pick, predicted_s, pick_s) = match choices.iter().filter(|c| c.2.is_some()).min_by(fastest) {
            Some(c) => c.clone(),
            None => (overall.0, overall.1, None),
        };
        out.push(Replayed {
            layout: m.layout,
            problem: m.problem,
            best: best.clone(),
            best_s: *best_s,
            pick,
            pick_s,
            predicted_s,
            unmeasured,
            choices,
        });
    }
    Ok(out)
}

/// Regret over a sweep, in percent, as the bench prints it: the mean, the middle
/// value of the sorted list (`len / 2`) and the largest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Regret {
    pub mean: f64,
    pub median: f64,
    pub max: f64,
}

impl Regret {
    /// Of regrets given as fractions (0.05: 5%).
    pub fn of(regrets: &[f64]) -> Regret {
        let mut r = regrets.to_vec();
        r.sort_by(f64::total_cmp);
        let mean = r.iter().sum::<f64>() / r.len().max(1) as f64;
        Regret {
            mean: mean * 100.0,
            median: r.get(r.len() / 2).copied().unwrap_or(0.0) * 100.0,
            max: r.last().copied().unwrap_or(0.0) * 100.0,
        }
    }
}

/// Where the model covers M with two sizes, over every M up to `m_max` of one
/// product signature of a record's sweep: the distilled tree's size, the M it
/// covers with two sizes, and its predicted gain there over the best single choice
/// (a prediction: a record from before the bench timed covers holds no time of
/// one).
#[derive(Clone, Debug)]
pub struct CoverStudy {
    pub layout: BLayout,
    pub batch: usize,
    pub n: usize,
    pub k: usize,
    pub leaves: usize,
    pub depth: usize,
    pub covered: usize,
    pub m_max: usize,
    pub gain_mean: f64,
    pub gain_max: f64,
}

/// [`CoverStudy`] for each batch-1 signature of `record`'s sweep, in its order.
pub fn cover_study(
    record: &Record,
    family: &[GemmKernel],
    m_max: usize,
) -> Result<Vec<CoverStudy>, ReplayError> {
    let mut out: Vec<CoverStudy> = Vec::new();
    for m in &record.products {
        let p = m.problem;
        if p.batch != 1 || out.iter().any(|s| (s.layout, s.n, s.k) == (m.layout, p.n, p.k)) {
            continue;
        }
        let model = record.model(m.layout, family)?;
        let Some(tree) = MTree::distill(&model, Problem { batch: 1, ..p }, m_max) else { continue };
        let mut gains = Vec::new();
        for rows in 1..=m_max {
            let q = Problem { batch: 1, m: rows, ..p };
            let c = tree.choose(&model, rows);
            if let (Some(c), Some((_, single))) = (c.filter(|c| c.split.is_some()), model.choose(&q)) {
                gains.push(1.0 - model.predict_cover(&c, &q) / single);
            }
        }
        out.push(CoverStudy {
            layout: m.layout,
            batch: 1,
            n: p.n,
            k: p.k,
            leaves: tree.bounds.len(),
            depth: tree.depth(),
            covered: gains.len(),
            m_max,
            gain_mean: gains.iter().sum::<f64>() / gains.len().max(1) as f64,
            gain_max: gains.iter().copied().fold(0.0, f64::max),
        });
    }
    Ok(out)
}

/// The model's misses by regime, over every single choice a record timed: the
/// geometric mean of measured over predicted time. A partial first wave is binned
/// by the share of SMs it keeps busy, apart for kernels of one block an SM and of
/// more; products of a full wave or more by their waves (1, 2-3, 4-7, 8 or more).
/// Times under `floor` seconds (a launch's cost) are left out.
#[derive(Clone, Debug, PartialEq)]
pub struct Residual {
    pub regime: String,
    pub timings: usize,
    pub ratio: f64,
}

/// Stream-K's price on one product of a record (`replay --stream-k`): the
/// cheapest Stream-K kernel whose tile the record calibrated, in a wave of
/// blocks, against the best time the record measured. A prediction of the
/// unvalidated [`WaveModel::predict_stream_k`]: what the next device run
/// should time first.
#[derive(Clone, Debug)]
pub struct StreamStudy {
    pub layout: BLayout,
    pub problem: Problem,
    pub kernel: String,
    pub blocks: usize,
    pub predicted: f64,
    pub best: String,
    pub best_s: f64,
}

/// [`StreamStudy`] for each single product of `record` that a kernel of
/// `stream` takes, the tiles described by `family`.
pub fn stream_study(
    record: &Record,
    family: &[GemmKernel],
    stream: &[GemmKernel],
) -> Result<Vec<StreamStudy>, ReplayError> {
    let mut out = Vec::new();
    for layout in [BLayout::KMajor, BLayout::NMajor] {
        let model = record.model(layout, family)?;
        for m in record.products.iter().filter(|m| m.layout == layout && m.problem.batch == 1) {
            let p = m.problem;
            let Some((best, best_s)) = m.times.iter().min_by(|a, b| a.1.total_cmp(&b.1)).cloned() else {
                continue;
            };
            let priced = stream.iter().filter(|k| k.b == layout && k.accepts(&p).is_ok()).filter_map(|k| {
                let plain = k.unsplit();
                let tile = model.kernels.iter().position(|x| *x == plain)?;
                let slots = model.device.sms * model.rates[tile].occupancy.max(1);
                let blocks = slots.min(k.stream_steps(&p));
                Some((k.name(), blocks, model.predict_stream_k(tile, k, &p, blocks)?))
            });
            if let Some((kernel, blocks, predicted)) = priced.min_by(|a, b| a.2.total_cmp(&b.2)) {
                out.push(StreamStudy { layout, problem: p, kernel, blocks, predicted, best, best_s });
            }
        }
    }
    Ok(out)
}

/// [`Residual`]s of `record` through this build's model over `family`.
pub fn residuals(record: &Record, family: &[GemmKernel], floor: f64) -> Result<Vec<Residual>, ReplayError> {
    let mut bins: Vec<(String, f64, usize)> = Vec::new();
    for layout in [BLayout::KMajor, BLayout::NMajor] {
        let model = record.model(layout, family)?;
        let sms = model.device.sms;
        for m in record.products.iter().filter(|m| m.layout == layout) {
            for c in model.choices(&m.problem).into_iter().filter(|c| c.splits == 1) {
                let name = model.describe(c);
                let Some(&(_, t)) = m.times.iter().find(|x| x.0 == name) else { continue };
                if t < floor {
                    continue;
                }
                let occ = model.rates[c.kernel].occupancy.max(1);
                let blocks = model.kernels[c.kernel].blocks(&m.problem);
                let regime = if blocks < sms * occ {
                    let tenth = (blocks.min(sms) * 10 / sms).min(9);
                    let kind = if occ == 1 { "one block an SM" } else { "several blocks an SM" };
                    format!("partial wave, {kind}, {}-{}% of SMs busy", tenth * 10, tenth * 10 + 10)
                } else {
                    let waves = blocks / (sms * occ);
                    let w = match waves {
                        1 => "1 full wave",
                        2..=3 => "2-3 full waves",
                        4..=7 => "4-7 full waves",
                        _ => "8 or more full waves",
                    };
                    w.to_string()
                };
                let x = (t / model.predict(c, &m.problem)).ln();
                match bins.iter_mut().find(|b| b.0 == regime) {
                    Some(b) => {
                        b.1 += x;
                        b.2 += 1;
                    }
                    None => bins.push((regime, x, 1)),
                }
            }
        }
    }
    bins.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(bins
        .into_iter()
        .map(|(regime, x, n)| Residual { regime, timings: n, ratio: (x / n as f64).exp() })
        .collect())
}
