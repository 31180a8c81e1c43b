//! Replay a routing trace (`redlite bench model --dump-routes FILE`)
//! through the cache at several sizes with every policy and print the hit
//! rates, as a markdown table.
//!
//!     cargo run --release -p redlite-expertcache --example simulate -- TRACE SLOTS[,SLOTS...] [WARMUP_TOKENS] [per-layer]
//!
//! `per-layer`: SLOTS are per MoE layer, one pool per layer (the device
//! cache's arrangement), compared with one shared cache of as many slots
//! in all.

use redlite_expertcache::policy::PolicyKind;
use redlite_expertcache::sim::{parse_trace, simulate, simulate_per_layer};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: simulate TRACE SLOTS[,SLOTS...] [WARMUP_TOKENS]");
        std::process::exit(2);
    }
    let text = std::fs::read_to_string(&args[1]).expect("reading the trace");
    let trace = parse_trace(&text).expect("parsing the trace");
    let slots: Vec<usize> = args[2]
        .split(',')
        .map(|s| s.parse().expect("slot count"))
        .collect();
    let warmup: usize = args
        .get(3)
        .map_or(0, |s| s.parse().expect("warm-up tokens"));
    if args.get(4).is_some_and(|a| a == "per-layer") {
        per_layer(&trace, &slots, warmup);
        return;
    }
    let lookups: usize = trace.iter().skip(warmup).flatten().map(Vec::len).sum();
    println!(
        "{} tokens ({} counted after {} warm-up), {} lookups",
        trace.len(),
        trace.len().saturating_sub(warmup),
        warmup,
        lookups
    );
    print!("| slots |");
    for p in PolicyKind::ALL {
        print!(" {} hit rate |", p.name());
    }
    println!();
    print!("|---:|");
    for _ in PolicyKind::ALL {
        print!("---:|");
    }
    println!();
    for &n in &slots {
        print!("| {n} |");
        for p in PolicyKind::ALL {
            let s = simulate(&trace, n, p, warmup);
            print!(" {:.1}% |", 100.0 * s.hit_rate());
        }
        println!();
    }
}

/// Pools of `n` slots per layer under each policy, against one shared
/// cache of `n` times the layers.
fn per_layer(trace: &redlite_expertcache::sim::RouteTrace, slots: &[usize], warmup: usize) {
    let layers = trace
        .iter()
        .map(|t| t.iter().filter(|l| !l.is_empty()).count())
        .max()
        .unwrap_or(0);
    print!("| slots per layer |");
    for p in PolicyKind::ALL {
        print!(" {} per-layer pools |", p.name());
    }
    for p in PolicyKind::ALL {
        print!(" {} one shared cache |", p.name());
    }
    println!();
    println!("|---:|{}", "---:|".repeat(2 * PolicyKind::ALL.len()));
    for &n in slots {
        print!("| {n} |");
        for p in PolicyKind::ALL {
            let (h, m) = simulate_per_layer(trace, n, p, warmup);
            print!(" {:.1}% |", 100.0 * h as f64 / (h + m).max(1) as f64);
        }
        for p in PolicyKind::ALL {
            let s = simulate(trace, n * layers, p, warmup);
            print!(" {:.1}% |", 100.0 * s.hit_rate());
        }
        println!();
    }
}
