//! What the run prints: each finding when it is first seen (with its
//! input in hex and decoded), and the table of figures at the end.

use crate::oracle::{Evidence, Finding};
use crate::run::Stats;
use std::collections::BTreeMap;

/// Hex shown per message, at most.
const HEX_BYTES: usize = 2048;
/// Characters of a decoded message shown, at most.
const DEBUG_CHARS: usize = 6000;

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let kept: String = text.chars().take(max).collect();
    format!("{kept}… ({} characters in all)", text.chars().count())
}

fn hex(bytes: &[u8]) -> String {
    let shown: String = bytes
        .iter()
        .take(HEX_BYTES)
        .map(|b| format!("{b:02x}"))
        .collect();
    if bytes.len() > HEX_BYTES {
        format!("{shown}… ({} bytes in all)", bytes.len())
    } else {
        shown
    }
}

/// Prints a finding the first time it is seen.
pub fn finding(finding: &Finding, seed: u64, saved: Option<&str>) {
    println!();
    println!("FINDING [{}] {}: {}", finding.kind, finding.rpc, clip(&finding.detail, 4000));
    println!("  seed {seed} (replay: agentry-fuzz --seed {seed} --only {})", finding.rpc);
    match &finding.evidence {
        Evidence::Rpc {
            input_type,
            messages,
            credential,
        } => {
            println!("  credential: {}", credential.name());
            for (i, message) in messages.iter().enumerate() {
                println!("  message {i} ({} bytes, hex): {}", message.len(), hex(message));
                match crate::decode::debug(input_type, message) {
                    Some(Ok(text)) => println!("  message {i} decoded: {}", clip(&text, DEBUG_CHARS)),
                    Some(Err(e)) => println!("  message {i} does not decode as {input_type}: {e}"),
                    None => {}
                }
            }
        }
        Evidence::Config(case) => {
            for (name, file) in [("default.toml", &case.default_toml), ("local.toml", &case.local_toml)] {
                match file {
                    Some(bytes) => println!(
                        "  {name}:\n{}",
                        clip(&String::from_utf8_lossy(bytes), DEBUG_CHARS)
                    ),
                    None => println!("  {name}: (absent)"),
                }
            }
            println!("  environment: {:?}", case.env);
        }
        Evidence::None => {}
    }
    if let Some(path) = saved {
        println!("  saved: {path}");
    }
}

/// Prints the table of figures, per RPC and per service.
pub fn table(stats: &BTreeMap<String, Stats>) {
    println!();
    println!(
        "{:<42} {:>9} {:>10} {:>8}  codes",
        "RPC", "inputs", "calls/s", "findings"
    );
    let mut services: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for (label, s) in stats {
        let rate = rate(s.inputs, s.busy.as_secs_f64());
        let mut notes = Vec::new();
        if s.mutated > 0 {
            notes.push(format!("{} mutated", s.mutated));
        }
        if s.held > 0 {
            notes.push(format!("{} held back as unsafe", s.held));
        }
        if s.limited > 0 {
            notes.push(format!("{} waited for the process limit", s.limited));
        }
        let codes: Vec<&str> = s.codes.iter().map(String::as_str).collect();
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!("  [{}]", notes.join(", "))
        };
        println!(
            "{label:<42} {:>9} {rate:>10.0} {:>8}  {}{notes}",
            s.inputs,
            s.findings,
            codes.join(" ")
        );
        let service = label.split('/').next().unwrap_or(label).to_string();
        let entry = services.entry(service).or_default();
        entry.0 += s.inputs;
        entry.1 += s.busy.as_secs_f64();
    }
    println!();
    println!("{:<42} {:>9} {:>10}", "service", "inputs", "calls/s");
    for (service, (inputs, busy)) in services {
        println!("{service:<42} {inputs:>9} {:>10.0}", rate(inputs, busy));
    }
}

fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}
