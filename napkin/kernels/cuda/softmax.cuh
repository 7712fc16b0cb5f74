// softmax.cuh — the online (streamed) softmax, in base 2.
//
// Scores are scaled once by scale * log2(e) (softmax_scale_log2), so that every exponential is a
// single exp2f: softmax(scale * s)_j = exp2(x_j - m) / sum_k exp2(x_k - m) with x = s * scale_log2.
// A row whose scores so far are all -inf (fully masked) keeps m = -inf; its offset is taken as 0,
// so exp2(-inf - 0) = 0 and no (-inf) - (-inf) = NaN appears; its sum stays 0, and the final
// normalisation turns 0 / 0 into 0, not NaN.
//
// Provides:
//   LOG2E, softmax_scale_log2(scale)
//   softmax_offset(m)                   m, or 0 when m = -inf
//   OnlineSoftmax                       one row's running max m and sum l: init, update_max
//                                       (returns the rescale factor exp2(m_old - m_new)), add,
//                                       offset, inv_sum, lse (natural-log log-sum-exp)
//   SoftmaxTile<M>                      the running state of the M rows of an mma tile
//   online_softmax_step(st, s, scale_log2, o)
//                                       folds a score tile into the state: s becomes the
//                                       unnormalised probabilities exp2(s scale_log2 - m_new) and
//                                       the output accumulator o is rescaled by exp2(m_old - m_new)
//   online_softmax_finish(st, o)        divides o by the row sums (0 for fully masked rows)
//   mask_cols(s, cols)                  sets scores in tile columns >= cols to -inf
#ifndef NAPKIN_SOFTMAX_CUH
#define NAPKIN_SOFTMAX_CUH

#include "types.cuh"
#include "reduce.cuh"
#include "mma.cuh"

namespace napkin {

// LOG2E and LN2: reduce.cuh

// The factor that turns raw scores into base-2 exponents: softmax(scale * s) uses exp2(s * this).
NAPKIN_DEVICE float softmax_scale_log2(float scale) { return scale * LOG2E; }

// The value subtracted before exponentiating: the running max, or 0 while it is -inf.
NAPKIN_DEVICE float softmax_offset(float m) { return m == neg_inf() ? 0.f : m; }

// Running state of one softmax row; values are in base-2 units (already times scale * log2 e).
struct OnlineSoftmax {
  float m;  // running max
  float l;  // running sum of exp2(x - softmax_offset(m))

  NAPKIN_DEVICE void init() {
    m = neg_inf();
    l = 0.f;
  }
  // Takes a new chunk's max into the running max and rescales the running sum; returns the
  // factor exp2(m_old - m_new) by which anything accumulated so far (such as an output row) must
  // be multiplied.
  NAPKIN_DEVICE float update_max(float chunk_max) {
    const float m_new = fmaxf(m, chunk_max);
    const float alpha = exp2f(m - softmax_offset(m_new));
    m = m_new;
    l *= alpha;
    return alpha;
  }
  // What to subtract from x before exp2 for the current chunk.
  NAPKIN_DEVICE float offset() const { return softmax_offset(m); }
  // Adds the chunk's sum of exp2(x - offset()).
  NAPKIN_DEVICE void add(float chunk_sum) { l += chunk_sum; }
  // 1 / l, or 0 for a row with nothing unmasked.
  NAPKIN_DEVICE float inv_sum() const { return l > 0.f ? 1.f / l : 0.f; }
  // log(sum exp(scale * s)) in natural units; -inf for a fully masked row.
  NAPKIN_DEVICE float lse() const { return l > 0.f ? (m + log2f(l)) * LN2 : neg_inf(); }
};

// Running state of the M rows of an accumulator tile; row[i][h] is tile row 16 i + g + 8 h.
template <int M>
struct SoftmaxTile {
  OnlineSoftmax row[M / 16][2];

  NAPKIN_DEVICE void init() {
#pragma unroll
    for (int i = 0; i < M / 16; ++i) {
      row[i][0].init();
      row[i][1].init();
    }
  }
};

// Sets the scores of tile columns >= cols to -inf (the keys past the end of the sequence).
template <int M, int N>
NAPKIN_DEVICE void mask_cols(TileC<M, N>& s, int cols) {
  for_each(s, [cols](int, int col, float& v) {
    if (col >= cols) v = neg_inf();
  });
}

// One streaming step: s (raw scores, -inf where masked) becomes exp2(s * scale_log2 - m_new),
// the row states take in the chunk, and o is rescaled by exp2(m_old - m_new) row by row.
// scale_log2 must be positive.
template <int M, int N, int D>
NAPKIN_DEVICE void online_softmax_step(SoftmaxTile<M>& st, TileC<M, N>& s, float scale_log2,
                                       TileC<M, D>& o) {
  scale(s, scale_log2);
  float mx[M / 16][2];
  row_max(mx, s);
  float alpha[M / 16][2];
  float offset[M / 16][2];
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      alpha[i][h] = st.row[i][h].update_max(mx[i][h]);
      offset[i][h] = st.row[i][h].offset();
    }
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float& x = s.f[i][j].x[e];
        x = exp2f(x - offset[i][(e >> 1) & 1]);
      }
  float sum[M / 16][2];
  row_sum(sum, s);
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) st.row[i][h].add(sum[i][h]);
  scale_rows(o, alpha);
}

// Normalises the output accumulator by the row sums (rows with nothing unmasked become 0).
template <int M, int D>
NAPKIN_DEVICE void online_softmax_finish(const SoftmaxTile<M>& st, TileC<M, D>& o) {
  float inv[M / 16][2];
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) inv[i][h] = st.row[i][h].inv_sum();
  scale_rows(o, inv);
}

}  // namespace napkin

#endif  // NAPKIN_SOFTMAX_CUH
