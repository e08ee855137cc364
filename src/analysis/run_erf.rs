//! The ERF of a trained run, from the attention matrices saved in its folder: the mass by
//! distance of the chosen layer(s), head(s) and query rows, fed to the same draw() routine as
//! the TRF, so the two overlay on the same axes.

use serde::{Deserialize, Serialize};

use super::{Heads, ReceptiveField, Rows, erf, mass_by_distance};
use crate::attention::{AttentionWeights, CATALOGUE, Mixing};
use crate::train::RunDir;
use crate::{Error, Result};

/// Which attention the ERF is measured on. The paper leaves this open; attnlab averages the
/// distance profiles of every saved example over the chosen layers, heads and rows.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErfProtocol {
    /// One attention layer, or `None` for the mean over all attention layers.
    pub layer: Option<usize>,
    pub heads: Heads,
    pub rows: Rows,
}

/// A run's ERF and where it came from.
#[derive(Clone, Debug, Serialize)]
pub struct RunErf {
    pub protocol: ErfProtocol,
    /// Keys per row: the m of draw().
    pub length: usize,
    /// Training step of the saved attention.
    pub step: usize,
    pub examples: usize,
    pub layers: Vec<usize>,
    /// Whether the mass is that of |A| L1-row-normalised: the run's mechanism mixes with a
    /// signed matrix (retention), whose rows are not distributions.
    pub magnitudes: bool,
    /// Mean attention mass at distance 0, 1, …, length − 1.
    pub mass: Vec<f64>,
    pub erf: ReceptiveField,
}

/// The ERF of `run` under `protocol`, with `points` values of ε.
pub fn run_erf(run: &RunDir, protocol: ErfProtocol, points: usize) -> Result<RunErf> {
    let index = run.read_attention_index()?;
    if index.mechanism == "linformer" {
        return Err(Error::RunDir {
            message: "Linformer attends over projected positions, not over earlier keys, so its \
                      attention has no distance profile and no ERF"
                .into(),
            path: run.path().to_path_buf(),
        });
    }
    let entries: Vec<_> = index
        .layers
        .iter()
        .filter(|e| protocol.layer.is_none_or(|l| e.layer == l))
        .collect();
    if entries.is_empty() {
        let saved: Vec<String> = index.layers.iter().map(|e| e.layer.to_string()).collect();
        return Err(Error::RunDir {
            message: format!(
                "no saved attention for layer {}; saved layers: {}",
                protocol.layer.map_or("(any)".into(), |l| l.to_string()),
                saved.join(", ")
            ),
            path: run.path().to_path_buf(),
        });
    }
    let magnitudes = CATALOGUE
        .iter()
        .any(|f| f.name == index.mechanism && f.mixing == Mixing::Signed);
    let layers = entries
        .iter()
        .map(|entry| {
            let weights = run.read_attention_weights(entry)?;
            Ok(match magnitudes {
                true => weights.magnitudes(),
                false => weights,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mass = mean_mass_by_distance(&layers, protocol.heads, protocol.rows)?;
    Ok(RunErf {
        protocol,
        length: mass.len(),
        step: index.step,
        examples: index.examples.len(),
        layers: entries.iter().map(|e| e.layer).collect(),
        magnitudes,
        erf: erf(&mass, points),
        mass,
    })
}

/// The mass by distance of several layers' attention ((B, H, Tq, Tk) weights each), averaged
/// over the layers: what the ERF of "all layers" reads, in the CLI and in the window.
pub fn mean_mass_by_distance(
    layers: &[AttentionWeights],
    heads: Heads,
    rows: Rows,
) -> Result<Vec<f64>> {
    let count = layers.len() as f64;
    let mut mass: Vec<f64> = Vec::new();
    for layer in layers {
        let layer = mass_by_distance(&layer.weights, layer.shape, heads, rows)?;
        if mass.is_empty() {
            mass = vec![0.0; layer.len()];
        }
        mass.iter_mut()
            .zip(&layer)
            .for_each(|(m, l)| *m += l / count);
    }
    Ok(mass)
}
