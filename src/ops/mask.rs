//! The additive causal mask, built once per shape and device: on a GPU, building it each step
//! was a host-to-device copy and a (T, T) comparison per attention layer.

use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};

use crate::Result;

/// Masks kept; a run uses one or two shapes, a long evaluation one per block length.
const CACHED: usize = 16;

/// What a mask depends on besides its device: (Tq, Tk, dtype).
type Key = (usize, usize, DType);

/// (key, device) → mask, most recently used last.
static MASKS: Mutex<Vec<(Key, Device, Tensor)>> = Mutex::new(Vec::new());

/// The additive causal mask (Tq, Tk) of `x`: 0 where j ≤ i + (Tk − Tq), −∞ elsewhere.
pub fn causal_mask(x: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    let key = (dims[dims.len() - 2], dims[dims.len() - 1], x.dtype());
    let mut masks = MASKS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let found = masks
        .iter()
        .position(|(k, device, _)| *k == key && device.same_device(x.device()));
    let entry = match found {
        Some(i) => masks.remove(i),
        None => (key, x.device().clone(), build(key, x.device())?),
    };
    let mask = entry.2.clone();
    masks.push(entry);
    if masks.len() > CACHED {
        masks.remove(0);
    }
    Ok(mask)
}

fn build((tq, tk, dtype): Key, device: &Device) -> Result<Tensor> {
    let offset = tk.saturating_sub(tq);
    let data: Vec<f32> = (0..tq * tk)
        .map(|ij| {
            if ij % tk > ij / tk + offset {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Ok(Tensor::from_vec(data, (tq, tk), device)?.to_dtype(dtype)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_hides_later_keys_and_is_reused() {
        let x = Tensor::zeros((2, 3, 5), DType::F32, &Device::Cpu).unwrap();
        let mask = causal_mask(&x).unwrap().to_vec2::<f32>().unwrap();
        // Three queries over five keys: the queries are the last three positions.
        assert_eq!(mask[0][..3], [0.0; 3]);
        assert_eq!(mask[0][3], f32::NEG_INFINITY);
        assert_eq!(mask[2], vec![0.0; 5]);
        let again = causal_mask(&x).unwrap();
        assert_eq!(again.dims(), &[3, 5]);
        assert_eq!(causal_mask(&x).unwrap().id(), again.id(), "built once");
    }
}
