//! The report of a length-extrapolation sweep: perplexity against length per curve, with
//! Definition 0.1's check beside Theorem 0.4's verdict, time and peak memory per length.

use serde::Serialize;

use super::Report;
use crate::extrapolation::Extrapolation;
use crate::extrapolation::figures::perplexity_vs_length;
use crate::figures::Figure;

/// `attnlab extrapolate` (and the Extrapolation view): the sweep as it was saved.
#[derive(Clone, Debug, Serialize)]
#[serde(transparent)]
pub struct ExtrapolationReport {
    pub sweep: Extrapolation,
    /// Draw log perplexity.
    #[serde(skip)]
    pub log_ppl: bool,
}

impl ExtrapolationReport {
    /// Perplexity against length, one line per curve (dashed: encoding changed at inference).
    pub fn figure(&self) -> Figure {
        perplexity_vs_length(&self.sweep, self.log_ppl)
    }
}

impl Report for ExtrapolationReport {
    fn text(&self) -> Vec<String> {
        table(&self.sweep).lines().map(str::to_string).collect()
    }

    fn figures(&self) -> Vec<(String, Figure)> {
        vec![(String::new(), self.figure())]
    }

    fn csv(&self) -> String {
        csv(&self.sweep)
    }
}

fn fmt(value: Option<f64>, digits: usize) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

/// One row per curve: perplexity per length, the largest δ beyond L and both verdicts; then
/// time and peak memory per length.
fn table(sweep: &Extrapolation) -> String {
    let mut s = format!(
        "protocol: {} ({}); trained at L = {}; delta = {}\n\n",
        sweep.protocol.name(),
        sweep.protocol_description,
        sweep.train_length,
        sweep.delta_threshold
    );
    let width = sweep
        .curves
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    s += &format!("{:width$}", "ppl");
    for n in &sweep.lengths {
        s += &format!(" {n:>9}");
    }
    s += "  max delta  Def. 0.1   Thm 0.4\n";
    for c in &sweep.curves {
        s += &format!("{:width$}", c.name);
        for p in &c.points {
            s += &format!(" {:>9}", fmt(p.ppl, 3));
        }
        let beyond = c
            .points
            .iter()
            .zip(&c.delta)
            .filter(|(p, _)| p.length > sweep.train_length)
            .filter_map(|(_, d)| *d)
            .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.max(d))));
        let verdict = match c.extrapolates {
            Some(true) => "yes",
            Some(false) => "no",
            None => "n/a",
        };
        s += &format!("  {:>9}  {verdict:>8}   {}\n", fmt(beyond, 3), c.theorem);
    }
    s += &format!("\n{:width$}", "s / peak MiB");
    for n in &sweep.lengths {
        s += &format!(" {n:>13}");
    }
    s += "\n";
    for c in &sweep.curves {
        s += &format!("{:width$}", c.name);
        for p in &c.points {
            let peak = p.peak_bytes.map(|b| b as f64 / (1 << 20) as f64);
            s += &format!(" {:>13}", format!("{:.1}/{}", p.secs, fmt(peak, 0)));
        }
        s += "\n";
    }
    s
}

/// Tidy CSV: one line per curve and length.
fn csv(sweep: &Extrapolation) -> String {
    let mut s = String::from(
        "protocol,train_length,name,encoding,inference,length,ppl,delta,tokens,secs,peak_bytes,attention_block_bytes,extrapolates,theorem\n",
    );
    for c in &sweep.curves {
        for (p, d) in c.points.iter().zip(&c.delta) {
            s += &format!(
                "{},{},{},{},\"{}\",{},{},{},{},{:.3},{},{},{},{}\n",
                sweep.protocol.name(),
                sweep.train_length,
                c.name,
                c.encoding,
                c.inference.as_deref().unwrap_or(""),
                p.length,
                p.ppl.map_or(String::new(), |v| v.to_string()),
                d.map_or(String::new(), |v| v.to_string()),
                p.tokens,
                p.secs,
                p.peak_bytes.map_or(String::new(), |v| v.to_string()),
                p.attention_block_bytes,
                c.extrapolates.map_or(String::new(), |v| v.to_string()),
                c.theorem
            );
        }
    }
    s
}
