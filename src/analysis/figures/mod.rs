//! The analyses' figures, as data ([`crate::figures::Figure`]): the window draws them, the CLI
//! and the export buttons render them with the same renderers, so what is shown is what is saved.

pub mod encodings;
pub mod recall;
