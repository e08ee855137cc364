//! Figures as PNG: the SVG rasterised with resvg, so the two formats never disagree.
//!
//! The font is compiled in, so text renders identically on machines without any fonts installed.

use std::sync::{Arc, OnceLock};

use resvg::{tiny_skia, usvg};

use super::{Figure, HeatmapPlot, render_svg};
use crate::{Error, Result};

/// DejaVu Sans, the font every figure's text is set in.
static FONT_DATA: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// The family name inside [`FONT_DATA`].
const FONT_FAMILY: &str = "DejaVu Sans";

/// `fig` as PNG bytes, one pixel per SVG unit, on a white background.
pub fn render_png(fig: &Figure) -> Result<Vec<u8>> {
    let svg = render_svg(fig)?;
    let tree = usvg::Tree::from_str(&svg, &svg_options())
        .map_err(|e| Error::Figure(format!("cannot rasterise figure \"{}\": {e}", fig.title)))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).ok_or_else(|| {
        Error::Figure(format!(
            "cannot rasterise figure \"{}\": bad size {}×{}",
            fig.title,
            size.width(),
            size.height()
        ))
    })?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        tiny_skia::Transform::identity(),
        &mut pixmap.as_mut(),
    );
    pixmap.encode_png().map_err(|e| {
        Error::Figure(format!(
            "cannot encode figure \"{}\" as PNG: {e}",
            fig.title
        ))
    })
}

/// `plot`'s matrix alone as a PNG ([`super::heatmap::heatmap_pixels`]): (width, height,
/// PNG bytes).
pub fn heatmap_png(plot: &HeatmapPlot, max_side: usize) -> Result<(u32, u32, Vec<u8>)> {
    let (width, height, rgb) = super::heatmap::heatmap_pixels(plot, max_side)?;
    let size = u32::try_from(width)
        .ok()
        .zip(u32::try_from(height).ok())
        .and_then(|(w, h)| tiny_skia::IntSize::from_wh(w, h));
    let Some(size) = size else {
        return Err(Error::Figure(format!(
            "cannot encode a {width}×{height} image"
        )));
    };
    let rgba = rgb
        .chunks_exact(3)
        .flat_map(|p| [p[0], p[1], p[2], 255])
        .collect();
    let pixmap = tiny_skia::Pixmap::from_vec(rgba, size)
        .ok_or_else(|| Error::Figure(format!("cannot encode a {width}×{height} image")))?;
    let png = pixmap
        .encode_png()
        .map_err(|e| Error::Figure(format!("cannot encode a heatmap as PNG: {e}")))?;
    Ok((size.width(), size.height(), png))
}

/// SVG parsing options whose only font is the embedded one (also standing in for the generic
/// sans-serif family).
fn svg_options() -> usvg::Options<'static> {
    usvg::Options {
        fontdb: font_database(),
        font_family: FONT_FAMILY.into(),
        ..usvg::Options::default()
    }
}

/// The font database holding [`FONT_DATA`], built once per process (parsing the font is the
/// slow part of setting up).
fn font_database() -> Arc<usvg::fontdb::Database> {
    static DATABASE: OnceLock<Arc<usvg::fontdb::Database>> = OnceLock::new();
    DATABASE
        .get_or_init(|| {
            let mut db = usvg::fontdb::Database::new();
            db.load_font_data(FONT_DATA.to_vec());
            db.set_sans_serif_family(FONT_FAMILY);
            Arc::new(db)
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::Plot;
    use crate::figures::tests::{heatmap_figure, lines_figure};

    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

    #[test]
    fn lines_png_is_a_1000_by_650_image() {
        let bytes = render_png(&lines_figure()).unwrap();
        assert!(bytes.starts_with(SIGNATURE));
        let image = tiny_skia::Pixmap::decode_png(&bytes).unwrap();
        assert_eq!((image.width(), image.height()), (1000, 650));
    }

    #[test]
    fn heatmap_png_decodes() {
        let bytes = render_png(&heatmap_figure(8)).unwrap();
        let image = tiny_skia::Pixmap::decode_png(&bytes).unwrap();
        assert!(image.width() > 0 && image.height() > 0);
    }

    /// The matrix alone: 64 cells a side scaled 4× to fit 256 pixels; the diagonal's top cell
    /// (weight 1, the largest) is viridis' yellow, the empty cell beside it the missing grey.
    #[test]
    fn a_heatmap_alone_is_its_cells_scaled_to_fit() {
        let Plot::Heatmap(plot) = heatmap_figure(64).plot else {
            unreachable!()
        };
        let (width, height, bytes) = heatmap_png(&plot, 256).unwrap();
        assert_eq!((width, height), (256, 256));
        let image = tiny_skia::Pixmap::decode_png(&bytes).unwrap();
        assert_eq!((image.width(), image.height()), (256, 256));
        let pixel = |x: u32, y: u32| {
            let p = image.pixel(x, y).unwrap().demultiply();
            [p.red(), p.green(), p.blue()]
        };
        assert_eq!(pixel(3, 3), crate::figures::viridis(1.0));
        assert_eq!(pixel(4, 3), crate::figures::MISSING);
        let (width, _, _) = heatmap_png(&plot, 10).unwrap();
        assert_eq!(width, 64, "at least a pixel a cell");
    }

    #[test]
    fn embedded_font_is_found() {
        let db = font_database();
        assert!(
            db.faces()
                .any(|face| { face.families.iter().any(|(name, _)| name == FONT_FAMILY) })
        );
    }

    #[test]
    fn text_is_drawn() {
        // The top 40 pixel rows hold only the title: dark pixels there are its glyphs.
        let bytes = render_png(&lines_figure()).unwrap();
        let image = tiny_skia::Pixmap::decode_png(&bytes).unwrap();
        let title_band = &image.data()[..image.width() as usize * 4 * 40];
        let dark = title_band.chunks(4).filter(|p| p[0] < 128).count();
        assert!(dark > 100, "only {dark} dark pixels in the title band");
    }
}
