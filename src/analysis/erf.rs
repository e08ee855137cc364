//! The Empirical Receptive Field's input: how a trained model's attention mass falls with
//! distance, averaged over the chosen examples, heads and query rows.

use serde::{Deserialize, Serialize};

use super::receptive_field::{ReceptiveField, draw};
use crate::{Error, Result};

/// Which query rows enter the average. The paper leaves this open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rows {
    /// Every query row. Early rows reach only short distances and count as 0 beyond, so
    /// long distances get less mass than the last row alone would give them.
    #[default]
    All,
    /// Only the last query row, the one that sees the whole context.
    Last,
}

/// Which heads enter the average.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Heads {
    /// One head, 0-based.
    One(usize),
    /// The mean of every head's attention rows (the rule the TRF uses too).
    #[default]
    Mean,
}

/// Attention mass by distance: entry t is the mean, over the selected (example, head, query
/// row), of the row's weight on the key t positions back (t = 0 is the diagonal).
///
/// `weights` is row-major with `shape` (B, H, Tq, Tk); query row i sits at key position
/// i + (Tk − Tq) (a causal matrix whose queries are the last Tq positions, Tq ≤ Tk) and
/// attends keys j ≤ i + (Tk − Tq) at distance t = i + (Tk − Tq) − j. A row that cannot
/// reach distance t contributes 0 there, and weights above the diagonal are ignored, so the
/// result (length Tk) sums to 1 when the rows are normalised.
///
/// Errors when `weights` does not have `shape`'s length, Tq > Tk, no row is selected, or the
/// head is out of range.
pub fn mass_by_distance(
    weights: &[f32],
    shape: [usize; 4],
    heads: Heads,
    rows: Rows,
) -> Result<Vec<f64>> {
    let [batch, n_heads, tq, tk] = shape;
    check_shape(weights.len(), shape)?;
    let head_range = match heads {
        Heads::Mean => 0..n_heads,
        Heads::One(h) if h < n_heads => h..h + 1,
        Heads::One(h) => {
            return Err(Error::argument(
                "attention head",
                h,
                format!("does not exist: the weights have {n_heads} heads (0..{n_heads})"),
            ));
        }
    };
    let row_range = match rows {
        Rows::All => 0..tq,
        Rows::Last => tq - 1..tq,
    };
    let offset = tk - tq;
    let mut mass = vec![0.0; tk];
    for example in 0..batch {
        for head in head_range.clone() {
            for i in row_range.clone() {
                let start = ((example * n_heads + head) * tq + i) * tk;
                let diagonal = i + offset;
                let visible = &weights[start..=start + diagonal];
                for (m, &w) in mass.iter_mut().zip(visible.iter().rev()) {
                    *m += f64::from(w);
                }
            }
        }
    }
    let count = (batch * head_range.len() * row_range.len()) as f64;
    for m in &mut mass {
        *m /= count;
    }
    Ok(mass)
}

/// Checks that `len` values form `shape`, with at least one query row and Tq ≤ Tk.
fn check_shape(len: usize, shape: [usize; 4]) -> Result<()> {
    let [batch, heads, tq, tk] = shape;
    let expected = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if expected != Some(len) {
        return Err(Error::argument(
            "attention weights",
            format!("of {len} values"),
            format!("do not form the shape (B, H, Tq, Tk) = {shape:?}"),
        ));
    }
    if tq > tk {
        return Err(Error::argument(
            "attention weights",
            format!("of shape (B, H, Tq, Tk) = {shape:?}"),
            format!("have {tq} query rows but only {tk} keys; a causal row needs Tq <= Tk"),
        ));
    }
    if batch == 0 || heads == 0 || tq == 0 {
        return Err(Error::argument(
            "attention weights",
            format!("of shape (B, H, Tq, Tk) = {shape:?}"),
            "have no rows to average",
        ));
    }
    Ok(())
}

/// The Empirical Receptive Field: [`draw`] on the measured mass by distance, so ERF and TRF
/// share the routine and overlay on the same axes.
pub fn erf(mass: &[f64], points: usize) -> ReceptiveField {
    draw(mass, points)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (1, H, T, T): each row puts half its weight on the diagonal and half one step back
    /// (the first row all on the diagonal); head h is scaled by (h + 1) to tell heads apart.
    fn two_step(heads: usize, t: usize) -> Vec<f32> {
        let mut w = vec![0.0; heads * t * t];
        for h in 0..heads {
            let scale = (h + 1) as f32;
            for i in 0..t {
                let row = (h * t + i) * t;
                if i == 0 {
                    w[row] = scale;
                } else {
                    w[row + i] = 0.5 * scale;
                    w[row + i - 1] = 0.5 * scale;
                }
            }
        }
        w
    }

    #[test]
    fn mass_by_distance_of_a_two_step_row() {
        let w = two_step(1, 4);
        let mass = mass_by_distance(&w, [1, 1, 4, 4], Heads::Mean, Rows::All).unwrap();
        // Row 0: all at 0; rows 1–3: half at 0, half at 1. Mean over 4 rows.
        assert_eq!(mass, vec![2.5 / 4.0, 1.5 / 4.0, 0.0, 0.0]);
        assert!((mass.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // Thresholds 0, .25, .5, .75, 1 of the mass; sums before j: 0, .625, 1, 1.
        assert_eq!(erf(&mass, 5).index, vec![0.0, 0.25, 0.25, 0.5, 1.0]);
    }

    #[test]
    fn head_selection_and_last_row() {
        let w = two_step(2, 3);
        let one = mass_by_distance(&w, [1, 2, 3, 3], Heads::One(1), Rows::All).unwrap();
        assert_eq!(one, vec![2.0 * 2.0 / 3.0, 2.0 / 3.0, 0.0]);
        let mean = mass_by_distance(&w, [1, 2, 3, 3], Heads::Mean, Rows::Last).unwrap();
        assert_eq!(mean, vec![0.75, 0.75, 0.0]);
    }

    #[test]
    fn queries_that_are_the_last_positions() {
        // Tq = 1, Tk = 3: the one row sits at position 2 and sees distances 0..=2.
        let w = [0.2f32, 0.3, 0.5];
        let mass = mass_by_distance(&w, [1, 1, 1, 3], Heads::Mean, Rows::All).unwrap();
        assert_eq!(mass, vec![0.5, 0.30000001192092896, 0.20000000298023224]);
    }

    #[test]
    fn weights_above_the_diagonal_are_ignored() {
        let w = [1.0f32, 9.0, 0.5, 0.5];
        let mass = mass_by_distance(&w, [1, 1, 2, 2], Heads::Mean, Rows::All).unwrap();
        assert_eq!(mass, vec![0.75, 0.25]);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let w = two_step(2, 3);
        let err = |shape, heads| {
            mass_by_distance(&w, shape, heads, Rows::All)
                .unwrap_err()
                .to_string()
        };
        assert!(err([1, 2, 3, 4], Heads::Mean).contains("do not form"));
        assert!(err([1, 2, 3, 3], Heads::One(2)).contains("head 2 does not exist"));
        assert!(err([1, 2, 9, 1], Heads::Mean).contains("Tq <= Tk"));
        assert!(mass_by_distance(&[], [0, 2, 3, 3], Heads::Mean, Rows::Last).is_err());
        assert!(mass_by_distance(&[], [1, 1, 0, 0], Heads::Mean, Rows::Last).is_err());
    }

    #[test]
    fn rows_and_heads_serialise_lowercase() {
        assert_eq!(serde_json::to_string(&Rows::Last).unwrap(), "\"last\"");
        assert_eq!(serde_json::to_string(&Heads::Mean).unwrap(), "\"mean\"");
        assert_eq!(
            serde_json::to_string(&Heads::One(3)).unwrap(),
            "{\"one\":3}"
        );
    }
}
