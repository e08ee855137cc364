//! Perplexity against evaluation length (the Rpe paper's Figures 3–4), one curve per run and
//! per inference-time variant (dashed), on a log-scale length axis; the protocol is in the title.

use super::Extrapolation;
use crate::figures::{Figure, LinePlot, Plot, Series};

/// The perplexity-vs-length figure of a sweep; `log_ppl` puts perplexity on a log axis too.
pub fn perplexity_vs_length(sweep: &Extrapolation, log_ppl: bool) -> Figure {
    let series = sweep
        .curves
        .iter()
        .map(|curve| Series {
            name: curve.name.clone(),
            points: curve
                .points
                .iter()
                .map(|p| (p.length as f64, p.ppl.unwrap_or(f64::NAN)))
                .collect(),
            dashed: curve.inference.is_some(),
        })
        .collect();
    Figure {
        title: format!(
            "Validation perplexity vs length ({} protocol)",
            sweep.protocol.name()
        ),
        caption: Some(format!(
            "trained at L = {}; {}; dashed: encoding changed at inference",
            sweep.train_length, sweep.protocol_description
        )),
        plot: Plot::Lines(LinePlot {
            x_label: "evaluation length n (tokens)".into(),
            y_label: "perplexity".into(),
            x_log: true,
            y_log: log_ppl,
            series,
        }),
    }
}
