//! Figures of the in-context recall analyses: the IoU table and example, attention spectra.
//! Each carries its protocol in the caption.

use super::{Figure, HeatmapPlot, LinePlot, Plot, Series};
use crate::analysis::iou::{ExampleIou, IouTable};
use crate::analysis::spectrum::RunSpectrum;

/// A heatmap figure of a row-major `rows × cols` matrix.
fn heatmap(
    title: String,
    caption: String,
    (rows, cols): (usize, usize),
    values: Vec<f64>,
    [x_label, y_label, value_label]: [&str; 3],
) -> Figure {
    Figure {
        title,
        caption: Some(caption),
        plot: Plot::Heatmap(HeatmapPlot {
            rows,
            cols,
            values,
            x_label: x_label.into(),
            y_label: y_label.into(),
            value_label: value_label.into(),
            log_colour: false,
        }),
    }
}

/// A `[layer][head]` table as a layers × heads heatmap.
pub fn layer_head_heatmap(
    title: String,
    caption: String,
    table: &[Vec<f64>],
    layers: &[usize],
    value_label: &str,
) -> Figure {
    let heads = table.first().map_or(0, Vec::len);
    let layer_names: Vec<String> = layers.iter().map(usize::to_string).collect();
    heatmap(
        title,
        format!("{caption}; rows: model layers {}", layer_names.join(", ")),
        (table.len(), heads),
        table.iter().flatten().copied().collect(),
        ["head", "attention layer (row order)", value_label],
    )
}

/// The IoU table of a run: hard (`soft = false`) or soft IoU per layer and head.
pub fn iou_table(table: &IouTable, soft: bool) -> Figure {
    let (kind, values) = if soft {
        ("soft", &table.soft)
    } else {
        ("hard", &table.hard)
    };
    layer_head_heatmap(
        format!("{kind} IoU: {}", table.mechanism),
        table.protocol.describe(),
        values,
        &table.layers,
        &format!("{kind} IoU"),
    )
}

/// The example view as two figures: the model's cropped attention and the ground truth.
pub fn iou_example(example: &ExampleIou, mechanism: &str) -> [Figure; 2] {
    let size = (example.crop.query_positions.len(), example.crop.context);
    let caption = format!(
        "test row {}, layer {}, head {}: hard IoU {:.3}, soft IoU {:.3}; {}; queries at {:?}",
        example.row,
        example.layer,
        example.head,
        example.hard,
        example.soft,
        example.protocol.scoring(),
        example.crop.query_positions
    );
    let labels = ["context position", "query (row of the crop)"];
    [
        heatmap(
            format!("Attention of {mechanism}"),
            caption.clone(),
            size,
            example.attention.clone(),
            [labels[0], labels[1], "weight"],
        ),
        heatmap(
            "Ground truth".into(),
            caption,
            size,
            example.crop.truth.clone(),
            [labels[0], labels[1], "target"],
        ),
    ]
}

/// Mean normalised cumulative singular-value curves against the index (Linformer Figure 1, left):
/// one curve per run and attention layer, averaged over heads.
pub fn spectrum_curves(runs: &[(String, &RunSpectrum)]) -> Figure {
    let series = runs
        .iter()
        .flat_map(|(label, spectrum)| {
            spectrum
                .layers
                .iter()
                .enumerate()
                .map(move |(l, layer)| Series {
                    name: format!("{label}, layer {layer}"),
                    points: spectrum
                        .layer_curve(l)
                        .iter()
                        .enumerate()
                        .map(|(i, &c)| ((i + 1) as f64, c))
                        .collect(),
                    dashed: false,
                })
        })
        .collect();
    let caption = runs.first().map_or(String::new(), |(_, s)| {
        format!("{}; mean over heads", s.protocol.describe(s.at))
    });
    Figure {
        title: "Spectrum of attention".into(),
        caption: Some(caption),
        plot: Plot::Lines(LinePlot {
            x_label: "singular value index".into(),
            y_label: "normalised cumulative singular value".into(),
            x_log: false,
            y_log: false,
            series,
        }),
    }
}

/// The layers × heads heatmap of the cumulative value at the protocol's index (Linformer
/// Figure 1, right).
pub fn spectrum_heatmap(label: &str, spectrum: &RunSpectrum) -> Figure {
    layer_head_heatmap(
        format!(
            "Cumulative singular value at index {}: {label}",
            spectrum.at
        ),
        format!(
            "{}; {}×{} matrices",
            spectrum.protocol.describe(spectrum.at),
            spectrum.shape.0,
            spectrum.shape.1
        ),
        &spectrum.at_value,
        &spectrum.layers,
        &format!("c({})", spectrum.at),
    )
}
