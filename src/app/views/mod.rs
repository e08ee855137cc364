//! The views of the central panel, one file each. Every view reads the run store and the
//! editor, never owns training state, and exports its figures through the shared exporter.

pub mod attention;
mod colour;
pub mod encodings;
pub mod sweep;
pub mod training;

use serde::{Deserialize, Serialize};

/// Which view the central panel shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tab {
    #[default]
    Training,
    Attention,
    Encodings,
    Sweep,
}

impl Tab {
    pub const ALL: [Tab; 4] = [Tab::Training, Tab::Attention, Tab::Encodings, Tab::Sweep];

    pub fn label(self) -> &'static str {
        match self {
            Tab::Training => "Training",
            Tab::Attention => "Attention maps",
            Tab::Encodings => "Encodings",
            Tab::Sweep => "Sweep",
        }
    }
}
