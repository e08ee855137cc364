//! One table type for the reports that are rows of numbers and words rather than figures
//! (`bench`, `eval`, the catalogues): the same rows print as aligned text, tidy CSV and JSON
//! objects, so the three formats cannot disagree.

use serde_json::{Map, Value};

/// Named columns and rows of cells; a cell is a JSON value (a number stays a number in JSON,
/// `null` is an empty CSV field and "-" in text).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
}

impl Table {
    /// An empty table with these column names.
    pub fn new(columns: &[&str]) -> Self {
        Self {
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row, one cell per column.
    pub fn push(&mut self, row: Vec<Value>) {
        debug_assert_eq!(row.len(), self.columns.len(), "a cell per column");
        self.rows.push(row);
    }

    /// A header line and one line per row, quoted where a field needs it (RFC 4180).
    pub fn csv(&self) -> String {
        let line = |cells: Vec<String>| cells.iter().map(|c| csv_field(c)).collect::<Vec<_>>();
        std::iter::once(line(self.columns.clone()))
            .chain(
                self.rows
                    .iter()
                    .map(|row| line(row.iter().map(plain).collect())),
            )
            .map(|fields| fields.join(",") + "\n")
            .collect()
    }

    /// Columns padded to their widest cell, a header first.
    pub fn text(&self) -> Vec<String> {
        let cells: Vec<Vec<String>> = std::iter::once(self.columns.clone())
            .chain(self.rows.iter().map(|row| row.iter().map(shown).collect()))
            .collect();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|c| {
                cells
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        cells
            .iter()
            .map(|row| {
                let padded: Vec<String> = row
                    .iter()
                    .zip(&widths)
                    .map(|(cell, &w)| format!("{cell:<w$}"))
                    .collect();
                padded.join("  ").trim_end().to_string()
            })
            .collect()
    }

    /// The rows as JSON objects keyed by column.
    pub fn json(&self) -> Value {
        let objects = self.rows.iter().map(|row| {
            let object: Map<String, Value> = self
                .columns
                .iter()
                .cloned()
                .zip(row.iter().cloned())
                .collect();
            Value::Object(object)
        });
        Value::Array(objects.collect())
    }
}

/// A cell as CSV wants it: strings unquoted, `null` empty, numbers and the rest as JSON.
fn plain(cell: &Value) -> String {
    match cell {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A cell as the text table shows it: numbers rounded to what a reader compares.
fn shown(cell: &Value) -> String {
    match cell {
        Value::Null => "-".into(),
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            match x.abs() {
                a if a != 0.0 && !(1e-3..1e6).contains(&a) => format!("{x:.3e}"),
                _ => format!("{x:.4}")
                    .trim_end_matches('0')
                    .trim_end_matches('.')
                    .to_string(),
            }
        }
        other => plain(other),
    }
}

/// `field` quoted if it holds a comma, a quote or a line break.
pub(super) fn csv_field(field: &str) -> String {
    match field.contains([',', '"', '\n', '\r']) {
        true => format!("\"{}\"", field.replace('"', "\"\"")),
        false => field.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn table() -> Table {
        let mut t = Table::new(&["name", "formula", "ms"]);
        t.push(vec![json!("softmax"), json!("a, b"), json!(1.25)]);
        t.push(vec![json!("linear"), json!("say \"hi\""), Value::Null]);
        t
    }

    #[test]
    fn csv_quotes_what_needs_it_and_leaves_missing_cells_empty() {
        assert_eq!(
            table().csv(),
            "name,formula,ms\nsoftmax,\"a, b\",1.25\nlinear,\"say \"\"hi\"\"\",\n"
        );
    }

    #[test]
    fn text_aligns_columns_and_marks_missing_cells() {
        let lines = table().text();
        assert_eq!(lines[0], "name     formula   ms");
        assert_eq!(lines[1], "softmax  a, b      1.25");
        assert_eq!(lines[2], "linear   say \"hi\"  -");
    }

    #[test]
    fn json_keys_each_row_by_column_and_keeps_numbers() {
        let rows = table().json();
        assert_eq!(rows[0]["ms"], json!(1.25));
        assert_eq!(rows[1]["ms"], Value::Null);
        assert_eq!(rows[1]["name"], json!("linear"));
    }
}
