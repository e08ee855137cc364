//! MAD's auto-encoder head for its compression probe (mad-lab's `AutoEncoder`,
//! `mad/model/auto_encoder.py`). Compression scores every token against itself, which a causal
//! language model copies from its own input; here the blocks only encode, the last position is
//! pooled (`global_pool = 'last'`), and every position p is decoded from that one vector plus
//! a sinusoid of p, so what the probe measures is how much of the sequence the pooled state
//! holds. Unlike the language model there is no final norm after the blocks: the decoder's
//! first RMSNorm reads the pool.

use candle_core::{Device, Tensor};

use super::{Build, Layout, Linear, LinearInit, Norm, gather_rows};
use crate::Result;
use crate::ops::gelu_erf;
use crate::params::Params;

/// mad-lab's decoder and unembedding: z_p = pool + sincos_p, then
/// RMSNorm → Linear(d, d) → GELU, twice, then RMSNorm → Linear(d, V). Its linear layers start
/// N(0, 0.02) with zero biases (`_init_weights`).
pub struct AutoEncoder {
    /// fairseq's sinusoids of the positions, (max_len, d) ([`sincos`]).
    positions: Tensor,
    decoder: [(Norm, Linear); 2],
    unembed: (Norm, Linear),
}

impl AutoEncoder {
    /// mad-lab's `initializer_range`.
    const STD: f64 = 0.02;

    pub(super) fn new(
        (d, vocab, max_len): (usize, usize, usize),
        build: &Build,
        params: &Params,
    ) -> Result<Self> {
        let stage = |name: String, out: usize| -> Result<(Norm, Linear)> {
            let p = params.pp(name);
            Ok((
                // mad-lab's `norm` is RMSNorm whatever the blocks use.
                Norm::new(d, Layout::Mad, &p.pp("norm"))?,
                Linear::new(
                    (d, out),
                    true,
                    LinearInit::Normal(Self::STD),
                    build.precision,
                    &p.pp("linear"),
                )?,
            ))
        };
        Ok(Self {
            positions: sincos(max_len, d, params.device())?,
            decoder: [stage("decoder.0".into(), d)?, stage("decoder.1".into(), d)?],
            unembed: stage("unembed".into(), vocab)?,
        })
    }

    /// The parameters it creates at width `d` over `vocab` tokens (for the memory estimate).
    pub fn parameters(d: usize, vocab: usize) -> usize {
        3 * d + 2 * (d * d + d) + d * vocab + vocab
    }

    /// Logits (B, T, V) at every position of the blocks' output x (B, T, D).
    pub(super) fn logits(&self, x: &Tensor) -> Result<Tensor> {
        self.decode(&self.inputs(x)?)
    }

    /// Logits (R, V) at the flat positions `rows` (b·T + t) of x (B, T, D).
    pub(super) fn logits_rows(&self, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
        self.decode(&gather_rows(&self.inputs(x)?, rows)?)
    }

    /// z (B, T, D): the last position of each row of x, plus each position's sinusoid.
    fn inputs(&self, x: &Tensor) -> Result<Tensor> {
        let (_, t, _) = x.dims3()?;
        let pooled = x.narrow(1, t - 1, 1)?;
        let positions = self.positions.narrow(0, 0, t)?.unsqueeze(0)?;
        Ok(pooled.broadcast_add(&positions)?)
    }

    fn decode(&self, z: &Tensor) -> Result<Tensor> {
        let mut h = z.clone();
        for (norm, linear) in &self.decoder {
            h = gelu_erf(&linear.forward(&norm.forward(&h)?)?)?;
        }
        let (norm, linear) = &self.unembed;
        linear.forward(&norm.forward(&h)?)
    }
}

/// fairseq's sinusoidal embedding as mad-lab's `posemb_sincos_1d` writes it, (len, d): row p is
/// [sin(p f_0), …, sin(p f_{h−1}), cos(p f_0), …, cos(p f_{h−1})] with h = ⌊d/2⌋ and
/// f_i = exp(−i ln(10000)/(h − 1)), halves side by side rather than interleaved, then a zero
/// column when d is odd. (At d < 4 mad-lab divides by h − 1 = 0; here h − 1 is taken as 1.)
fn sincos(len: usize, d: usize, device: &Device) -> Result<Tensor> {
    let half = d / 2;
    let step = 10000f64.ln() / (half.max(2) - 1) as f64;
    let freqs: Vec<f64> = (0..half).map(|i| (-(i as f64) * step).exp()).collect();
    let mut table = Vec::with_capacity(len * d);
    for p in 0..len {
        let angles = freqs.iter().map(|f| p as f64 * f);
        table.extend(angles.clone().map(|a| a.sin() as f32));
        table.extend(angles.map(|a| a.cos() as f32));
        table.extend(std::iter::repeat_n(0.0, d - 2 * half));
    }
    Ok(Tensor::from_vec(table, (len, d), device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MAD's model under its auto-encoder.
    const MAD: Build = Build {
        precision: crate::ops::Precision::F32,
        layout: Layout::Mad,
        n_layers: 2,
        autoencoder: true,
    };

    /// Against torch's `posemb_sincos_1d(4, 6)` (h = 3, f = [1, 0.01, 0.0001]), row 2:
    /// sin(2), sin(0.02), sin(0.0002), cos(2), cos(0.02), cos(0.0002); an odd width ends in 0.
    #[test]
    fn the_sinusoids_are_fairseqs_halves() {
        let table = sincos(4, 6, &Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let want = [
            2f64.sin(),
            0.02f64.sin(),
            0.0002f64.sin(),
            2f64.cos(),
            0.02f64.cos(),
            0.0002f64.cos(),
        ];
        for (got, want) in table[2].iter().zip(want) {
            assert!(
                (f64::from(*got) - want).abs() < 1e-6,
                "{got} against {want}"
            );
        }
        assert_eq!(table[0], [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let odd = sincos(3, 7, &Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert!(odd.iter().all(|row| row[6] == 0.0));
    }

    /// Every position is decoded from the last one: changing any earlier row of the blocks'
    /// output leaves the logits alone, changing the last one changes all of them; and the
    /// scored rows are the whole map's rows.
    #[test]
    fn every_position_is_decoded_from_the_last_one() {
        let params = Params::new(5, &Device::Cpu);
        let head = AutoEncoder::new((8, 11, 6), &MAD, &params).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 6, 8), &Device::Cpu).unwrap();
        let logits = head.logits(&x).unwrap();
        assert_eq!(logits.dims(), &[2, 6, 11]);
        let earlier = Tensor::randn(0f32, 1.0, (2, 5, 8), &Device::Cpu).unwrap();
        let last = x.narrow(1, 5, 1).unwrap();
        let same_last = Tensor::cat(&[&earlier, &last], 1).unwrap();
        let diff = (head.logits(&same_last).unwrap() - &logits).unwrap();
        assert_eq!(crate::ops::testing::max_abs(&diff), 0.0);
        let other_last = Tensor::cat(&[&x.narrow(1, 0, 5).unwrap(), &(&last + 1.0).unwrap()], 1)
            .unwrap()
            .contiguous()
            .unwrap();
        let changed = (head.logits(&other_last).unwrap() - &logits).unwrap();
        let per_position = changed.abs().unwrap().max(2).unwrap().min_all().unwrap();
        assert!(per_position.to_scalar::<f32>().unwrap() > 0.0);
        let rows = Tensor::new(&[1u32, 6, 11], &Device::Cpu).unwrap();
        let picked = head.logits_rows(&x, &rows).unwrap();
        let all = logits.reshape((12, 11)).unwrap();
        let want = all.index_select(&rows, 0).unwrap();
        assert_eq!(crate::ops::testing::max_abs(&(picked - want).unwrap()), 0.0);
    }

    /// mad-lab's count: three RMSNorm gains, two d × d layers and the unembedding, with
    /// biases; at MAD's d 128 and V 16, 35,472.
    #[test]
    fn it_has_mad_labs_parameters() {
        let params = Params::new(1, &Device::Cpu);
        AutoEncoder::new((128, 16, 32), &MAD, &params).unwrap();
        let count: usize = params.vars().iter().map(|(_, v)| v.elem_count()).sum();
        assert_eq!(count, AutoEncoder::parameters(128, 16));
        assert_eq!(count, 3 * 128 + 2 * (128 * 128 + 128) + 128 * 16 + 16);
        assert_eq!(count, 35_472);
    }
}
