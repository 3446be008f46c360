//! `autopp whatif`'s sweep: scaling with a fixed batch, exact costs, valid pictures.

use autopp_hardware::{hardware, Cluster, Precision};
use autopp_models::load;
use autopp_planner::runtime::Stack;
use autopp_planner::whatif::{self, plot, BatchPolicy, Point, Prices, Row, Sweep};

fn points(kinds: &[&str], counts: &[u64]) -> Vec<Point> {
    let mut v = Vec::new();
    for kind in kinds {
        let gpu = hardware::gpu(kind).expect("kind");
        for &n in counts {
            let cluster = Cluster::new(gpu.clone(), n, 8, None).expect("cluster");
            v.push(Point {
                template: cluster,
                gpus: n,
            });
        }
    }
    v
}

fn run(
    model: &str,
    kinds: &[&str],
    counts: &[u64],
    batch: BatchPolicy,
    prices: Prices,
) -> Vec<Row> {
    let sweep = Sweep {
        framework: Stack::Any,
        precision: Precision::Bf16,
        batch,
        train_tokens: Some(1e12),
        prices,
        calibration: None,
    };
    let model = load(model).expect("preset");
    whatif::sweep(&model, &points(kinds, counts), &sweep, &|_, _| {}).expect("sweep")
}

#[test]
fn with_a_fixed_batch_doubling_the_gpus_never_slows_training_unless_the_row_says_what_binds() {
    // a generous batch (scales well) and a small one (runs out of parallelism), on two kinds
    for sequences in [1024, 32] {
        let rows = run(
            "llama3-8b",
            &["a100-80g", "h100-sxm"],
            &[8, 16, 32, 64, 128, 256],
            BatchPolicy::Fixed { sequences },
            Prices::none(),
        );
        for pair in rows.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if a.series != b.series || b.gpus != 2 * a.gpus {
                continue;
            }
            let (Some(pa), Some(pb)) = (a.plan(), b.plan()) else {
                continue;
            };
            let (ta, tb) = (
                pa.train_time_s.expect("budget"),
                pb.train_time_s.expect("budget"),
            );
            assert!(
                tb <= ta || pb.binds.is_some(),
                "batch {sequences}: {} GPUs of {} train in {tb} s, {} GPUs in {ta} s, and the row names nothing that binds",
                b.gpus,
                b.gpu,
                a.gpus
            );
        }
        // the small batch cannot use 256 GPUs well: that row names what binds
        if sequences == 32 {
            let last = rows.iter().rfind(|r| r.gpus == 256).expect("256-GPU row");
            let p = last.plan().expect("a plan at 256 GPUs");
            assert!(p.binds.is_some() && p.scaling_efficiency < 0.8, "{p:?}");
        }
    }
}

#[test]
fn cost_is_gpu_hours_times_the_price_exactly() {
    let prices = Prices::from_pairs("h100-sxm=2.75,a100-80g=1.3").expect("prices");
    let rows = run(
        "llama3-8b",
        &["a100-80g", "h100-sxm"],
        &[8, 64],
        BatchPolicy::TokensPerGpu { tokens: 65_536 },
        prices.clone(),
    );
    for r in &rows {
        let p = r.plan().expect("plan");
        let hours = p.gpu_hours.expect("hours");
        let price = prices.usd_per_gpu_hour(&r.gpu).expect("priced");
        assert_eq!(p.cost_usd, Some(hours * price), "{r:?}");
        assert_eq!(
            hours,
            p.train_time_s.expect("time") * r.gpus as f64 / 3600.0
        );
        // the batch grows with the cluster: 65,536 tokens per GPU of 8,192-token sequences
        assert_eq!(r.global_batch, 8 * r.gpus);
    }
}

#[test]
fn the_pictures_are_valid_svg_and_png_of_the_stated_size() {
    let rows = run(
        "llama3-8b",
        &["h100-sxm", "h200"],
        &[8, 16, 32],
        BatchPolicy::Fixed { sequences: 256 },
        Prices::from_pairs("h100-sxm=3,h200=3.5").expect("prices"),
    );
    let pictures = plot::pictures(&rows, "llama3-8b").expect("pictures");
    let stems: Vec<_> = pictures.iter().map(|p| p.stem).collect();
    assert_eq!(
        stems,
        [
            "throughput",
            "mfu",
            "time-to-train",
            "cost-vs-time",
            "breakdown"
        ]
    );
    for p in &pictures {
        assert!(
            p.svg.starts_with("<svg") && p.svg.trim_end().ends_with("</svg>"),
            "{}",
            p.stem
        );
        let decoder = png::Decoder::new(std::io::Cursor::new(&p.png));
        let mut reader = decoder.read_info().expect("a PNG header");
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).expect("a PNG frame");
        assert_eq!((info.width, info.height), plot::SIZE_PX, "{}", p.stem);
        // something was drawn: not every pixel is white
        assert!(buf.iter().any(|&b| b != 255), "{} is blank", p.stem);
    }
}

#[test]
fn a_point_where_nothing_fits_says_why() {
    let rows = run(
        "llama3-405b",
        &["v100-32g"],
        &[8],
        BatchPolicy::Fixed { sequences: 64 },
        Prices::none(),
    );
    match &rows[0].outcome {
        whatif::Outcome::NoPlan(why) => assert!(!why.is_empty()),
        o => panic!("405B on 8 V100s should not fit: {o:?}"),
    }
    assert!(whatif::to_table(&rows).contains("no plan: "));
}
