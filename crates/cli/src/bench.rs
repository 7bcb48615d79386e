//! `anyshape bench-matmul`: the contraction engine on single (or batched)
//! matmuls, as a compiled model runs them: one compiled contraction (a kernel
//! family and its dispatcher) serves every shape; a weight is packed once for the
//! row counts it will meet, not for the shape being measured.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use kernels::{
    execute, ALayout, BLayout, BOperand, CostModel, Dispatcher, EpilogueArgs, MatMut, MatRef,
    Operands as OperandAccess, PackedB, Problem, Schedule, ThreadPool,
};

use crate::UserError;

#[derive(clap::Args)]
pub struct BenchMatmulArgs {
    /// Rows of A (comma-separated: one benchmark each).
    #[arg(long, value_delimiter = ',', required_unless_present = "conv")]
    m: Vec<usize>,
    /// Columns of B.
    #[arg(long, value_delimiter = ',', required = true)]
    n: Vec<usize>,
    /// The contraction extent.
    #[arg(long, value_delimiter = ',', required_unless_present = "conv")]
    k: Vec<usize>,
    /// A convolution as implicit GEMM instead of a plain A: its taps over a
    /// channels-last image, `HxWxC:KHxKW[:sS][:pP][:dD]` (stride, zero padding and
    /// dilation on both axes; default 1, 0, 1), e.g. `56x56x64:3x3:s1:p1`; M and
    /// K follow from it, --n is the output channels.
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["m", "k", "bt", "batch"])]
    conv: Option<String>,
    /// Independent matmuls per run (a batched contraction: both operands are
    /// activations, as attention's Q·Kᵀ and P·V).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// B is stored transposed (`n × k` row-major, as attention's K in Q·Kᵀ).
    #[arg(long)]
    bt: bool,
    /// Threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Generate AVX2 code only (on an AVX-512 machine, to compare the paths).
    #[arg(long)]
    avx2: bool,
    /// The element type the kernels multiply: f32, or bf16 (operands rounded to
    /// bfloat16 when packed, f32 accumulation; needs AVX-512 BF16), or an integer
    /// family (u8s8: A as 8-bit codes in memory, as a quantized model stores its
    /// activations). Results are f32 in memory; the peak is the type's own.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// One JSON object per shape instead of a table.
    #[arg(long)]
    json: bool,
    /// What picks the schedule: hierarchical (Vortex Eq. 2-4), dietcode, sia, or
    /// rule (the fixed rule of thumb, the baseline).
    #[arg(long, default_value = "hierarchical")]
    model: String,
    /// Only schedules with this register tile, e.g. `8x32`.
    #[arg(long)]
    tile: Option<String>,
    /// Only schedules with this block depth; a weight is then packed in blocks of
    /// this depth (to compare depths, e.g. a multiple of a convolution's kernel row).
    #[arg(long)]
    kc: Option<usize>,
    /// Only schedules whose kernels read the operands this way: packed (panels packed
    /// per cache block) or direct (in place); default: either.
    #[arg(long, value_parser = ["packed", "direct"])]
    operands: Option<String>,
    /// The row counts a weight is packed for (its tile width and depth are chosen
    /// over them, as at compile time when M is a symbol).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 128, 1024])]
    pack_for: Vec<usize>,
    /// B a weight-only quantized weight of this many bits a value (4 or 8):
    /// unsigned codes with a scale and a zero point per `--group` rows of K
    /// and per column, dequantized panel by panel for the f32 kernels.
    #[arg(long, value_parser = ["4", "8"])]
    weight_bits: Option<String>,
    /// Rows of K that share a scale with --weight-bits (0: one per column).
    #[arg(long, default_value_t = 32)]
    group: usize,
    /// Also measure every candidate schedule and report each model's regret
    /// against the best one measured.
    #[arg(long)]
    exhaustive: bool,
    /// Store C as 8-bit codes, as a statically quantized model's products do
    /// (u8s8: a scale per column, rounded, clamped to 0..=255; one K block).
    #[arg(long)]
    codes: bool,
    /// A weight as a model's layer meets it: in memory, not in cache. Copies of
    /// the packed weight that overflow L3 one and a half times are taken in turn,
    /// one a call (as the measured dispatch does at compile time).
    #[arg(long)]
    cold: bool,
    /// Write the LLVM IR and assembly of every kernel of the family here.
    #[arg(long, value_name = "DIR")]
    dump_llvm: Option<PathBuf>,
    /// The tuning cache folder (default: `$ANYSHAPE_CACHE_DIR`, `$XDG_CACHE_HOME/anyshape`
    /// or `~/.cache/anyshape`).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Compile only the kernels listed here (written by `anyshape tune --samples --out`).
    #[arg(long, value_name = "FILE")]
    kernels: Option<PathBuf>,
    /// Also distil a decision tree from the model over a sweep of M (1 to twice the
    /// largest --m, this N, K and batch), and measure its pick against the model's.
    #[arg(long)]
    tree: bool,
    /// How operands are packed: with the generated routines, or with the portable
    /// loops (to measure what the generated ones gain).
    #[arg(long, value_enum, default_value_t = Packing::Generated)]
    packing: Packing,
    /// Dispatch with the macro-kernels tuned by `anyshape tune --samples F --search
    /// bayes --out FILE` (for the classes they cover).
    #[arg(long, value_name = "FILE")]
    tuned: Option<PathBuf>,
    /// After measuring, keep running the chosen schedule for this many seconds:
    /// a steady stretch for an outside profiler (`bench/profile.py` runs `perf` on
    /// it, with `ANYSHAPE_PERF_MAP=1` naming the generated code).
    #[arg(long, value_name = "SECONDS")]
    hold: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Packing {
    Generated,
    Portable,
}

pub(crate) use tune::calibrate::time_per_call;

/// Entry `i` of a batch of `k × n` B operands (`bt`: stored transposed, `n × k`).
fn b_view(b: &[f32], i: usize, k: usize, n: usize, bt: bool) -> Result<MatRef<'_>> {
    let s = &b[i * k * n..(i + 1) * k * n];
    Ok(if bt { MatRef::row_major(s, n, k)?.t() } else { MatRef::row_major(s, k, n)? })
}

/// The views of a batch of `m × k · k × n` contractions over flat buffers: A's
/// entries row-major; B a weight packed once for the batch, or its entries
/// row-major (`bt`: stored transposed, `n × k`); C's entries row-major (empty ones
/// included). Built once per shape, as a compiled model builds its launch
/// arguments, so that timed calls are the contraction alone.
#[allow(clippy::type_complexity)]
pub(crate) fn operand_views<'a>(
    (a, b, c): (&'a [f32], &'a [f32], &'a mut [f32]),
    packed: Option<&'a PackedB>,
    (batch, m, n, k): (usize, usize, usize, usize),
    bt: bool,
) -> Result<(Vec<MatRef<'a>>, Vec<BOperand<'a>>, Vec<MatMut<'a>>)> {
    let av = (0..batch)
        .map(|i| MatRef::row_major(&a[i * m * k..(i + 1) * m * k], m, k))
        .collect::<Result<Vec<_>, _>>()?;
    let (bv, cv) = b_and_c_views((b, c), packed, (batch, m, n, k), bt)?;
    Ok((av, bv, cv))
}

/// [`operand_views`]' B and C.
#[allow(clippy::type_complexity)]
fn b_and_c_views<'a>(
    (b, c): (&'a [f32], &'a mut [f32]),
    packed: Option<&'a PackedB>,
    (batch, m, n, k): (usize, usize, usize, usize),
    bt: bool,
) -> Result<(Vec<BOperand<'a>>, Vec<MatMut<'a>>)> {
    let bv = match packed {
        Some(p) => vec![BOperand::Packed(p)],
        None => (0..batch).map(|i| b_view(b, i, k, n, bt).map(BOperand::Plain)).collect::<Result<_>>()?,
    };
    let (mut cv, mut rest) = (Vec::with_capacity(batch), c);
    for _ in 0..batch {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(m * n);
        cv.push(MatMut::new(head, m, n, n)?);
        rest = tail;
    }
    Ok((bv, cv))
}

fn parse_tile(t: &str) -> Result<(usize, usize)> {
    let bad = || UserError(format!("--tile `{t}`: expected MRxNR, e.g. 8x32"));
    let (a, b) = t.split_once('x').ok_or_else(bad)?;
    Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?))
}

/// Which model picks, `None` for the rule of thumb.
fn parse_model(s: &str) -> Result<Option<CostModel>> {
    if s == "rule" {
        return Ok(None);
    }
    Ok(Some(s.parse::<CostModel>().map_err(|e| UserError(format!("--model: {e}, or rule")))?))
}

/// The operands of one shape, allocated once.
struct Operands {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    packed: Option<PackedB>,
}

pub fn bench_matmul(args: BenchMatmulArgs) -> Result<()> {
    let host = kernels::Target::detect();
    let target = if args.avx2 {
        host.avx2_only().ok_or_else(|| UserError("this machine has no AVX2 + FMA".into()))?
    } else {
        host
    };
    if !target.supported() {
        bail!(UserError("the contraction engine needs x86-64 with AVX2 and FMA".into()));
    }
    if args.batch == 0 {
        bail!(UserError("--batch must be at least 1".into()));
    }
    if args.hold.is_some_and(|h| !(h.is_finite() && h >= 0.0)) {
        bail!(UserError("--hold takes a number of seconds, 0 or more".into()));
    }
    let elem: kernels::ElemType = args.dtype.parse().map_err(|e| UserError(format!("--dtype: {e}")))?;
    target.check_elem(elem).map_err(|e| UserError(format!("--dtype {elem}: {e}")))?;
    let model = parse_model(&args.model)?;
    let tile = args.tile.as_deref().map(parse_tile).transpose()?;
    let pool = ThreadPool::new(args.threads.unwrap_or(target.cores));
    let cache = args.cache_dir.clone().or_else(codegen::tuning::default_cache_dir);
    let keep = args.kernels.as_deref().map(|f| crate::samples::load_kernel_list(f, elem)).transpose()?;
    let start = Instant::now();
    // The tile record checked against this machine first, as a model's compile does:
    // a stale record would price every schedule wrongly.
    codegen::tuning::checked_record(cache.as_deref(), &target, elem)?;
    if args.codes && elem != kernels::ElemType::U8S8 {
        bail!(UserError("--codes stores a u8s8 product's C: add --dtype u8s8".into()));
    }
    let epilogue = if args.codes { codegen::tuning::codes_epilogue() } else { plan::Epilogue::default() };
    let contraction = codegen::Contraction::builder(&target, &pool)
        .epilogue(epilogue)
        .model(model.unwrap_or_default())
        .cache(cache.as_deref())
        .keep(keep.as_deref())
        .generated_packing(args.packing == Packing::Generated)
        .elem(elem)
        .build()?;
    let contraction = match args.tuned.as_deref() {
        Some(f) => contraction
            .with_tuned(crate::search::load_tuned(f)?)
            .map_err(|e| UserError(format!("--tuned {}: {e}", f.display())))?,
        None => contraction,
    };
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    if let Some(dir) = &args.dump_llvm {
        dump_llvm(dir, &contraction)?;
    }
    let d: &Dispatcher = &contraction;
    let peak = d.machine().peak_gflops;
    if !args.json {
        let tiles: Vec<String> =
            d.family().variants().iter().map(|v| format!("{}x{}", v.kernel.mr, v.kernel.nr)).collect();
        let direct: Vec<String> =
            d.family().direct_variants().iter().map(|v| format!("{}x{}", v.kernel.mr, v.kernel.nr)).collect();
        say!(
            "# {elem} kernels, {} f32 lanes, {} threads, measured {elem} peak {peak:.1} GFLOP/s; family of {} packed kernels ({}) and {} direct ({}) compiled in {compile_ms:.0} ms; schedules by {}",
            target.f32_lanes,
            pool.threads(),
            tiles.len(),
            tiles.join(" "),
            direct.len(),
            direct.join(" "),
            args.model
        );
        say!(
            "{:>5} {:>6} {:>6} {:>6} {:>9} {:>8} {:>10} {:>9} {:>9}  schedule",
            "batch",
            "m",
            "n",
            "k",
            "GFLOP/s",
            "of peak",
            "time",
            "pick(us)",
            "memo(ns)"
        );
    }
    let conv = args.conv.as_deref().map(parse_conv).transpose()?;
    if let Some(t) = &conv {
        let (m, k) = t.dims()?;
        for &n in &args.n {
            bench_shape(&args, d, &pool, model, tile, peak, m, n, k, Some(t))?;
        }
        return Ok(());
    }
    for &m in &args.m {
        for &n in &args.n {
            for &k in &args.k {
                bench_shape(&args, d, &pool, model, tile, peak, m, n, k, None)?;
            }
        }
    }
    Ok(())
}

/// `[Nx]HxWxC:KHxKW[:sS][:pP][:dD]`: a batch of `N` (default one) channels-last
/// images, dense.
fn parse_conv(spec: &str) -> Result<kernels::ConvTaps> {
    let bad = || {
        UserError(format!(
            "--conv `{spec}`: expected [Nx]HxWxC:KHxKW[:sS][:pP][:dD], e.g. 56x56x64:3x3:s1:p1 or 8x56x56x64:3x3:s1:p1"
        ))
    };
    let nums = |s: &str| -> Result<Vec<usize>> {
        s.split('x').map(|v| v.parse::<usize>().map_err(|_| bad().into())).collect()
    };
    let mut parts = spec.split(':');
    let image = nums(parts.next().ok_or_else(bad)?)?;
    let kernel = nums(parts.next().ok_or_else(bad)?)?;
    let (images, image) = match image[..] {
        [n, h, w, c] => (n, [h, w, c]),
        [h, w, c] => (1, [h, w, c]),
        _ => bail!(bad()),
    };
    let ([h, w, c], &[kh, kw]) = (image, &kernel[..]) else { bail!(bad()) };
    let (mut stride, mut pad, mut dilation) = (1, 0, 1);
    for p in parts {
        let (key, v) = p.split_at(p.len().min(1));
        let v: usize = v.parse().map_err(|_| bad())?;
        match key {
            "s" => stride = v,
            "p" => pad = v,
            "d" => dilation = v,
            _ => bail!(bad()),
        }
    }
    let out = |n: usize, kk: usize| -> Result<usize> {
        let span = (kk.max(1) - 1) * dilation + 1;
        let room = (n + 2 * pad).checked_sub(span).ok_or_else(bad)?;
        Ok(room / stride.max(1) + 1)
    };
    let t = kernels::ConvTaps {
        batch: images,
        height: h,
        width: w,
        channels: c,
        strides: [h * w * c, w * c, c],
        out: [out(h, kh)?, out(w, kw)?],
        kernel: [kh, kw],
        stride: [stride; 2],
        dilation: [dilation; 2],
        pad: [pad; 2],
    };
    t.check(images * h * w * c).map_err(|e| UserError(format!("--conv `{spec}`: {e}")))?;
    Ok(t)
}

#[allow(clippy::too_many_arguments)]
fn bench_shape(
    args: &BenchMatmulArgs,
    d: &Dispatcher,
    pool: &ThreadPool,
    model: Option<CostModel>,
    tile: Option<(usize, usize)>,
    peak: f64,
    m: usize,
    n: usize,
    k: usize,
    conv: Option<&kernels::ConvTaps>,
) -> Result<()> {
    let batch = args.batch;
    let fill = |len: usize, p: usize| -> Vec<f32> { (0..len).map(|i| (i % p) as f32 * 0.01).collect() };
    let a_len = conv.map_or(batch * m * k, |t| t.batch * t.height * t.width * t.channels);
    let mut ops = Operands {
        a: fill(a_len, 17),
        b: fill(batch * k * n, 13),
        c: vec![0.0; batch * m * n],
        packed: None,
    };
    // One matmul: B is a weight, packed once (outside the timed runs) for the row
    // counts it will meet. A batch: both operands are activations.
    if let Some(bits) = &args.weight_bits {
        if batch != 1 || args.bt || tile.is_some() || args.kc.is_some() {
            return Err(UserError(
                "--weight-bits takes one product, B not transposed, no --tile or --kc".into(),
            )
            .into());
        }
        let bits: u32 = bits.parse()?;
        let group = if args.group == 0 { k.max(1) } else { args.group };
        let groups = k.div_ceil(group);
        let codes: Vec<u8> = (0..k * n).map(|i| (i * 7 % (1 << bits)) as u8).collect();
        let zero_points: Vec<u8> = (0..groups * n).map(|i| (i % (1 << bits)) as u8).collect();
        let scales: Vec<f32> = (0..groups * n).map(|i| (i % 5 + 1) as f32 * 1e-3).collect();
        let w = kernels::QuantizedWeight {
            k,
            n,
            bits,
            codes: kernels::Codes::U8(&codes),
            group,
            scales: &scales,
            zero_points: Some(kernels::Codes::U8(&zero_points)),
        };
        ops.packed = Some(d.pack_quantized_weight(&w, &args.pack_for)?);
    } else if batch == 1 {
        let bv = b_view(&ops.b, 0, k, n, args.bt)?;
        let elem = d.family().elem();
        ops.packed = Some(match (tile, args.kc) {
            (Some((mr, nr)), kc) => PackedB::of_elem(
                bv,
                nr,
                kc.unwrap_or_else(|| kernels::schedule::kc_for(d.target(), elem, mr, nr)),
                elem,
            ),
            (None, Some(kc)) => match d.weight_layout(k, n, &args.pack_for)? {
                BLayout::Packed { nr, .. } => PackedB::of_elem(bv, nr, kc, elem),
                other => return Err(UserError(format!("no packed layout for the weight: {other:?}")).into()),
            },
            (None, None) => d.pack_weight(bv, &args.pack_for)?,
        });
    }
    let activation = if args.bt { BLayout::Strided } else { BLayout::NMajor };
    let layout = ops.packed.as_ref().map_or(activation, |p| BLayout::Packed { nr: p.nr, kc: p.kc });
    // A convolution's taps: read in place by direct kernels when a kernel row's taps
    // are adjacent pixels, else packed from the image.
    let a_layout = conv.map_or(ALayout::RowMajor, |t| t.layout());
    let problem = Problem { batch, m, n, k, a: a_layout, b: layout };
    let operands = args.operands.as_deref().map(|o| match o {
        "direct" => OperandAccess::Direct,
        _ => OperandAccess::Packed,
    });
    let restricted = tile.is_some() || args.kc.is_some() || operands.is_some();
    let allowed = |s: &Schedule| {
        tile.is_none_or(|(mr, nr)| s.mr == mr && s.nr == nr)
            && args.kc.is_none_or(|kc| s.blocking.kc == kc)
            && operands.is_none_or(|o| s.operands == o)
    };
    let pick = |model: Option<CostModel>| -> Result<Schedule> {
        let s = match model {
            None => d.rule_of_thumb(&problem)?,
            // The tuned table answers first for its classes, as at run time.
            Some(_) if !restricted && d.tuned().is_some() => d.schedule(&problem)?,
            Some(cm) if !restricted => d.choose_with(cm, &problem)?,
            Some(cm) => d.choose_where(cm, &problem, allowed)?,
        };
        Ok(s)
    };
    // Dispatch: the first call for a shape ranks the candidates; later calls find it
    // in the memo.
    let t0 = Instant::now();
    let chosen = pick(model)?;
    let pick_us = t0.elapsed().as_secs_f64() * 1e6;
    let memo_ns = if model.is_some() && !restricted {
        d.schedule(&problem)?;
        let reps = 100_000;
        let t0 = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(d.schedule(std::hint::black_box(&problem))?);
        }
        t0.elapsed().as_secs_f64() * 1e9 / reps as f64
    } else {
        f64::NAN
    };
    // Launch arguments once per shape; each timed call is the plan's contraction alone
    // (its plan, too, made before the timing).
    let Operands { a: a_data, b: b_data, c: c_data, packed } = &mut ops;
    // A u8s8 product's A is a quantized activation's 8-bit codes, as a model
    // stores it (words: the buffer starts on a 4-byte boundary).
    let codes_of_a: Vec<u32> = match d.family().elem() {
        kernels::ElemType::U8S8 if batch == 1 => {
            let bytes: Vec<u8> = a_data.iter().map(|&v| (v * 100.0) as i32 as u8).collect();
            let mut words = vec![0u32; bytes.len().div_ceil(4)];
            bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..bytes.len()].copy_from_slice(&bytes);
            words
        }
        _ => Vec::new(),
    };
    let codes =
        (!codes_of_a.is_empty()).then(|| &bytemuck::cast_slice::<u32, u8>(&codes_of_a)[..a_data.len()]);
    // A convolution's A is its taps over the image; otherwise A is row-major.
    let (av, bv, mut cv) = match (conv, codes) {
        (Some(t), codes) => {
            let (bv, cv) = b_and_c_views((b_data, c_data), packed.as_ref(), (batch, m, n, k), args.bt)?;
            let a = match codes {
                Some(codes) => MatRef::taps_of_codes(codes, *t)?,
                None => MatRef::taps(a_data, *t)?,
            };
            (vec![a], bv, cv)
        }
        (None, Some(codes)) => {
            let (bv, cv) = b_and_c_views((b_data, c_data), packed.as_ref(), (batch, m, n, k), args.bt)?;
            (vec![MatRef::of_codes(codes, m, k, k, 1)?], bv, cv)
        }
        (None, None) => operand_views((a_data, b_data, c_data), packed.as_ref(), (batch, m, n, k), args.bt)?,
    };
    // C as codes: a byte an element, scaled per column.
    let mut c_codes = vec![0u8; if args.codes { batch * m * n } else { 0 }];
    let scales = vec![1e-3f32; if args.codes { n } else { 0 }];
    if args.codes {
        cv = c_codes
            .chunks_mut((m * n).max(1))
            .map(|c| MatMut::of_codes(c, m, n, n))
            .collect::<Result<_, _>>()?;
    }
    let ep = EpilogueArgs { column_scale: args.codes.then_some(&scales[..]), ..EpilogueArgs::default() };
    // Cold: the weight's copies in turn, each found in memory by its call.
    let copies: Vec<PackedB> = match packed.as_ref() {
        Some(p) if args.cold => {
            let bytes = (p.words().len() * 4).max(1);
            let count = (d.machine().l3 * 3 / 2 / bytes + 1).clamp(2, 64);
            (1..count).map(|_| p.clone()).collect()
        }
        _ => Vec::new(),
    };
    // The weights the timed calls take in turn (1: the same one, warm in cache).
    let weight_copies = copies.len() + usize::from(packed.is_some());
    let cold: Vec<[BOperand; 1]> = copies.iter().map(|p| [BOperand::Packed(p)]).collect();
    let mut turn = 0usize;
    let mut run = |plan: &kernels::Plan| -> Result<()> {
        turn += 1;
        let b: &[BOperand] = match turn % (cold.len() + 1) {
            0 => &bv,
            i => &cold[i - 1],
        };
        execute(pool, plan, &av, b, &mut cv, &ep)?;
        Ok(())
    };
    let chosen_plan = d.plan(&chosen)?;
    let best = time_per_call(5, 0.04, || run(&chosen_plan))?;
    let gflops = problem.flops() / best / 1e9;
    if let Some(secs) = args.hold {
        let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() < secs {
            run(&chosen_plan)?;
        }
    }
    let mut regret = String::new();
    if args.exhaustive {
        regret = exhaustive(
            d,
            &problem,
            &mut |s| {
                let plan = d.plan(s)?;
                time_per_call(3, 0.01, || run(&plan))
            },
            args.json,
        )?;
    }
    if args.tree && model.is_some() {
        let top = args.m.iter().copied().max().unwrap_or(1) * 2;
        let samples = kernels::tree::sweep(1..=top, n..=n, k..=k, &[batch], problem.a, problem.b);
        let t0 = Instant::now();
        let tree = d.distill(&samples, kernels::TreeOptions::default())?;
        let distill_ms = t0.elapsed().as_secs_f64() * 1e3;
        let reps = 100_000;
        let t0 = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(tree.choose(std::hint::black_box(&problem)));
        }
        let choose_ns = t0.elapsed().as_secs_f64() * 1e9 / reps as f64;
        let pick = tree.choose(&problem);
        let tree_time = if pick == chosen {
            best
        } else {
            let plan = d.plan(&pick)?;
            time_per_call(5, 0.04, || run(&plan))?
        };
        let vs = tree_time / best - 1.0;
        regret += &if args.json {
            format!(
                ", \"tree\": {{\"schedule\": \"{pick}\", \"seconds\": {tree_time:.3e}, \"regret_vs_model\": {vs:.4}, \"leaves\": {}, \"samples\": {}, \"distill_ms\": {distill_ms:.1}, \"choose_ns\": {choose_ns:.1}}}",
                tree.leaves(),
                samples.len()
            )
        } else {
            format!(
                "  | tree ({} leaves from {} shapes in {distill_ms:.0} ms, {choose_ns:.0} ns): {pick}, {:+.1}% vs the model's pick",
                tree.leaves(),
                samples.len(),
                100.0 * vs
            )
        };
    }
    if args.json {
        say!(
            "{{\"dtype\": \"{}\", \"batch\": {batch}, \"m\": {m}, \"n\": {n}, \"k\": {k}, \"gflops\": {gflops:.2}, \"peak_fraction\": {:.4}, \"seconds\": {best:.3e}, \"threads\": {}, \"mr\": {}, \"nr\": {}, \"schedule\": \"{chosen}\", \"weight_copies\": {}, \"dispatch_first_us\": {pick_us:.2}, \"dispatch_memo_ns\": {}{regret}}}",
            d.family().elem(),
            gflops / peak.max(1e-9),
            pool.threads(),
            chosen.mr,
            chosen.nr,
            weight_copies,
            if memo_ns.is_nan() { "null".to_string() } else { format!("{memo_ns:.1}") },
        );
    } else {
        say!(
            "{batch:>5} {m:>6} {n:>6} {k:>6} {gflops:>9.1} {:>7.1}% {:>8.1}us {pick_us:>9.1} {memo_ns:>9.0}  {chosen}{regret}",
            100.0 * gflops / peak.max(1e-9),
            best * 1e6,
        );
    }
    Ok(())
}

/// Measure every candidate of `p`, and say how far each model's pick is from the
/// best measured (regret = its time / the best time − 1).
fn exhaustive(
    d: &Dispatcher,
    p: &Problem,
    time: &mut dyn FnMut(&Schedule) -> Result<f64>,
    json: bool,
) -> Result<String> {
    let cands = d.candidates(p);
    let mut measured = Vec::with_capacity(cands.len());
    for s in &cands {
        measured.push((*s, time(s)?));
        let predicted = d.model().cost(d.machine(), d.family(), p, s);
        tracing::debug!(
            "{:>9.1} us measured, {:>9.1} us by the model  {s}",
            measured.last().map_or(f64::NAN, |m| m.1 * 1e6),
            predicted * 1e6
        );
    }
    let (best_s, best_t) =
        measured.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((cands[0], f64::NAN));
    let time_of = |s: &Schedule, time: &mut dyn FnMut(&Schedule) -> Result<f64>| -> Result<f64> {
        match measured.iter().find(|(c, _)| c == s) {
            Some((_, t)) => Ok(*t),
            None => time(s),
        }
    };
    let mut picks = Vec::new();
    for (name, s) in CostModel::ALL
        .iter()
        .map(|cm| (cm.name(), d.choose_with(*cm, p)))
        .chain(std::iter::once(("rule", d.rule_of_thumb(p))))
    {
        let s = s?;
        picks.push((name, time_of(&s, time)? / best_t - 1.0));
    }
    Ok(if json {
        let r: Vec<String> = picks.iter().map(|(n, r)| format!("\"{n}\": {r:.4}")).collect();
        format!(", \"candidates\": {}, \"best\": \"{best_s}\", \"best_seconds\": {best_t:.3e}, \"regret\": {{{}}}", cands.len(), r.join(", "))
    } else {
        let r: Vec<String> = picks.iter().map(|(n, r)| format!("{n} {:.1}%", 100.0 * r)).collect();
        format!(
            "  | {} candidates, best {best_s} {:.1}us; regret: {}",
            cands.len(),
            best_t * 1e6,
            r.join(", ")
        )
    })
}

/// Write each kernel's IR and assembly as `DIR/<mr>x<nr>.ll` and `.s` (the direct
/// kernels as `DIR/direct-<mr>x<nr>.*`).
fn dump_llvm(dir: &std::path::Path, c: &codegen::Contraction) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| UserError(format!("--dump-llvm {}: {e}", dir.display())))?;
    let packed =
        c.kernels().iter().map(|k| (format!("{}x{}", k.kernel().mr, k.kernel().nr), k.ir(), k.asm()));
    let direct = c
        .direct_kernels()
        .iter()
        .map(|k| (format!("direct-{}x{}", k.kernel().mr, k.kernel().nr), k.ir(), k.asm()));
    // The family's packers, then (a bf16 family) its direct kernels' f32 ones.
    let packers = c.packers().iter().enumerate().map(|(i, p)| {
        (if i == 0 { "packers".to_string() } else { "packers-f32".to_string() }, p.ir(), p.asm())
    });
    for (name, ir, asm) in packed.chain(direct).chain(packers) {
        let base = dir.join(name);
        std::fs::write(base.with_extension("ll"), ir)?;
        std::fs::write(base.with_extension("s"), asm)?;
    }
    Ok(())
}
