//! One pass over rows of logits: the top-k ids, their probabilities under `softmax(logits *
//! scale)` and the argmax, as a decode step needs them (the torch equivalent reads each row three
//! times: `topk`, `logsumexp`, `max`).
//!
//! Semantics, the same as torch's (`torch.topk`, `torch.logsumexp`, `torch.max(dim=-1)`) except
//! for the order of ties inside the top k:
//! - ids are ordered by logit, largest first; equal logits in id order (lower id first; `-0.0`
//!   equals `0.0`). NaN ranks above every number (as in torch), so the argmax of a row holding a
//!   NaN is its first NaN.
//! - the argmax is the first index of the row's largest logit (`torch.max(dim=-1).indices`); it is
//!   always `ids[0]`.
//! - probabilities are `exp(logit * scale - logsumexp(logits * scale))` in float32: a row holding
//!   a NaN has NaN probabilities, a row whose largest scaled logit is `+inf` has its logsumexp
//!   `+inf` (NaN for the infinite entries, 0 for the others) and a row of `-inf` only has NaN
//!   probabilities, each as torch computes them.
//!
//! The row is read in chunks of [`CHUNK`] logits, each converted to float32 once: a chunk's
//! maximum decides whether any of its logits can enter the top k (most chunks are skipped), and
//! an online logsumexp adds the chunk's `exp(x * scale - m)` under the running maximum `m` (the
//! sum rescaled when `m` grows) with a polynomial `exp` (relative error ~2e-7). The top-k alone
//! ([`logits_topk`]) reads each row once, without the copy: blocks of lanes are tested against
//! the current k-th value and looked at one by one only when one may enter. The lane loops
//! are compiled twice on x86-64, for AVX2 + FMA (chosen at run time) and for the baseline, and
//! once elsewhere (NEON on aarch64 is baseline).

use crate::error::{Result, invalid};

/// Logits per chunk: one chunk's float32 copy stays in L1.
const CHUNK: usize = 512;

/// A logit element: float32, or bfloat16 as its raw bits (`u16`, or `i16` as torch's
/// `view(torch.int16)` gives them).
pub trait Logit: Copy + Send + Sync {
    /// Whether the element is bfloat16 bits (two bytes) rather than a float32.
    const BF16: bool;
    /// The value as float32 (exact for both kinds).
    fn to_f32(self) -> f32;
}

impl Logit for f32 {
    const BF16: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Logit for u16 {
    const BF16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

impl Logit for i16 {
    const BF16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        #[allow(clippy::cast_sign_loss)] // the bits, reinterpreted
        f32::from_bits(u32::from(self as u16) << 16)
    }
}

/// The summaries of `rows` rows of `vocab` logits each (row-major in `logits`), written into
/// `ids` and `probs` (`rows * k` each, row-major) and `greedy` (`rows`).
///
/// # Errors
/// `InvalidArgument` if `k` is not in `1..=vocab`, `scale` is not finite and positive, or a
/// buffer's length does not match `rows`, `vocab` and `k`.
#[allow(clippy::too_many_arguments)]
pub fn logits_summary<T: Logit>(
    logits: &[T],
    rows: usize,
    vocab: usize,
    k: usize,
    scale: f32,
    ids: &mut [i64],
    probs: &mut [f32],
    greedy: &mut [i64],
) -> Result<()> {
    check(logits.len(), rows, vocab, k, scale, ids.len(), probs.len())?;
    if greedy.len() != rows {
        return Err(mismatch(rows, vocab, k));
    }
    dispatch(logits, vocab, k, scale, ids, Some(probs), greedy);
    Ok(())
}

/// The top-k ids alone of `rows` rows of `vocab` logits (as [`logits_summary`]'s `ids`, without
/// its exponentials: about a third of the time where nobody reads the probabilities).
///
/// # Errors
/// `InvalidArgument` if `k` is not in `1..=vocab` or `ids` is not `rows * k` long.
pub fn logits_topk<T: Logit>(
    logits: &[T],
    rows: usize,
    vocab: usize,
    k: usize,
    ids: &mut [i64],
) -> Result<()> {
    check(logits.len(), rows, vocab, k, 1.0, ids.len(), ids.len())?;
    let mut greedy = vec![0i64; rows];
    dispatch(logits, vocab, k, 1.0, ids, None, &mut greedy);
    Ok(())
}

fn mismatch(rows: usize, vocab: usize, k: usize) -> crate::error::Error {
    invalid(
        "logits",
        format!("buffers do not match {rows} rows of {vocab} logits and k = {k}"),
    )
}

/// The arguments' rules shared by [`logits_summary`] and [`logits_topk`].
fn check(
    logits: usize,
    rows: usize,
    vocab: usize,
    k: usize,
    scale: f32,
    ids: usize,
    probs: usize,
) -> Result<()> {
    if vocab == 0 {
        return Err(invalid("logits", "rows must hold at least one logit"));
    }
    if k == 0 || k > vocab {
        return Err(invalid(
            "k",
            format!("must be in [1, {vocab}] (the vocabulary), got {k}"),
        ));
    }
    if !(scale.is_finite() && scale > 0.0) {
        return Err(invalid(
            "scale",
            format!("must be finite and positive, got {scale}"),
        ));
    }
    if rows.checked_mul(vocab) != Some(logits) || rows.checked_mul(k) != Some(ids) || ids != probs {
        return Err(mismatch(rows, vocab, k));
    }
    Ok(())
}

/// The lane loops' implementation [`logits_summary`] uses on this machine (for benchmarks and
/// tests: "avx2" or "portable").
#[must_use]
pub fn kernel_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        return "avx2";
    }
    "portable"
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

fn dispatch<T: Logit>(
    logits: &[T],
    vocab: usize,
    k: usize,
    scale: f32,
    ids: &mut [i64],
    probs: Option<&mut [f32]>,
    greedy: &mut [i64],
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        #[allow(unsafe_code)]
        unsafe {
            all_rows_avx2(logits, vocab, k, scale, ids, probs, greedy);
        }
        return;
    }
    all_rows::<T, Portable>(logits, vocab, k, scale, ids, probs, greedy);
}

/// [`all_rows`] compiled for AVX2 + FMA.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2,fma")]
unsafe fn all_rows_avx2<T: Logit>(
    logits: &[T],
    vocab: usize,
    k: usize,
    scale: f32,
    ids: &mut [i64],
    probs: Option<&mut [f32]>,
    greedy: &mut [i64],
) {
    all_rows::<T, avx2::Avx2>(logits, vocab, k, scale, ids, probs, greedy);
}

/// Every row in turn, the lane loops of `K`; the probabilities only where `probs` is given.
#[inline(always)]
fn all_rows<T: Logit, K: Kernel>(
    logits: &[T],
    vocab: usize,
    k: usize,
    scale: f32,
    ids: &mut [i64],
    mut probs: Option<&mut [f32]>,
    greedy: &mut [i64],
) {
    let mut buf = [0.0f32; CHUNK];
    let mut top = TopK::new(k);
    for (index, (row, row_greedy)) in logits
        .chunks_exact(vocab)
        .zip(greedy.iter_mut())
        .enumerate()
    {
        top.clear();
        let cells = index * k..(index + 1) * k;
        let row_ids = &mut ids[cells.clone()];
        if let Some(probs) = probs.as_deref_mut() {
            let lse = row_pass::<T, K, true>(row, scale, &mut top, &mut buf);
            for (p, &v) in probs[cells].iter_mut().zip(&top.values) {
                *p = (v * scale - lse).exp();
            }
        } else {
            row_pass::<T, K, false>(row, scale, &mut top, &mut buf);
        }
        for (id, &t) in row_ids.iter_mut().zip(&top.ids) {
            #[allow(clippy::cast_possible_wrap)] // ids < vocab, a slice length
            {
                *id = t as i64;
            }
        }
        *row_greedy = row_ids[0];
    }
}

/// The k largest logits seen so far, largest first, ties in the order they came (lower ids).
struct TopK {
    k: usize,
    len: usize,
    values: Vec<f32>,
    ids: Vec<usize>,
}

/// `a` ranks above `b`: larger, or NaN over a number.
#[inline(always)]
fn above(a: f32, b: f32) -> bool {
    a > b || (a.is_nan() && !b.is_nan())
}

impl TopK {
    fn new(k: usize) -> Self {
        Self {
            k,
            len: 0,
            values: vec![0.0; k],
            ids: vec![0; k],
        }
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    fn full(&self) -> bool {
        self.len == self.k
    }

    /// The k-th value (valid once full).
    #[inline(always)]
    fn threshold(&self) -> f32 {
        self.values[self.k - 1]
    }

    /// Offer logit `x` of id `id` (ids offered in increasing order).
    #[inline(never)]
    fn offer(&mut self, x: f32, id: usize) {
        let mut pos = if self.full() {
            if !above(x, self.values[self.k - 1]) {
                return;
            }
            self.k - 1
        } else {
            self.len += 1;
            self.len - 1
        };
        while pos > 0 && above(x, self.values[pos - 1]) {
            self.values[pos] = self.values[pos - 1];
            self.ids[pos] = self.ids[pos - 1];
            pos -= 1;
        }
        self.values[pos] = x;
        self.ids[pos] = id;
    }
}

/// Lanes of the vector loops (AVX2's 8 floats; two NEON registers).
const LANES: usize = 8;

/// The lane loops over one chunk.
trait Kernel {
    /// Copies `chunk` into `buf` as float32; its maximum (NaN ignored) and whether it holds a
    /// NaN.
    fn load_max<T: Logit>(chunk: &[T], buf: &mut [f32]) -> (f32, bool);
    /// Offers `top` the logits of `buf` (ids from `base`) that can enter it (none NaN).
    fn offer_above(buf: &[f32], base: usize, top: &mut TopK);
    /// `sum(exp(x * scale - m))` over `buf` (every `x * scale <= m`, none NaN, `m` finite).
    fn exp_sum(buf: &[f32], scale: f32, m: f32) -> f32;
    /// Offers `top` every logit of `row` that can enter it (NaN included), in one pass and
    /// without a copy: the top-k alone needs no chunk maximum.
    fn offer_row<T: Logit>(row: &[T], top: &mut TopK);
}

/// Plain Rust over lane arrays (auto-vectorised as the target allows).
struct Portable;

impl Kernel for Portable {
    #[inline(always)]
    fn load_max<T: Logit>(chunk: &[T], buf: &mut [f32]) -> (f32, bool) {
        load_max(chunk, buf)
    }

    #[inline(always)]
    fn offer_above(buf: &[f32], base: usize, top: &mut TopK) {
        offer_above(buf, base, top);
    }

    #[inline(always)]
    fn exp_sum(buf: &[f32], scale: f32, m: f32) -> f32 {
        exp_sum::<false>(buf, scale, m)
    }

    #[inline(always)]
    fn offer_row<T: Logit>(row: &[T], top: &mut TopK) {
        offer_row(row, top);
    }
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `exp(x)` for `x <= 0` (below -87 taken as -87: ~1e-38 where the truth is smaller), relative
/// error ~2e-7; `exp(0)` is exactly 1. Cephes' `expf`: `2^n * p(r)`, `n` rounded with the
/// 1.5 * 2^23 trick, `2^n` built from its bits.
#[inline(always)]
fn exp_nonpositive<const FMA: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = if x > -87.0 { x } else { -87.0 };
    let z = madd::<FMA>(x, LOG2E, MAGIC);
    let n = z - MAGIC;
    #[allow(clippy::cast_possible_wrap)]
    let n_int = (z.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let r = madd::<FMA>(n, -LN2_HI, x);
    let r = madd::<FMA>(n, -LN2_LO, r);
    let mut p = 1.987_569_1e-4f32;
    p = madd::<FMA>(p, r, 1.398_199_9e-3);
    p = madd::<FMA>(p, r, 8.333_452e-3);
    p = madd::<FMA>(p, r, 4.166_579_6e-2);
    p = madd::<FMA>(p, r, 1.666_666_5e-1);
    p = madd::<FMA>(p, r, 0.5);
    let y = madd::<FMA>(p * r, r, r) + 1.0;
    #[allow(clippy::cast_sign_loss)] // n >= -126 here: a positive exponent field
    let pow2 = f32::from_bits(((n_int + 127) as u32) << 23);
    y * pow2
}

/// One row: offers its logits to `top` and returns the logsumexp of `row * scale` (with
/// `LSE`; without it no exponential is computed and the value returned means nothing).
#[inline(always)]
fn row_pass<T: Logit, K: Kernel, const LSE: bool>(
    row: &[T],
    scale: f32,
    top: &mut TopK,
    buf: &mut [f32; CHUNK],
) -> f32 {
    if !LSE {
        K::offer_row(row, top);
        return 0.0;
    }
    let mut m = f32::NEG_INFINITY; // running maximum of the scaled logits
    let mut sum = 0.0f32; // sum of exp(x * scale - m) so far
    let mut nan = false;
    for (index, chunk) in row.chunks(CHUNK).enumerate() {
        let base = index * CHUNK;
        let buf = &mut buf[..chunk.len()];
        let (cmax, chunk_nan) = K::load_max(chunk, buf);
        if chunk_nan {
            nan = true;
            for (i, &x) in buf.iter().enumerate() {
                top.offer(x, base + i);
            }
            continue;
        }
        if !top.full() || cmax > top.threshold() {
            K::offer_above(buf, base, top);
        }
        if nan {
            continue; // the logsumexp is NaN anyway
        }
        let cm = cmax * scale;
        if cm > m {
            // m = -inf the first time: exp(-inf) = 0 clears the empty sum.
            sum *= (m - cm).exp();
            m = cm;
        }
        if m.is_finite() {
            sum += K::exp_sum(buf, scale, m);
        }
    }
    if nan {
        f32::NAN
    } else if m.is_finite() {
        m + sum.ln()
    } else {
        m // +inf, or -inf for a row of -inf: torch's logsumexp
    }
}

/// Copies `chunk` into `buf` as float32; its maximum (NaN ignored) and whether it holds a NaN.
#[inline(always)]
fn load_max<T: Logit>(chunk: &[T], buf: &mut [f32]) -> (f32, bool) {
    let mut lanes_max = [f32::NEG_INFINITY; LANES];
    let mut lanes_nan = [false; LANES];
    let mut src = chunk.chunks_exact(LANES);
    let mut dst = buf.chunks_exact_mut(LANES);
    for (s, d) in (&mut src).zip(&mut dst) {
        for l in 0..LANES {
            let x = s[l].to_f32();
            d[l] = x;
            lanes_max[l] = if x > lanes_max[l] { x } else { lanes_max[l] };
            lanes_nan[l] |= x.is_nan();
        }
    }
    let mut cmax = f32::NEG_INFINITY;
    let mut nan = false;
    for (s, d) in src.remainder().iter().zip(dst.into_remainder()) {
        let x = s.to_f32();
        *d = x;
        cmax = if x > cmax { x } else { cmax };
        nan |= x.is_nan();
    }
    for l in 0..LANES {
        cmax = if lanes_max[l] > cmax {
            lanes_max[l]
        } else {
            cmax
        };
        nan |= lanes_nan[l];
    }
    (cmax, nan)
}

/// Offers `top` the logits of `buf` (ids from `base`) that can enter it: a block of lanes is
/// looked at one by one only if one of them beats the current threshold.
#[inline(always)]
fn offer_above(buf: &[f32], base: usize, top: &mut TopK) {
    let mut blocks = buf.chunks_exact(LANES);
    let mut start = base;
    for block in &mut blocks {
        let beats = !top.full() || {
            let t = top.threshold();
            let mut any = false;
            for &x in block {
                any |= x > t;
            }
            any
        };
        if beats {
            for (i, &x) in block.iter().enumerate() {
                top.offer(x, start + i);
            }
        }
        start += LANES;
    }
    for (i, &x) in blocks.remainder().iter().enumerate() {
        top.offer(x, start + i);
    }
}

/// `x` may enter a full top k whose k-th value is `t`: larger, or either one NaN (`offer`
/// decides then; a NaN threshold admits nothing).
#[inline(always)]
fn may_enter(x: f32, t: f32) -> bool {
    x > t || x.is_nan() || t.is_nan()
}

/// Offers `top` the logits of `row` that can enter it: a block of lanes is looked at one by one
/// only if one of them may beat the current threshold.
#[inline(always)]
fn offer_row<T: Logit>(row: &[T], top: &mut TopK) {
    let mut blocks = row.chunks_exact(LANES);
    let mut start = 0;
    for block in &mut blocks {
        let beats = !top.full() || {
            let t = top.threshold();
            let mut any = false;
            for &x in block {
                any |= may_enter(x.to_f32(), t);
            }
            any
        };
        if beats {
            for (i, &x) in block.iter().enumerate() {
                top.offer(x.to_f32(), start + i);
            }
        }
        start += LANES;
    }
    for (i, &x) in blocks.remainder().iter().enumerate() {
        top.offer(x.to_f32(), start + i);
    }
}

/// `sum(exp(x * scale - m))` over `buf` (every `x * scale <= m`, none NaN). The product is
/// rounded before the subtraction (no FMA), as `m` was: the maximum's term is exactly 1, so the
/// sum is at least 1 and no probability exceeds 1.
#[inline(always)]
fn exp_sum<const FMA: bool>(buf: &[f32], scale: f32, m: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut blocks = buf.chunks_exact(LANES);
    for block in &mut blocks {
        for l in 0..LANES {
            acc[l] += exp_nonpositive::<FMA>(block[l] * scale - m);
        }
    }
    let mut sum = 0.0f32;
    for &x in blocks.remainder() {
        sum += exp_nonpositive::<FMA>(x * scale - m);
    }
    for a in acc {
        sum += a;
    }
    sum
}

/// The lane loops in AVX2 + FMA intrinsics (8 floats a register).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use super::{Kernel, Logit, TopK, exp_nonpositive};
    use std::arch::x86_64::{
        __m128i, __m256, _CMP_GT_OQ, _CMP_NLE_UQ, _CMP_UNORD_Q, _mm_loadu_si128, _mm256_add_epi32,
        _mm256_add_ps, _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmp_ps,
        _mm256_cvtepu16_epi32, _mm256_fmadd_ps, _mm256_fnmadd_ps, _mm256_loadu_ps, _mm256_max_ps,
        _mm256_movemask_ps, _mm256_mul_ps, _mm256_or_ps, _mm256_set1_epi32, _mm256_set1_ps,
        _mm256_setzero_ps, _mm256_slli_epi32, _mm256_storeu_ps, _mm256_sub_epi32, _mm256_sub_ps,
    };

    /// The AVX2 + FMA kernel; only used once the CPU is known to have both.
    pub(super) struct Avx2;

    impl Kernel for Avx2 {
        #[inline(always)]
        fn load_max<T: Logit>(chunk: &[T], buf: &mut [f32]) -> (f32, bool) {
            // SAFETY: `Avx2` is only chosen on a CPU with AVX2 and FMA.
            unsafe { load_max(chunk, buf) }
        }

        #[inline(always)]
        fn offer_above(buf: &[f32], base: usize, top: &mut TopK) {
            // SAFETY: as above.
            unsafe { offer_above(buf, base, top) }
        }

        #[inline(always)]
        fn exp_sum(buf: &[f32], scale: f32, m: f32) -> f32 {
            // SAFETY: as above.
            unsafe { exp_sum(buf, scale, m) }
        }

        #[inline(always)]
        fn offer_row<T: Logit>(row: &[T], top: &mut TopK) {
            // SAFETY: as above.
            unsafe { offer_row(row, top) }
        }
    }

    /// 8 logits from `chunk[at..at + 8]` as float32.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load8<T: Logit>(chunk: &[T], at: usize) -> __m256 {
        debug_assert!(at + 8 <= chunk.len());
        // SAFETY: the caller keeps `at + 8 <= chunk.len()`; T is f32 or a 16-bit integer, as
        // `T::BF16` says.
        unsafe {
            let ptr = chunk.as_ptr().add(at);
            if T::BF16 {
                let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(ptr.cast::<__m128i>()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
            } else {
                _mm256_loadu_ps(ptr.cast::<f32>())
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hmax(v: __m256) -> f32 {
        let mut lanes = [0.0f32; 8];
        // SAFETY: 8 floats into 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        lanes
            .into_iter()
            .fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a })
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_max<T: Logit>(chunk: &[T], buf: &mut [f32]) -> (f32, bool) {
        let n = chunk.len().min(buf.len());
        let whole = n - n % 8;
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut nan = _mm256_setzero_ps();
        let mut i = 0;
        while i < whole {
            // SAFETY: i + 8 <= whole <= both lengths.
            unsafe {
                let v = load8(chunk, i);
                _mm256_storeu_ps(buf.as_mut_ptr().add(i), v);
                // max_ps(v, mx) keeps mx where v is NaN.
                mx = _mm256_max_ps(v, mx);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            }
            i += 8;
        }
        let (tail_max, tail_nan) = super::load_max(&chunk[whole..n], &mut buf[whole..n]);
        let cmax = hmax(mx);
        (
            if tail_max > cmax { tail_max } else { cmax },
            tail_nan || _mm256_movemask_ps(nan) != 0,
        )
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn offer_above(buf: &[f32], base: usize, top: &mut TopK) {
        let whole = buf.len() - buf.len() % 8;
        let mut i = 0;
        while i < whole {
            let mask = if top.full() {
                // SAFETY: i + 8 <= whole <= buf.len().
                let v = unsafe { _mm256_loadu_ps(buf.as_ptr().add(i)) };
                _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(
                    v,
                    _mm256_set1_ps(top.threshold()),
                ))
            } else {
                0xFF
            };
            let mut bits = mask;
            while bits != 0 {
                #[allow(clippy::cast_sign_loss)] // a set bit of an 8-bit mask
                let lane = bits.trailing_zeros() as usize;
                top.offer(buf[i + lane], base + i + lane);
                bits &= bits - 1;
            }
            i += 8;
        }
        super::offer_above(&buf[whole..], base + whole, top);
    }

    /// Lanes of 8 logits that may enter a full top k whose k-th value is in every lane of
    /// `t`, as a bit mask (`super::may_enter`: larger, or NaN on either side).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn entering(v: __m256, t: __m256) -> i32 {
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLE_UQ>(v, t))
    }

    /// Offers `top` the lanes of `mask` among 8 logits from `row[at..]`.
    #[inline]
    fn offer_lanes<T: Logit>(row: &[T], at: usize, mask: i32, top: &mut TopK) {
        let mut bits = mask;
        while bits != 0 {
            #[allow(clippy::cast_sign_loss)] // a set bit of an 8-bit mask
            let lane = bits.trailing_zeros() as usize;
            top.offer(row[at + lane].to_f32(), at + lane);
            bits &= bits - 1;
        }
    }

    /// The row in blocks of 32 logits (four registers, one test of their masks together), the
    /// threshold reloaded only after a block offered something.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn offer_row<T: Logit>(row: &[T], top: &mut TopK) {
        let n = row.len();
        let mut i = 0;
        while i < n && !top.full() {
            top.offer(row[i].to_f32(), i);
            i += 1;
        }
        if i == n {
            return;
        }
        let mut t = _mm256_set1_ps(top.threshold());
        while i + 32 <= n {
            // SAFETY: i + 32 <= n.
            let masks = unsafe {
                [
                    entering(load8(row, i), t),
                    entering(load8(row, i + 8), t),
                    entering(load8(row, i + 16), t),
                    entering(load8(row, i + 24), t),
                ]
            };
            if masks.iter().any(|&m| m != 0) {
                for (j, &mask) in masks.iter().enumerate() {
                    offer_lanes(row, i + 8 * j, mask, top);
                }
                t = _mm256_set1_ps(top.threshold());
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            let mask = entering(unsafe { load8(row, i) }, t);
            if mask != 0 {
                offer_lanes(row, i, mask, top);
                t = _mm256_set1_ps(top.threshold());
            }
            i += 8;
        }
        for (at, x) in row.iter().enumerate().skip(i) {
            top.offer(x.to_f32(), at);
        }
    }

    /// Cephes' `expf` on 8 lanes, as [`exp_nonpositive`].
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
        let magic = _mm256_set1_ps(12_582_912.0);
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E), magic);
        let n = _mm256_sub_ps(z, magic);
        let n_int = _mm256_sub_epi32(_mm256_castps_si256(z), _mm256_set1_epi32(0x4B40_0000));
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r),
            _mm256_set1_ps(1.0),
        );
        let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(n_int, _mm256_set1_epi32(127)));
        _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_sum(buf: &[f32], scale: f32, m: f32) -> f32 {
        let whole = buf.len() - buf.len() % 16;
        let (s, mv) = (_mm256_set1_ps(scale), _mm256_set1_ps(m));
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < whole {
            // SAFETY: i + 16 <= whole <= buf.len().
            let (v0, v1) = unsafe {
                (
                    _mm256_loadu_ps(buf.as_ptr().add(i)),
                    _mm256_loadu_ps(buf.as_ptr().add(i + 8)),
                )
            };
            // The product rounded before the subtraction (see `super::exp_sum`).
            a0 = _mm256_add_ps(a0, exp8(_mm256_sub_ps(_mm256_mul_ps(v0, s), mv)));
            a1 = _mm256_add_ps(a1, exp8(_mm256_sub_ps(_mm256_mul_ps(v1, s), mv)));
            i += 16;
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: 8 floats into 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(a0, a1)) };
        let mut sum: f32 = lanes.iter().sum();
        for &x in &buf[whole..] {
            sum += exp_nonpositive::<true>(x * scale - m);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain definition: full sort (stable: lower id first on ties, NaN first), f64
    /// logsumexp.
    fn reference(row: &[f32], k: usize, scale: f32) -> (Vec<usize>, Vec<f64>, f64) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (row[a], row[b]);
            if above(x, y) {
                std::cmp::Ordering::Less
            } else if above(y, x) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        });
        order.truncate(k);
        let m = row
            .iter()
            .map(|&x| f64::from(x * scale))
            .fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row
            .iter()
            .map(|&x| (f64::from(x * scale) - m).exp())
            .sum::<f64>()
            .ln();
        let probs = order
            .iter()
            .map(|&i| (f64::from(row[i] * scale) - lse).exp())
            .collect();
        (order, probs, lse)
    }

    fn run(row: &[f32], k: usize, scale: f32) -> (Vec<i64>, Vec<f32>, i64) {
        let (mut ids, mut probs, mut greedy) = (vec![0; k], vec![0.0; k], vec![0]);
        logits_summary(
            row,
            1,
            row.len(),
            k,
            scale,
            &mut ids,
            &mut probs,
            &mut greedy,
        )
        .unwrap();
        (ids, probs, greedy[0])
    }

    /// A deterministic pseudo-random row (xorshift), values in [-spread, spread] rounded to
    /// `levels` steps (few levels: many ties).
    fn row(seed: u64, len: usize, levels: u32, spread: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                #[allow(clippy::cast_precision_loss)]
                let u = (s % u64::from(levels)) as f32 / levels as f32;
                (2.0 * u - 1.0) * spread
            })
            .collect()
    }

    #[test]
    fn matches_the_reference_on_ties_and_sizes() {
        for (seed, len) in [(1, 1), (2, 7), (3, 8), (4, 513), (5, 1500), (6, 49152)] {
            for levels in [3, 50, 100_000] {
                for k in [1, 2, 8].into_iter().filter(|&k| k <= len) {
                    let r = row(seed, len, levels, 20.0);
                    for scale in [1.0, 0.37, 3.0] {
                        let (ids, probs, greedy) = run(&r, k, scale);
                        let (want, want_probs, lse) = reference(&r, k, scale);
                        let want: Vec<i64> = want.iter().map(|&i| i as i64).collect();
                        assert_eq!(ids, want, "len {len} levels {levels} k {k}");
                        assert_eq!(greedy, want[0]);
                        for (p, q) in probs.iter().zip(&want_probs) {
                            // float32's own rounding of the logsumexp, as in torch's
                            let tol = 2e-6 + 2.0 * f64::from(f32::EPSILON) * lse.abs();
                            assert!((f64::from(*p) - q).abs() <= tol * q + 1e-30, "{p} vs {q}");
                            assert!(*p <= 1.0);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_bits_read_as_their_floats() {
        let r: Vec<f32> = row(9, 3000, 1000, 8.0)
            .into_iter()
            .map(|x| f32::from_bits(x.to_bits() & 0xFFFF_0000))
            .collect();
        let bits: Vec<u16> = r.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        let signed: Vec<i16> = bits.iter().map(|&b| b as i16).collect();
        let (mut ids, mut probs, mut greedy) = (vec![0; 5], vec![0.0; 5], vec![0]);
        let (mut ids2, mut probs2, mut greedy2) = (vec![0; 5], vec![0.0; 5], vec![0]);
        logits_summary(&bits, 1, 3000, 5, 1.0, &mut ids, &mut probs, &mut greedy).unwrap();
        logits_summary(
            &signed,
            1,
            3000,
            5,
            1.0,
            &mut ids2,
            &mut probs2,
            &mut greedy2,
        )
        .unwrap();
        let (want, want_probs, want_greedy) = run(&r, 5, 1.0);
        assert_eq!(
            (&ids, &probs, &greedy[0]),
            (&want, &want_probs, &want_greedy)
        );
        assert_eq!((ids2, probs2, greedy2), (ids, probs, greedy));
    }

    #[test]
    fn nan_ranks_first_and_spoils_the_probabilities() {
        let mut r = row(3, 2000, 100, 5.0);
        r[1700] = f32::NAN;
        r[900] = f32::NAN;
        let (ids, probs, greedy) = run(&r, 3, 1.0);
        assert_eq!(&ids[..2], &[900, 1700]);
        assert_eq!(greedy, 900);
        assert!(probs.iter().all(|p| p.is_nan()));
    }

    #[test]
    fn infinities_follow_torch() {
        let mut r = row(4, 1000, 100, 5.0);
        r[10] = f32::INFINITY;
        let (ids, probs, greedy) = run(&r, 2, 1.0);
        assert_eq!((ids[0], greedy), (10, 10));
        assert!(probs[0].is_nan() && probs[1] == 0.0);
        let r = vec![f32::NEG_INFINITY; 700];
        let (ids, probs, greedy) = run(&r, 2, 1.0);
        assert_eq!((ids, greedy), (vec![0, 1], 0));
        assert!(probs.iter().all(|p| p.is_nan()));
        // Some -inf among numbers: they take no mass.
        let mut r = row(5, 1000, 100, 5.0);
        r[3] = f32::NEG_INFINITY;
        let (_, probs, _) = run(&r, 1000, 1.0);
        let total: f32 = probs.iter().sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
    }

    #[test]
    fn signed_zeros_tie() {
        let (ids, _, greedy) = run(&[-0.0, 0.0, -1.0, 0.0], 2, 1.0);
        assert_eq!((ids, greedy), (vec![0, 1], 0));
    }

    #[test]
    fn portable_and_dispatched_loops_agree() {
        let r = row(8, 49152, 100_000, 30.0);
        let (ids, probs, greedy) = run(&r, 8, 1.0);
        let (mut ids2, mut probs2, mut greedy2) = (vec![0; 8], vec![0.0; 8], vec![0]);
        all_rows::<f32, Portable>(
            &r,
            r.len(),
            8,
            1.0,
            &mut ids2,
            Some(&mut probs2),
            &mut greedy2,
        );
        assert_eq!((ids, greedy), (ids2, greedy2[0]));
        for (p, q) in probs.iter().zip(&probs2) {
            assert!((p - q).abs() <= 1e-6 * q);
        }
    }

    #[test]
    fn exp_is_accurate() {
        assert_eq!(exp_nonpositive::<false>(0.0), 1.0);
        let mut x = 0.0f32;
        while x > -87.0 {
            let (got, want) = (exp_nonpositive::<false>(x), f64::from(x).exp());
            assert!(
                (f64::from(got) - want).abs() <= 3e-7 * want,
                "{x}: {got} vs {want}"
            );
            x -= 0.013;
        }
    }

    #[test]
    fn topk_alone_gives_the_summary_ids() {
        for (seed, len, k) in [(11, 49152, 8), (12, 700, 3), (13, 5, 5)] {
            let mut r = row(seed, len, 50, 10.0);
            if len > 600 {
                r[600] = f32::NAN; // NaN still ranks first
            }
            let (want, _, _) = run(&r, k, 1.0);
            let mut ids = vec![0; k];
            logits_topk(&r, 1, len, k, &mut ids).unwrap();
            assert_eq!(ids, want, "len {len} k {k}");
        }
        let bits: Vec<u16> = vec![0x3F80, 0x4000, 0xBF80, 0x4000];
        let mut ids = vec![0; 2];
        logits_topk(&bits, 1, 4, 2, &mut ids).unwrap();
        assert_eq!(ids, vec![1, 3]);
        assert!(logits_topk(&bits, 1, 4, 5, &mut [0; 5]).is_err());
        assert!(logits_topk(&bits, 2, 4, 1, &mut [0; 1]).is_err());
    }

    /// The top-k ids alone from `K`'s loops (no probabilities).
    fn topk_by<K: Kernel>(r: &[f32], k: usize) -> Vec<i64> {
        let (mut ids, mut greedy) = (vec![0; k], vec![0]);
        all_rows::<f32, K>(r, r.len(), k, 1.0, &mut ids, None, &mut greedy);
        assert_eq!(greedy[0], ids[0]);
        ids
    }

    #[test]
    fn topk_alone_matches_the_reference_on_ties_nans_and_infinities() {
        let mut cases = Vec::new();
        for (seed, len, levels) in [
            (21, 49152, 100_000),
            (22, 3001, 20),
            (23, 33, 3),
            (24, 9, 2),
        ] {
            let r = row(seed, len, levels, 10.0);
            cases.push(r.clone());
            let mut nans = r.clone();
            for at in [len / 3, len - 1, len / 7] {
                nans[at] = f32::NAN;
            }
            cases.push(nans);
            let mut inf = r;
            inf[len / 2] = f32::INFINITY;
            inf[len / 5] = f32::NEG_INFINITY;
            cases.push(inf);
        }
        cases.push(vec![f32::NEG_INFINITY; 100]);
        cases.push(vec![f32::NAN; 40]);
        // Rising values: every block offers (the threshold moves all the time).
        #[allow(clippy::cast_precision_loss)]
        cases.push((0..5000).map(|i| i as f32 * 0.5).collect());
        for r in &cases {
            for k in [1, 3, 8].into_iter().filter(|&k| k <= r.len()) {
                let want: Vec<i64> = reference(r, k, 1.0).0.iter().map(|&i| i as i64).collect();
                assert_eq!(
                    topk_by::<Portable>(r, k),
                    want,
                    "portable, len {} k {k}",
                    r.len()
                );
                #[cfg(target_arch = "x86_64")]
                if has_avx2() {
                    let mut ids = vec![0; k];
                    logits_topk(r, 1, r.len(), k, &mut ids).unwrap();
                    assert_eq!(ids, want, "avx2, len {} k {k}", r.len());
                }
            }
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let r = [1.0f32; 6];
        let (mut ids, mut probs, mut greedy) = (vec![0; 2], vec![0.0; 2], vec![0; 3]);
        for (k, scale) in [(0, 1.0), (3, 1.0), (1, 0.0), (1, f32::NAN), (1, -1.0)] {
            let (mut i, mut p) = (vec![0; 3 * k], vec![0.0; 3 * k]);
            assert!(logits_summary(&r, 3, 2, k, scale, &mut i, &mut p, &mut greedy).is_err());
        }
        assert!(logits_summary(&r, 2, 2, 1, 1.0, &mut ids, &mut probs, &mut greedy).is_err());
    }
}
