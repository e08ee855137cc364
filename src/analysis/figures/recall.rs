//! Figures of the in-context recall analyses: the IoU table and example, attention spectra.
//! Each carries its protocol in the caption.

use crate::analysis::iou::{ExampleIou, IouCell, IouTable, THRESHOLD_CURVE};
use crate::analysis::spectrum::RunSpectrum;
use crate::figures::{BarPlot, BarSeries, Figure, HeatmapPlot, LinePlot, Plot, Series};

/// Axis titles (x, y) of the figures drawn on screen too.
const IOU_BAR_AXES: [&str; 2] = ["run, attention layer and head", "IoU with the ground truth"];
const IOU_THRESHOLD_AXES: [&str; 2] = ["threshold τ (log)", "IoU with the ground truth"];
pub const SPECTRUM_AXES: [&str; 2] = [
    "singular value index",
    "normalised cumulative singular value",
];

/// A heatmap figure of a row-major `rows × cols` matrix.
pub fn heatmap(
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
            signed: false,
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

/// Each run's cells, labelled by the run alone when it has a single head (layer × head), else
/// "run L{model layer} H{head}".
fn labelled_cells(runs: &[(String, &IouTable)]) -> Vec<(String, IouCell)> {
    runs.iter()
        .flat_map(|(run, table)| {
            let single = table.cells().count() == 1;
            table.cells().map(move |c| {
                let label = if single {
                    run.clone()
                } else {
                    format!("{run} L{} H{}", c.layer, c.head)
                };
                (label, c)
            })
        })
        .collect()
}

/// Soft (the headline: no parameter) and hard IoU of several runs side by side, with ± std
/// over examples as whiskers: one group per run and attention head ([`labelled_cells`]).
pub fn iou_bars(runs: &[(String, &IouTable)]) -> Figure {
    let cells = labelled_cells(runs);
    let series = |name: &str, value: fn(&IouCell) -> (f64, f64)| {
        let (values, errors) = cells.iter().map(|(_, c)| value(c)).unzip();
        BarSeries {
            name: name.into(),
            values,
            errors: Some(errors),
        }
    };
    Figure {
        title: "IoU with the MQAR ground truth".into(),
        caption: protocols_caption(runs),
        plot: Plot::Bars(BarPlot {
            x_label: IOU_BAR_AXES[0].into(),
            y_label: IOU_BAR_AXES[1].into(),
            series: vec![
                series("soft IoU", |c| (c.soft, c.soft_std)),
                series("hard IoU", |c| (c.hard, c.hard_std)),
            ],
            groups: cells.into_iter().map(|(label, _)| label).collect(),
        }),
    }
}

/// Hard IoU against its threshold τ ([`THRESHOLD_CURVE`]), a curve per run and head, each with
/// its soft IoU as a dashed level in the same colour: whether a ranking by hard IoU holds at
/// every τ or rests on one (on the shipped IoU runs ReBased falls below Based at τ = 0.02 and
/// 0.05).
pub fn iou_thresholds(runs: &[(String, &IouTable)]) -> Figure {
    let curves = runs.iter().flat_map(|(_, table)| {
        table.cells().map(|c| {
            let curve = table.hard_curve(&c);
            THRESHOLD_CURVE
                .iter()
                .copied()
                .zip(curve)
                .collect::<Vec<_>>()
        })
    });
    let (first, last) = (
        THRESHOLD_CURVE[0],
        THRESHOLD_CURVE[THRESHOLD_CURVE.len() - 1],
    );
    let series = labelled_cells(runs)
        .into_iter()
        .zip(curves)
        .enumerate()
        .flat_map(|(place, ((label, cell), points))| {
            // A head's two series are one colour (by legend place they had taken two): the
            // colour of the head's place among every run's layers and heads.
            [
                Series {
                    name: format!("{label}: hard"),
                    points,
                    dashed: false,
                    colour: Some(place),
                },
                Series {
                    name: format!("{label}: soft {:.3}", cell.soft),
                    points: vec![(first, cell.soft), (last, cell.soft)],
                    dashed: true,
                    colour: Some(place),
                },
            ]
        })
        .collect();
    let caption = protocols_caption(runs).map(|p| {
        format!("{p}; hard IoU binarised at threshold τ, soft IoU (dashed) has no threshold")
    });
    Figure {
        title: "Hard IoU against its threshold".into(),
        caption,
        plot: Plot::Lines(LinePlot {
            x_label: IOU_THRESHOLD_AXES[0].into(),
            y_label: IOU_THRESHOLD_AXES[1].into(),
            x_log: true,
            y_log: false,
            series,
        }),
    }
}

/// The runs' common IoU protocol, or each run's when they differ (their numbers are then not
/// comparable, which the caption must say).
fn protocols_caption(runs: &[(String, &IouTable)]) -> Option<String> {
    let (_, first) = runs.first()?;
    if runs.iter().all(|(_, t)| t.protocol == first.protocol) {
        return Some(first.protocol.describe());
    }
    let each: Vec<String> = runs
        .iter()
        .map(|(run, t)| format!("{run}: {}", t.protocol.describe()))
        .collect();
    Some(format!("protocols differ: {}", each.join("; ")))
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
                    colour: None,
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
            x_label: SPECTRUM_AXES[0].into(),
            y_label: SPECTRUM_AXES[1].into(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::iou::{Binarise, IouProtocol};

    /// A table of `heads` heads in each of the model layers `layers`, cell (l, h) holding hard
    /// IoU `l + h / 10`, soft IoU half that, and stds of a tenth of those.
    fn table(layers: Vec<usize>, heads: usize) -> IouTable {
        let grid = |scale: f64| -> Vec<Vec<f64>> {
            (0..layers.len())
                .map(|l| {
                    (0..heads)
                        .map(|h| scale * (l as f64 + h as f64 / 10.0))
                        .collect()
                })
                .collect()
        };
        IouTable {
            protocol: IouProtocol::default(),
            examples: 10_000,
            mechanism: "softmax".into(),
            hard: grid(1.0),
            soft: grid(0.5),
            hard_std: grid(0.1),
            soft_std: grid(0.05),
            hard_by_threshold: THRESHOLD_CURVE.iter().map(|&tau| grid(1.0 - tau)).collect(),
            layers,
        }
    }

    fn bars(fig: &Figure) -> &BarPlot {
        let Plot::Bars(plot) = &fig.plot else {
            panic!("not a bar plot")
        };
        plot
    }

    #[test]
    fn single_head_runs_are_labelled_by_run_and_others_by_layer_and_head() {
        let (one, many) = (table(vec![1], 1), table(vec![1, 3], 2));
        let fig = iou_bars(&[("a".into(), &one), ("b".into(), &many)]);
        let plot = bars(&fig);
        assert_eq!(
            plot.groups,
            ["a", "b L1 H0", "b L1 H1", "b L3 H0", "b L3 H1"]
        );
        let [soft, hard] = &plot.series[..] else {
            panic!("{:?}", plot.series)
        };
        assert_eq!(
            (soft.name.as_str(), hard.name.as_str()),
            ("soft IoU", "hard IoU"),
            "soft first: it has no threshold to rest on"
        );
        assert_eq!(hard.values, [0.0, 0.0, 0.1, 1.0, 1.1]);
        assert_eq!(soft.values, [0.0, 0.0, 0.05, 0.5, 0.55]);
        let close =
            |got: &[f64], want: &[f64]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-12);
        assert!(close(
            hard.errors.as_deref().unwrap(),
            &[0.0, 0.0, 0.01, 0.1, 0.11]
        ));
        assert!(close(
            soft.errors.as_deref().unwrap(),
            &[0.0, 0.0, 0.005, 0.05, 0.055]
        ));
        assert_eq!(fig.axes(), IOU_BAR_AXES);
        assert_eq!(fig.caption, Some(IouProtocol::default().describe()));
        crate::figures::render_svg(&fig).unwrap();
    }

    /// A curve of hard IoU over τ per run and head, and its soft IoU as a dashed level.
    #[test]
    fn hard_iou_is_drawn_against_its_threshold_beside_soft_iou() {
        let many = table(vec![1, 3], 2);
        let fig = iou_thresholds(&[("b".into(), &many)]);
        let Plot::Lines(plot) = &fig.plot else {
            panic!("not lines")
        };
        assert_eq!(plot.series.len(), 2 * 4);
        let (hard, soft) = (&plot.series[6], &plot.series[7]);
        assert_eq!(hard.name, "b L3 H1: hard");
        let expected: Vec<(f64, f64)> = THRESHOLD_CURVE
            .iter()
            .map(|&t| (t, (1.0 - t) * 1.1))
            .collect();
        assert_eq!(hard.points, expected);
        assert_eq!(soft.name, "b L3 H1: soft 0.550");
        assert!(soft.dashed && soft.points.iter().all(|&(_, y)| y == 0.55));
        // Each head's hard curve and soft level share a colour, and no other head has it.
        let colours = crate::figures::series_colours(plot);
        for head in colours.chunks(2) {
            assert_eq!(head[0], head[1]);
        }
        let firsts: std::collections::HashSet<_> = colours.iter().step_by(2).collect();
        assert_eq!(firsts.len(), 4);
        assert!(plot.x_log);
        crate::figures::render_svg(&fig).unwrap();
    }

    #[test]
    fn differing_protocols_are_listed() {
        let a = table(vec![0], 1);
        let mut b = table(vec![0], 1);
        b.protocol.binarise = Binarise::TopK(2);
        let fig = iou_bars(&[("a".into(), &a), ("b".into(), &b)]);
        let caption = fig.caption.unwrap();
        assert!(caption.starts_with("protocols differ: a: "), "{caption}");
        assert!(
            caption.contains(&format!("; b: {}", b.protocol.describe())),
            "{caption}"
        );
        assert!(
            caption.contains("threshold:0.1") && caption.contains("topk:2"),
            "{caption}"
        );
        assert_eq!(iou_bars(&[]).caption, None);
    }

    #[test]
    fn spectrum_and_table_figures_name_their_axes() {
        let spectrum = RunSpectrum::fixture("softmax", None);
        assert_eq!(
            spectrum_curves(&[("a".into(), &spectrum)]).axes(),
            SPECTRUM_AXES
        );
        let heatmap = spectrum_heatmap("a", &spectrum);
        assert_eq!(heatmap.axes(), ["head", "attention layer (row order)"]);
        assert_eq!(iou_table(&table(vec![0], 2), true).axes(), heatmap.axes());
    }
}
