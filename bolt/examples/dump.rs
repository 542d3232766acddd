//! Prints every bucket and key/value of a bbolt file (or etcd snapshot):
//! `cargo run --release -p bolt --example dump -- FILE`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: dump FILE");
        return ExitCode::FAILURE;
    };
    match run(&path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{path}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let file = std::fs::read(path)?;
    let db = bolt::Db::open(&file)?;
    println!("meta page {}: {:?}", db.meta_page(), db.meta());
    println!("check: {:?}", db.check()?);
    for entry in db.buckets() {
        let (name, bucket) = entry?;
        println!("bucket {} (inline: {})", show(name), bucket.is_inline());
        for kv in bucket.iter() {
            let (k, v) = kv?;
            match v.data() {
                Some(d) => println!("  {} = {}", show(k), show(d)),
                None => println!("  {} = <bucket>", show(k)),
            }
        }
    }
    Ok(())
}

/// Printable ASCII as is, other bytes as \xNN.
fn show(b: &[u8]) -> String {
    b.iter()
        .map(|&c| {
            if (0x20..0x7f).contains(&c) && c != b'\\' {
                (c as char).to_string()
            } else {
                format!("\\x{c:02x}")
            }
        })
        .collect()
}
