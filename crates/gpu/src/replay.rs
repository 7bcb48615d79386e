//! A device run replayed without the device: `anyshape-gpu bench --json` records each
//! kernel's calibration (the measured lowest level) and every choice's measured time
//! on every product of the sweep (the exhaustive search). From that record the wave
//! model's choices can be taken again, by this build's model, and its regret measured
//! on any machine: a change to the model is judged on the last device run's numbers
//! before a device is at hand. The kernels themselves are not re-run, so a replay
//! says nothing of a changed kernel.

use crate::kernel::{BLayout, GemmKernel, Problem};
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
                    problem: Problem::new(p.batch, p.m, p.n, p.k),
                    times,
                });
            } else if v.get("regret").is_none() {
                return Err(bad("neither a calibration, a product, the device nor the summary".into()));
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

/// One product replayed: the best measured choice, and the model's pick with its
/// measured time (`None` when the run did not measure that choice: a model that
/// considers choices the run did not); every choice the model considered, by name,
/// with its predicted and measured time.
#[derive(Clone, Debug)]
pub struct Replayed {
    pub layout: BLayout,
    pub problem: Problem,
    pub best: String,
    pub best_s: f64,
    pub pick: String,
    pub pick_s: Option<f64>,
    pub predicted_s: f64,
    pub choices: Vec<(String, f64, Option<f64>)>,
}

impl Replayed {
    /// The pick's time over the best's, less one (0: the model found the best).
    pub fn regret(&self) -> Option<f64> {
        self.pick_s.map(|t| t / self.best_s - 1.0)
    }
}

/// Every product of `record` through this build's wave model over `family`.
pub fn replay(record: &Record, family: &[GemmKernel]) -> Result<Vec<Replayed>, ReplayError> {
    let models = [BLayout::KMajor, BLayout::NMajor].map(|l| record.model(l, family).map(|m| (l, m)));
    let models: Vec<(BLayout, WaveModel)> = models.into_iter().collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for m in &record.products {
        let Some((_, model)) = models.iter().find(|(l, _)| *l == m.layout) else { continue };
        let Some((best, best_s)) = m.times.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else { continue };
        let Some((choice, predicted_s)) = model.choose(&m.problem) else { continue };
        let measured = |name: &str| m.times.iter().find(|(n, _)| n == name).map(|x| x.1);
        let pick = model.describe(choice);
        let pick_s = measured(&pick);
        let choices = model
            .choices(&m.problem)
            .into_iter()
            .map(|c| {
                let name = model.describe(c);
                let t = measured(&name);
                (name, model.predict(c, &m.problem), t)
            })
            .collect();
        out.push(Replayed {
            layout: m.layout,
            problem: m.problem,
            best: best.clone(),
            best_s: *best_s,
            pick,
            pick_s,
            predicted_s,
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
