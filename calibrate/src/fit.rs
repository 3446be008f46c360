//! Calibration without fooling ourselves: the global efficiency knobs are fitted by a small,
//! deterministic Nelder–Mead search minimising the time error of the training groups (each
//! group weighs the same), and the memory terms (fragmentation, context) by a grid over the
//! rows with a measured peak whose fixed overhead is the fitted one (BLOOM's Megatron-DeepSpeed
//! runs; the other memory rows, torchtitan's, are predicted out of sample). Out-of-sample errors
//! come from leaving one source group out of the time fit, and from fitting the memory terms on
//! the rows whose id ends in an even number and testing on the odd ones, and the reverse.
//!
//! Nothing here is per row or per model: a fit returns one [`Calibration`].

use autopp_hardware::Efficiency;
use serde::Serialize;

use super::{evaluate_all, summarize, Calibration, Metric, PreparedRow, RowResult};
use autopp_planner::memory::RankMemory;

/// One fitted knob: its name, bounds, whether only some rows depend on it, and how to read and
/// write it.
struct Knob {
    name: &'static str,
    lo: f64,
    hi: f64,
    /// Only rows with a fused attention kernel or on a Hopper-class GPU depend on it.
    specific: bool,
    get: fn(&Efficiency) -> f64,
    set: fn(&mut Efficiency, f64),
}

/// Where every fit starts: uncalibrated values from vendor figures and common experience
/// (the foundation's defaults), never from an earlier fit, so that leave-one-group-out folds
/// learn nothing from the group they leave out.
pub const PRIOR: Efficiency = Efficiency {
    gemm_max: 0.80,
    gemm_half_dim: 64.0,
    gemm_misaligned: 0.5,
    attention_fused: 0.55,
    attention_fa2_on_hopper: autopp_hardware::analytic::ATTENTION_FA2_ON_HOPPER,
    hopper_compute: 0.75,
    fp8_gemm: autopp_hardware::analytic::FP8_GEMM,
    fp8_rowwise_half_dim: autopp_hardware::analytic::FP8_ROWWISE_HALF_DIM,
    grouped_gemm_half_dim: autopp_hardware::analytic::GROUPED_GEMM_HALF_DIM,
    moe_layer_overhead_s: autopp_hardware::analytic::MOE_LAYER_OVERHEAD_S,
    grouped_gemm_half_rows: autopp_hardware::analytic::GROUPED_GEMM_HALF_ROWS,
    grouped_gemm_host_s: autopp_hardware::analytic::GROUPED_GEMM_HOST_S,
    hbm: 0.70,
    comm_intra: 0.75,
    comm_inter: 0.85,
    comm_overlap: 0.8,
    kernel_overhead_s: 4e-6,
    // a block's forward launches some 40 kernels; at about 12 µs each (a CUDA launch and
    // PyTorch's eager dispatch between them) its host time is about 0.5 ms
    host_block_s: 0.5e-3,
};

/// The time knobs the fit moves, with physically sensible bounds.
const KNOBS: [Knob; 11] = [
    Knob {
        name: "gemm_max",
        lo: 0.4,
        hi: 0.98,
        specific: false,
        get: |e| e.gemm_max,
        set: |e, v| e.gemm_max = v,
    },
    Knob {
        name: "gemm_half_dim",
        lo: 4.0,
        hi: 512.0,
        specific: false,
        get: |e| e.gemm_half_dim,
        set: |e, v| e.gemm_half_dim = v,
    },
    Knob {
        name: "gemm_misaligned",
        // CUDA-core fp16 reaches a quarter of the tensor-core peak, and odd shapes about
        // half of that
        lo: 0.1,
        hi: 1.0,
        specific: false,
        get: |e| e.gemm_misaligned,
        set: |e, v| e.gemm_misaligned = v,
    },
    Knob {
        name: "attention_fused",
        lo: 0.2,
        hi: 0.9,
        specific: true,
        get: |e| e.attention_fused,
        set: |e, v| e.attention_fused = v,
    },
    Knob {
        name: "hopper_compute",
        lo: 0.4,
        hi: 1.0,
        specific: true,
        get: |e| e.hopper_compute,
        set: |e, v| e.hopper_compute = v,
    },
    Knob {
        name: "hbm",
        lo: 0.3,
        hi: 0.95,
        specific: false,
        get: |e| e.hbm,
        set: |e, v| e.hbm = v,
    },
    Knob {
        name: "comm_intra",
        lo: 0.2,
        hi: 0.95,
        specific: false,
        get: |e| e.comm_intra,
        set: |e, v| e.comm_intra = v,
    },
    Knob {
        name: "comm_inter",
        // A ring collective across nodes reaches most of the NICs' line rate on the large
        // messages of gradient and parameter exchange (nccl-tests define `busbw` so that it
        // compares with the link's peak, `doc/PERFORMANCE.md`), and every fit whose rows hold
        // runs bound by it (Narayanan et al.'s ZeRO-3 runs across up to 280 nodes) puts it at
        // 0.77–0.82. Below half the line rate a fit is explaining something else with the
        // network: without those runs the floor of 0.2 let BLOOM's under-predicted small
        // micro-batches pull it to 0.38, and the ZeRO-3 runs out of sample to +37 to +89%
        // (Narayanan2021 left out: 20.7% with 0.2, 10.3% with 0.5; `docs/validation.md`).
        lo: 0.5,
        hi: 0.95,
        specific: false,
        get: |e| e.comm_inter,
        set: |e, v| e.comm_inter = v,
    },
    Knob {
        name: "comm_overlap",
        lo: 0.0,
        hi: 1.0,
        specific: false,
        get: |e| e.comm_overlap,
        set: |e, v| e.comm_overlap = v,
    },
    Knob {
        name: "kernel_overhead_s",
        lo: 1e-6,
        hi: 4e-5,
        specific: false,
        get: |e| e.kernel_overhead_s,
        set: |e, v| e.kernel_overhead_s = v,
    },
    Knob {
        name: "host_block_s",
        // only runs whose GPU waits on every launch depend on it (BigScience's, with
        // `CUDA_LAUNCH_BLOCKING=1`); 5 ms is more host time than a 180B block's forward takes
        // the GPU at one sequence per micro-batch
        lo: 0.0,
        hi: 5e-3,
        specific: false,
        get: |e| e.host_block_s,
        set: |e, v| e.host_block_s = v,
    },
];

/// One knob of a fitted efficiency, for reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KnobValue {
    /// The `Efficiency` field.
    pub name: &'static str,
    /// Its value.
    pub value: f64,
    /// Where the fit started ([`PRIOR`]).
    pub prior: f64,
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
    /// Fitted only on rows with a fused attention kernel or a Hopper-class GPU.
    pub specific: bool,
}

impl KnobValue {
    /// Whether the value sits on a bound (within 0.1 % of the range).
    pub fn on_bound(&self) -> bool {
        let tol = 1e-3 * (self.hi - self.lo);
        self.value <= self.lo + tol || self.value >= self.hi - tol
    }
}

/// Every fitted knob of `e` with its prior and bounds.
pub fn knob_values(e: &Efficiency) -> Vec<KnobValue> {
    KNOBS
        .iter()
        .map(|k| KnobValue {
            name: k.name,
            value: (k.get)(e),
            prior: (k.get)(&PRIOR),
            lo: k.lo,
            hi: k.hi,
            specific: k.specific,
        })
        .collect()
}

/// The names of the fitted time knobs, in fit order.
pub fn knob_names() -> Vec<&'static str> {
    KNOBS.iter().map(|k| k.name).collect()
}

/// Maps an unbounded coordinate into `[lo, hi]` (a logistic curve) and back.
fn to_knob(k: &Knob, u: f64) -> f64 {
    k.lo + (k.hi - k.lo) / (1.0 + (-u).exp())
}
fn from_knob(k: &Knob, v: f64) -> f64 {
    let f = ((v - k.lo) / (k.hi - k.lo)).clamp(1e-6, 1.0 - 1e-6);
    (f / (1.0 - f)).ln()
}

fn efficiency_at(base: &Efficiency, knobs: &[&Knob], u: &[f64]) -> Efficiency {
    let mut e = *base;
    for (k, &x) in knobs.iter().zip(u) {
        (k.set)(&mut e, to_knob(k, x));
    }
    e
}

/// The time error the fit minimises: the mean over groups of each group's mean absolute error
/// of its time comparisons (iteration and per-layer times), so that every group weighs the same.
pub fn time_objective(results: &[RowResult]) -> f64 {
    let s = summarize(results);
    let mut groups: Vec<&str> = s.groups.iter().map(|g| g.group.as_str()).collect();
    groups.dedup();
    let per_group: Vec<f64> = groups
        .iter()
        .filter_map(|g| {
            let errs: Vec<f64> = results
                .iter()
                .filter(|r| r.group == *g)
                .flat_map(|r| &r.comparisons)
                .filter(|c| c.metric != Metric::PeakMemory)
                .map(|c| c.error().abs())
                .collect();
            (!errs.is_empty()).then(|| errs.iter().sum::<f64>() / errs.len() as f64)
        })
        .collect();
    if per_group.is_empty() {
        0.0
    } else {
        per_group.iter().sum::<f64>() / per_group.len() as f64
    }
}

/// Settings of the Nelder–Mead search.
#[derive(Debug, Clone, Copy)]
pub struct FitOptions {
    /// Objective evaluations at most.
    pub max_evaluations: usize,
    /// Stop when the simplex's objective values differ by less than this.
    pub tolerance: f64,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            max_evaluations: 800,
            tolerance: 1e-6,
        }
    }
}

/// Nelder–Mead (Nelder & Mead 1965; standard coefficients 1, 2, ½, ½) from `start` with an
/// initial step of 0.5 on every coordinate. Deterministic.
fn nelder_mead(f: &mut dyn FnMut(&[f64]) -> f64, start: &[f64], opts: FitOptions) -> Vec<f64> {
    let n = start.len();
    let mut simplex: Vec<(Vec<f64>, f64)> = Vec::with_capacity(n + 1);
    let mut evals = 0;
    let mut eval = |x: &[f64], evals: &mut usize| {
        *evals += 1;
        f(x)
    };
    simplex.push((start.to_vec(), eval(start, &mut evals)));
    for i in 0..n {
        let mut x = start.to_vec();
        x[i] += 0.5;
        let v = eval(&x, &mut evals);
        simplex.push((x, v));
    }
    while evals < opts.max_evaluations {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (best, worst) = (simplex[0].1, simplex[n].1);
        if (worst - best).abs() < opts.tolerance {
            break;
        }
        let centroid: Vec<f64> = (0..n)
            .map(|j| simplex[..n].iter().map(|(x, _)| x[j]).sum::<f64>() / n as f64)
            .collect();
        let along = |t: f64| -> Vec<f64> {
            (0..n)
                .map(|j| centroid[j] + t * (simplex[n].0[j] - centroid[j]))
                .collect()
        };
        let xr = along(-1.0);
        let fr = eval(&xr, &mut evals);
        if fr < simplex[0].1 {
            let xe = along(-2.0);
            let fe = eval(&xe, &mut evals);
            simplex[n] = if fe < fr { (xe, fe) } else { (xr, fr) };
        } else if fr < simplex[n - 1].1 {
            simplex[n] = (xr, fr);
        } else {
            let xc = if fr < worst { along(-0.5) } else { along(0.5) };
            let fc = eval(&xc, &mut evals);
            if fc < fr.min(worst) {
                simplex[n] = (xc, fc);
            } else {
                let x0 = simplex[0].0.clone();
                for (x, v) in simplex.iter_mut().skip(1) {
                    for j in 0..n {
                        x[j] = x0[j] + 0.5 * (x[j] - x0[j]);
                    }
                    *v = eval(x, &mut evals);
                }
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    simplex.swap_remove(0).0
}

/// Nelder–Mead runs per fit, each restarted from the previous best.
const RESTARTS: usize = 3;

/// Fits `knobs` on `rows` from `start` (other knobs stay as in `start`).
fn fit_knobs(
    rows: &[PreparedRow],
    knobs: &[&Knob],
    start: &Efficiency,
    opts: FitOptions,
) -> Efficiency {
    if rows.is_empty() || knobs.is_empty() {
        return *start;
    }
    let u0: Vec<f64> = knobs.iter().map(|k| from_knob(k, (k.get)(start))).collect();
    let mut objective = |u: &[f64]| {
        let cal = Calibration {
            efficiency: efficiency_at(start, knobs, u),
            ..Calibration::default()
        };
        time_objective(&evaluate_all(rows, &cal))
    };
    // Restarting from the best point with a fresh simplex escapes most of the early stalls.
    let mut u = u0;
    for _ in 0..RESTARTS {
        u = nelder_mead(&mut objective, &u, opts);
    }
    efficiency_at(start, knobs, &u)
}

/// Fits the knobs named in `names` (unknown names are ignored) jointly on every row of `rows`,
/// from `start`; the other knobs keep `start`'s values. `autopp calibrate` uses it on a user's
/// runs, where one cluster makes the two-stage split of [`fit_time`] pointless.
pub fn fit_named(
    rows: &[PreparedRow],
    names: &[&str],
    start: &Efficiency,
    opts: FitOptions,
) -> Efficiency {
    let knobs: Vec<&Knob> = KNOBS.iter().filter(|k| names.contains(&k.name)).collect();
    fit_knobs(rows, &knobs, start, opts)
}

/// Fits the time knobs on `rows`, starting from `start`, in two stages: the shared knobs on the
/// rows that depend on no specific knob (no fused attention, no Hopper-class GPU), then the
/// specific knobs (fused attention, Hopper) on the rows that depend on them, with the shared
/// knobs fixed. A knob no training row depends on keeps its starting value.
pub fn fit_time(rows: &[&PreparedRow], start: &Efficiency, opts: FitOptions) -> Efficiency {
    let (specific_rows, shared_rows): (Vec<PreparedRow>, Vec<PreparedRow>) = rows
        .iter()
        .map(|r| (*r).clone())
        .partition(|r| r.uses_specific_knobs());
    let shared: Vec<&Knob> = KNOBS.iter().filter(|k| !k.specific).collect();
    let specific: Vec<&Knob> = KNOBS.iter().filter(|k| k.specific).collect();
    let e = fit_knobs(&shared_rows, &shared, start, opts);
    fit_knobs(&specific_rows, &specific, &e, opts)
}

/// The first and last rank's memory of a row with a published peak, evaluated once.
#[derive(Debug, Clone)]
pub struct MemoryRow {
    /// Row id.
    pub id: String,
    /// Published peak, GiB.
    pub published_gib: f64,
    /// The first and the last pipeline rank's memory.
    pub ranks: Vec<RankMemory>,
    /// The published figure is the caching allocator's alone ([`crate::mapping::IterationCase`]).
    pub allocator_only: bool,
}

impl MemoryRow {
    /// Whether the row's fixed overhead is the fitted one ([`autopp_planner::memory::CONTEXT_BYTES`],
    /// the Megatron-DeepSpeed stacks of BLOOM): the rows the memory terms are fitted on.
    pub fn fitted(&self) -> bool {
        self.ranks.iter().any(|m| m.context_fitted)
    }

    /// The number the row's id ends with (`bloom_prequel_034` → 34).
    pub fn id_number(&self) -> Option<u64> {
        let digits: String = self
            .id
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .collect::<Vec<char>>()
            .into_iter()
            .rev()
            .collect();
        digits.parse().ok()
    }

    /// Predicted peak in GiB under a fragmentation fraction and a context size.
    pub fn predicted_gib(&self, fragmentation: f64, context_bytes: u64) -> f64 {
        self.ranks
            .iter()
            .map(|m| {
                let total = m.total_bytes_with(fragmentation, context_bytes);
                if self.allocator_only {
                    total - m.context_bytes
                } else {
                    total
                }
            })
            .max()
            .unwrap_or(0) as f64
            / (1u64 << 30) as f64
    }
}

/// Mean absolute relative memory error of `rows` under the memory terms.
pub fn memory_mape(rows: &[&MemoryRow], fragmentation: f64, context_bytes: u64) -> f64 {
    if rows.is_empty() {
        return 0.0;
    }
    rows.iter()
        .map(|r| (r.predicted_gib(fragmentation, context_bytes) / r.published_gib - 1.0).abs())
        .sum::<f64>()
        / rows.len() as f64
}

/// Fits (fragmentation, context) on `rows` by a grid: fragmentation 0–60 % in steps of 0.5 %,
/// context 0–10 GiB in steps of 1/16 GiB. Ties keep the smaller values.
pub fn fit_memory(rows: &[&MemoryRow]) -> (f64, u64) {
    let mut best = (f64::INFINITY, 0.0, 0u64);
    for i in 0..=120 {
        let frag = i as f64 * 0.005;
        for j in 0..=160u64 {
            let context = j * (1u64 << 26);
            let e = memory_mape(rows, frag, context);
            if e < best.0 - 1e-12 {
                best = (e, frag, context);
            }
        }
    }
    (best.1, best.2)
}

/// The errors of one fit: on the rows it was fitted to and on the rows it was not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FoldError {
    /// What was left out (a group, or a half of the memory rows).
    pub held_out: String,
    /// Error on the fitted rows (the fit's objective).
    pub in_sample: f64,
    /// Error on the held-out rows.
    pub out_of_sample: f64,
    /// Rows held out.
    pub held_out_rows: usize,
}

/// The whole calibration report: the all-groups fit and its cross-checks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitReport {
    /// The fit over every group and every memory row: the shipped defaults.
    pub calibration: Calibration,
    /// Time objective of the all-groups fit.
    pub time_in_sample: f64,
    /// Leave-one-group-out: fit the time knobs without one group, test on it (its time MAPE).
    pub leave_one_group_out: Vec<FoldError>,
    /// Memory: fit on the rows whose id ends in an even (odd) number, test on the others
    /// (MAPE), among the rows the memory terms are fitted on ([`MemoryRow::fitted`]).
    pub memory_halves: Vec<FoldError>,
    /// Memory MAPE of the all-rows fit (the fitted rows).
    pub memory_in_sample: f64,
}

/// The memory rows split by the parity of the number their id ends with (a fixed split that no
/// fit can choose): those with `parity`, and the others. BLOOM's pre-launch rows
/// (`bloom_prequel_NNN`) fall 13 even, 16 odd.
pub fn memory_halves<'a>(
    rows: &[&'a MemoryRow],
    parity: u64,
) -> (Vec<&'a MemoryRow>, Vec<&'a MemoryRow>) {
    rows.iter()
        .copied()
        .partition(|r| r.id_number().unwrap_or(0) % 2 == parity)
}

/// Rows that were evaluated with at least one memory comparison, as [`MemoryRow`]s.
pub fn memory_rows(rows: &[PreparedRow]) -> Vec<MemoryRow> {
    rows.iter().filter_map(super::memory_row).collect()
}

/// Runs the all-groups fit, leave-one-group-out and the memory halves, every time fit starting
/// from `start` ([`PRIOR`] for the shipped defaults).
pub fn fit_all(rows: &[PreparedRow], start: &Efficiency, opts: FitOptions) -> FitReport {
    let mut groups: Vec<&str> = rows.iter().map(|r| r.group.as_str()).collect();
    groups.sort_unstable();
    groups.dedup();
    let all: Vec<&PreparedRow> = rows.iter().collect();
    let efficiency = fit_time(&all, start, opts);
    let cal_time = Calibration {
        efficiency,
        ..Calibration::default()
    };
    let time_in_sample = time_objective(&evaluate_all(rows, &cal_time));

    let mut logo = Vec::new();
    for g in &groups {
        let train: Vec<&PreparedRow> = rows.iter().filter(|r| r.group != *g).collect();
        let test: Vec<PreparedRow> = rows.iter().filter(|r| r.group == *g).cloned().collect();
        let test_results = evaluate_all(&test, &cal_time);
        if test_results.iter().all(|r| r.comparisons.is_empty()) {
            continue;
        }
        let e = fit_time(&train, start, opts);
        let cal = Calibration {
            efficiency: e,
            ..Calibration::default()
        };
        let train_owned: Vec<PreparedRow> = train.iter().map(|r| (*r).clone()).collect();
        logo.push(FoldError {
            held_out: g.to_string(),
            in_sample: time_objective(&evaluate_all(&train_owned, &cal)),
            out_of_sample: time_objective(&evaluate_all(&test, &cal)),
            held_out_rows: test_results
                .iter()
                .filter(|r| !r.comparisons.is_empty())
                .count(),
        });
    }

    let mem = memory_rows(rows);
    let refs: Vec<&MemoryRow> = mem.iter().filter(|r| r.fitted()).collect();
    let (fragmentation, context_bytes) = fit_memory(&refs);
    let mut halves = Vec::new();
    for (name, parity) in [("even ids", 0), ("odd ids", 1)] {
        let (train, test) = memory_halves(&refs, parity);
        if train.is_empty() || test.is_empty() {
            continue;
        }
        let (f, r) = fit_memory(&train);
        halves.push(FoldError {
            held_out: format!("fit on the {name}, test on the others"),
            in_sample: memory_mape(&train, f, r),
            out_of_sample: memory_mape(&test, f, r),
            held_out_rows: test.len(),
        });
    }
    FitReport {
        calibration: Calibration {
            efficiency,
            fragmentation,
            context_bytes,
        },
        time_in_sample,
        leave_one_group_out: logo,
        memory_halves: halves,
        memory_in_sample: memory_mape(&refs, fragmentation, context_bytes),
    }
}
