//! Replay a routing trace (`redlite bench model --dump-routes FILE`)
//! through the cache at several sizes with every policy and print the hit
//! rates, as a markdown table.
//!
//!     cargo run --release -p redlite-expertcache --example simulate -- TRACE SLOTS[,SLOTS...] [WARMUP_TOKENS]

use redlite_expertcache::policy::PolicyKind;
use redlite_expertcache::sim::{parse_trace, simulate};

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
