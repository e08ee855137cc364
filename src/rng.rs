//! Seeded random numbers for everything that must be reproducible.
//!
//! candle's CPU generator cannot be seeded (`Device::Cpu.set_seed` fails), so attnlab draws
//! every random number itself and uploads the result. Each consumer derives its own stream
//! from `(seed, label)`, so adding a parameter or a data split never shifts the numbers of
//! another one.

use rand::SeedableRng;
pub use rand::{
    Rng,
    seq::{IndexedRandom, SliceRandom},
};
use rand_chacha::ChaCha8Rng;

/// The generator used throughout attnlab: ChaCha8 is portable and stable across platforms.
pub type AttnRng = ChaCha8Rng;

/// A generator for the stream named `label` under `seed`.
pub fn stream(seed: u64, label: &str) -> AttnRng {
    AttnRng::seed_from_u64(seed ^ fnv1a(label))
}

/// 64-bit FNV-1a: a fixed, dependency-free hash (std's `DefaultHasher` may change between releases).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `n` samples of N(0, std²).
pub fn normal_vec(rng: &mut AttnRng, n: usize, std: f64) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.sample::<f64, _>(rand_distr::StandardNormal) * std) as f32)
        .collect()
}

/// `n` samples of U(−bound, bound).
pub fn uniform_vec(rng: &mut AttnRng, n: usize, bound: f64) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-bound..=bound) as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u32> = (0..4).map(|_| stream(7, "x").random()).collect();
        let mut s = stream(7, "x");
        let b: Vec<u32> = (0..4).map(|_| s.random()).collect();
        let mut t = stream(7, "y");
        let c: Vec<u32> = (0..4).map(|_| t.random()).collect();
        assert_eq!(a[0], b[0]);
        assert_ne!(b, c);
    }

    #[test]
    fn normal_samples_have_the_requested_spread() {
        let xs = normal_vec(&mut stream(1, "n"), 20_000, 0.5);
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.02, "std {}", var.sqrt());
    }
}
