//! What the composed forms share: the chunks of (B, H, T, ·) tensors side by side, so that the
//! work of every chunk that does not read the state (its C×C scores and decays, the DeltaNet
//! inverse, what it adds to the state) is a few batched ops for all chunks at once, and only the
//! state's recurrence loops over chunks. On a GPU each op is a kernel launch or more: with
//! everything inside the loop an H100 took 150 ms a GLA step at d 128, T 1024 (B 8; 64 chunks
//! of 16), against 4.3 ms for softmax; 44.5 ms batched.

use candle_core::Tensor;

use crate::Result;

/// The `n` chunks of `chunk` positions that cover T positions of B × H heads.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunks {
    h: usize,
    t: usize,
    chunk: usize,
    n: usize,
}

/// What fills the positions past T in the last chunk.
#[derive(Clone, Copy, Debug)]
pub(super) enum Fill {
    Zeros,
    /// Copies of the value at T − 1 (a running sum that stays where it ended).
    Last,
}

impl Chunks {
    /// The chunks of q (B, H, T, ·), `chunk` positions each (at most T).
    pub fn of(q: &Tensor, chunk: usize) -> Result<Self> {
        let (_, h, t, _) = q.dims4()?;
        if t == 0 {
            let message = "the chunked form takes at least one position";
            return Err(crate::Error::Internal(message.into()));
        }
        let chunk = chunk.clamp(1, t);
        Ok(Self {
            h,
            t,
            chunk,
            n: t.div_ceil(chunk),
        })
    }

    pub fn count(self) -> usize {
        self.n
    }

    /// x (B, H, T, w) as (B, H·n, C, w), the positions past T filled with `fill`. B may be 1
    /// for a tensor shared by the batch.
    pub fn side_by_side(self, x: &Tensor, fill: Fill) -> Result<Tensor> {
        let (b, h, _, width) = x.dims4()?;
        let extra = self.n * self.chunk - self.t;
        let padded = match fill {
            _ if extra == 0 => x.clone(),
            Fill::Zeros => x.pad_with_zeros(2, 0, extra)?,
            // One broadcast copy: candle's pad_with_same concatenates a copy per position.
            Fill::Last => {
                let last = x
                    .narrow(2, self.t - 1, 1)?
                    .broadcast_as((b, h, extra, width))?;
                Tensor::cat(&[x, &last.contiguous()?], 2)?
            }
        };
        Ok(padded.reshape((b, self.h * self.n, self.chunk, width))?)
    }

    /// The rows at each chunk's last position of x (B, H·n, C, w): (B, H·n, 1, w).
    pub fn last_rows(self, x: &Tensor) -> Result<Tensor> {
        Ok(x.narrow(2, self.chunk - 1, 1)?)
    }

    /// For each chunk, the row of x (B, H·n, 1, w) of the chunk before it, zeros before the
    /// first: (B, H·n, 1, w).
    pub fn of_the_chunk_before(self, x: &Tensor) -> Result<Tensor> {
        let (b, _, _, width) = x.dims4()?;
        let x = x.reshape((b, self.h, self.n, width))?;
        let first = Tensor::zeros((b, self.h, 1, width), x.dtype(), x.device())?;
        let shifted = match self.n {
            1 => first,
            n => Tensor::cat(&[&first, &x.narrow(2, 0, n - 1)?], 2)?,
        };
        Ok(shifted.reshape((b, self.h * self.n, 1, width))?)
    }

    /// x (B, H·n, rows, cols), side by side, as (B, H, n, rows, cols), for [`Self::at`].
    pub fn per_chunk(self, x: Tensor) -> Result<Tensor> {
        let (b, _, rows, cols) = x.dims4()?;
        Ok(x.reshape((b, self.h, self.n, rows, cols))?)
    }

    /// Chunk `i` of x (B, H, n, rows, cols) ([`Self::per_chunk`]): (B, H, rows, cols),
    /// contiguous.
    pub fn at(x: &Tensor, i: usize) -> Result<Tensor> {
        Ok(x.narrow(2, i, 1)?.squeeze(2)?.contiguous()?)
    }

    /// The outputs (B, H, T, Dv) of the state's recurrence over the chunks, each argument per
    /// chunk ([`Self::per_chunk`]): chunk i's output is own_i + read_i · S_i, with S_0 = 0 and
    /// S_(i+1) = S_i ⊙ carried_i + added_i (the state the chunk leaves). The decayed forms
    /// with a write that does not read the state share it (scalar and channel decays).
    pub fn recur(
        self,
        own: &Tensor,
        read: &Tensor,
        carried: &Tensor,
        added: &Tensor,
    ) -> Result<Tensor> {
        let mut state: Option<Tensor> = None;
        let mut outputs = Vec::with_capacity(self.n);
        for i in 0..self.n {
            let output = Self::at(own, i)?;
            outputs.push(match &state {
                Some(state) => (output + Self::at(read, i)?.matmul(state)?)?,
                None => output,
            });
            // The state after the last chunk is never read.
            if i + 1 < self.n {
                let added = Self::at(added, i)?;
                state = Some(match state {
                    Some(state) => (state.broadcast_mul(&Self::at(carried, i)?)? + added)?,
                    None => added,
                });
            }
        }
        self.joined(&outputs)
    }

    /// The outputs of the chunks, (B, H, C, w) each, as (B, H, T, w).
    pub fn joined(self, outputs: &[Tensor]) -> Result<Tensor> {
        Ok(Tensor::cat(outputs, 2)?.narrow(2, 0, self.t)?)
    }
}
