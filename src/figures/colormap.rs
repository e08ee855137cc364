//! The colour maps, as pure functions shared by the renderers and the GUI.
//!
//! Viridis is perceptually uniform and readable in greyscale and by colour-blind readers, so a
//! heatmap's brightness says how large a value is. Signed matrices (the hidden attention of
//! retention) take [`diverging`] instead, centred on 0: blue below, white at 0, red above
//! (ColorBrewer's RdBu, which is colour-blind safe), so a sign reads at a glance.

/// Viridis sampled at nine evenly spaced points (matplotlib's values); between them the map is
/// interpolated linearly, which stays within a shade of the full 256-entry table.
const VIRIDIS: [[u8; 3]; 9] = [
    [0x44, 0x01, 0x54],
    [0x47, 0x2d, 0x7b],
    [0x3b, 0x52, 0x8b],
    [0x2c, 0x72, 0x8e],
    [0x21, 0x91, 0x8c],
    [0x28, 0xae, 0x80],
    [0x5e, 0xc9, 0x62],
    [0xad, 0xdc, 0x30],
    [0xfd, 0xe7, 0x25],
];

/// ColorBrewer's 9-class RdBu, reversed: blue (negative) to red (positive), white between.
const RED_BLUE: [[u8; 3]; 9] = [
    [0x21, 0x66, 0xac],
    [0x43, 0x93, 0xc3],
    [0x92, 0xc5, 0xde],
    [0xd1, 0xe5, 0xf0],
    [0xf7, 0xf7, 0xf7],
    [0xfd, 0xdb, 0xc7],
    [0xf4, 0xa5, 0x82],
    [0xd6, 0x60, 0x4d],
    [0xb2, 0x18, 0x2b],
];

/// The colour of "no value" (NaN): a light grey that reads as empty next to any viridis colour.
pub const MISSING: [u8; 3] = [0xdd, 0xdd, 0xdd];

/// The viridis colour at `t` in [0, 1] (clamped): dark purple at 0, yellow at 1; NaN gives
/// [`MISSING`].
pub fn viridis(t: f64) -> [u8; 3] {
    sample(&VIRIDIS, t)
}

/// The diverging colour at `t` in [0, 1] (clamped): blue at 0, white at ½ (a value of 0 on a
/// scale centred on it), red at 1; NaN gives [`MISSING`].
pub fn diverging(t: f64) -> [u8; 3] {
    sample(&RED_BLUE, t)
}

/// `table` at `t` in [0, 1], interpolated linearly between its points.
fn sample(table: &[[u8; 3]; 9], t: f64) -> [u8; 3] {
    if t.is_nan() {
        return MISSING;
    }
    let last = table.len() - 1;
    let position = t.clamp(0.0, 1.0) * last as f64;
    let index = (position.floor() as usize).min(last - 1);
    let frac = position - index as f64;
    let (a, b) = (table[index], table[index + 1]);
    std::array::from_fn(|i| lerp(a[i], b[i], frac))
}

/// The channel value a fraction `frac` of the way from `a` to `b`, rounded.
fn lerp(a: u8, b: u8, frac: f64) -> u8 {
    (f64::from(a) + (f64::from(b) - f64::from(a)) * frac).round() as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_viridis() {
        assert_eq!(viridis(0.0), [0x44, 0x01, 0x54]);
        assert_eq!(viridis(1.0), [0xfd, 0xe7, 0x25]);
    }

    #[test]
    fn out_of_range_is_clamped_and_nan_is_missing() {
        assert_eq!(viridis(-3.0), viridis(0.0));
        assert_eq!(viridis(7.0), viridis(1.0));
        assert_eq!(viridis(f64::INFINITY), viridis(1.0));
        assert_eq!(viridis(f64::NAN), MISSING);
    }

    #[test]
    fn the_diverging_map_is_blue_white_red() {
        assert_eq!(diverging(0.0), [0x21, 0x66, 0xac]);
        assert_eq!(diverging(0.5), [0xf7, 0xf7, 0xf7]);
        assert_eq!(diverging(1.0), [0xb2, 0x18, 0x2b]);
        assert_eq!(diverging(f64::NAN), MISSING);
    }

    #[test]
    fn interpolates_between_control_points() {
        assert_eq!(viridis(0.5), [0x21, 0x91, 0x8c]);
        let mid = viridis(1.0 / 16.0);
        assert_eq!(mid, [0x46, 0x17, 0x68]);
    }
}
