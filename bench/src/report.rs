//! Reports: Markdown plus SVG plots in a folder the user names, and the
//! machine description that makes numbers comparable.
//!
//! Every comparison subcommand produces a value implementing [`Outcome`]:
//! text for the terminal, JSON for machines, and a Markdown section (which
//! may draw plots into the report folder). [`emit`] prints/writes them as
//! asked; `bench all` concatenates several sections into one report.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;

use crate::cli::{print_json, write_json, Format};
use crate::procs::version_line;

/// File name of the Markdown report inside the report folder.
pub const REPORT_FILE: &str = "report.md";
/// File name of the JSON results inside the report folder.
pub const RESULTS_FILE: &str = "results.json";

/// Output options of every comparison subcommand.
#[derive(Args, Clone, Debug)]
pub struct OutArgs {
    /// Write report.md, results.json and SVG plots into this folder.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Also write the JSON results to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

/// The result of a comparison subcommand.
pub trait Outcome: Serialize {
    /// Title of its report section.
    fn title(&self) -> String;
    /// Human-readable summary for the terminal.
    fn text(&self) -> String;
    /// Markdown section body; plots go into `dir` and are linked relatively.
    fn markdown(&self, dir: &Path) -> Result<String>;
}

/// Prints `outcome` and writes the files `out` asks for.
pub fn emit(outcome: &impl Outcome, out: &OutArgs) -> Result<()> {
    match out.output {
        Format::Text => print!("{}", outcome.text()),
        Format::Json => print_json(outcome)?,
    }
    if let Some(path) = &out.json_out {
        write_json(path, outcome)?;
    }
    if let Some(dir) = &out.report {
        let section = outcome.markdown(&ensure_dir(dir)?)?;
        write_report(dir, &[(outcome.title(), section)])?;
        write_json(&dir.join(RESULTS_FILE), outcome)?;
        eprintln!(
            "bench: report written to {}",
            dir.join(REPORT_FILE).display()
        );
    }
    Ok(())
}

/// Creates `dir` if needed and returns it.
pub fn ensure_dir(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.to_path_buf())
}

/// Writes `report.md` with the machine description, the command and `sections`.
pub fn write_report(dir: &Path, sections: &[(String, String)]) -> Result<()> {
    let mut md = String::from("# Benchmark report\n\n");
    md.push_str(&format!("Command: `{}`\n\n", command_line()));
    md.push_str("## Machine\n\n");
    md.push_str(&machine_description());
    for (title, body) in sections {
        md.push_str(&format!("\n## {title}\n\n{body}\n"));
    }
    let path = dir.join(REPORT_FILE);
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))
}

/// This process's command line.
pub fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// Markdown bullet list: CPU, cores, memory, OS, kernel and tool versions.
pub fn machine_description() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let os = os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .unwrap_or("unknown")
        .trim_matches('"')
        .to_string();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let etcd = crate::bins::etcd35_dir().join("etcd");
    let mut md = String::new();
    md.push_str(&format!("- CPU: {cpu}, {cores} logical cores\n"));
    md.push_str(&format!(
        "- Memory: {:.1} GiB\n",
        mem_kib as f64 / 1024.0 / 1024.0
    ));
    md.push_str(&format!("- OS: {os}, kernel {}\n", kernel.trim()));
    md.push_str(&format!(
        "- etcd: {}\n",
        version_line(&etcd, &["--version"])
    ));
    md.push_str(&format!(
        "- HAProxy: {}\n",
        version_line(Path::new(crate::bins::DEFAULT_HAPROXY), &["-v"])
    ));
    md.push_str(&format!(
        "- nginx: {}\n",
        version_line(Path::new(crate::bins::DEFAULT_NGINX), &["-v"])
    ));
    md
}

/// A Markdown table.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut md = format!("| {} |\n", headers.join(" | "));
    md.push_str(&format!("|{}\n", " --- |".repeat(headers.len())));
    for row in rows {
        md.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    md
}

/// A plain-text table with aligned columns.
pub fn text_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `a / b`, or NaN when `b` is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

/// A ratio formatted as `1.23x` ("n/a" when undefined).
pub fn fmt_ratio(r: f64) -> String {
    if r.is_finite() {
        format!("{r:.2}x")
    } else {
        "n/a".into()
    }
}

/// The median of `values` (0 for none).
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Markdown image link for `file` (relative to the report folder).
pub fn image(alt: &str, file: &str) -> String {
    format!("![{alt}]({file})\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_and_medians() {
        let t = table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n| --- | --- |\n| 1 | 2 |\n");
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(fmt_ratio(ratio(1.0, 0.0)), "n/a");
        assert!(machine_description().contains("CPU"));
    }
}
