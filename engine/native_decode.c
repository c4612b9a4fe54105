/* One decode step of a Llama-family model on the CPU, written out by hand (llama.cpp style).
 *
 * Why: a decode step reads every weight once to produce one token, so its speed is set by how
 * close the matrix-vector products get to the memory roof. Library kernels are tuned for
 * matrices with many rows; here each weight matrix arrives packed in BLOCK-row blocks laid out
 * k-major ([block][k][BLOCK]), so a block is one sequential stream, x[k] is broadcast, and BLOCK
 * accumulators stay in vector registers (no horizontal sums). The plain loops are vectorized by
 * the compiler for whatever this CPU has (-march=native); hand-written AVX-512 intrinsics
 * measured no faster. All steps of the forward run inside one
 * OpenMP parallel region with barriers between dependent phases: no per-op dispatch at all.
 *
 * Layout of `w` (fp32, built by engine/native.py): per layer
 *   in_norm[H] | qkv[Nqkv/B][H][B] | o[H/B][Q][B] | post_norm[H] | gate_up[I/B][2][H][B]
 *   | down[H/B][I][B]
 * then final_norm[H] | lm_head[Vp/B][H][B], where B = BLOCK, Q = heads·head_dim,
 * Nqkv = (heads + 2·kv_heads)·head_dim, I = intermediate size, Vp = vocab rounded up to B.
 * gate_up interleaves each block of gate with the same block of up, so one thread computes
 * silu(gate)·up for its rows without another barrier.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef BLOCK
#define BLOCK 32 /* rows per packed block; engine/native.py passes -DBLOCK */
#endif

typedef struct {
  int64_t layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_tokens;
  float eps, scale;
} Config;

static void split(int64_t n, int t, int T, int64_t* lo, int64_t* hi) {
  *lo = n * t / T;
  *hi = n * (t + 1) / T;
}

/* acc (BLOCK) = packed block (K, BLOCK) · x (K) */
static inline void block_dot(const float* restrict p, const float* restrict x, int64_t K,
                             float* restrict acc) {
  float a[BLOCK];
  for (int j = 0; j < BLOCK; ++j) a[j] = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const float xk = x[k];
#pragma omp simd
    for (int j = 0; j < BLOCK; ++j) a[j] += p[j] * xk;
    p += BLOCK;
  }
  memcpy(acc, a, sizeof(a));
}

enum { STORE, ADD };

/* y = W x (STORE) or y += W x (ADD) over this thread's share of the blocks; rows ≥ n dropped. */
static void gemv(const float* w, const float* x, float* y, int64_t n, int64_t K, int mode,
                 int t, int T) {
  int64_t lo, hi;
  split((n + BLOCK - 1) / BLOCK, t, T, &lo, &hi);
  float acc[BLOCK];
  for (int64_t b = lo; b < hi; ++b) {
    block_dot(w + b * K * BLOCK, x, K, acc);
    const int64_t r0 = b * BLOCK, rows = n - r0 < BLOCK ? n - r0 : BLOCK;
    for (int64_t j = 0; j < rows; ++j) y[r0 + j] = mode == ADD ? y[r0 + j] + acc[j] : acc[j];
  }
}

/* act = silu(gate x) · (up x) for this thread's blocks of the interleaved gate/up matrix. */
static void gate_up(const float* w, const float* x, float* act, int64_t inter, int64_t K, int t,
                    int T) {
  int64_t lo, hi;
  split(inter / BLOCK, t, T, &lo, &hi);
  float g[BLOCK], u[BLOCK];
  for (int64_t b = lo; b < hi; ++b) {
    block_dot(w + (2 * b) * K * BLOCK, x, K, g);
    block_dot(w + (2 * b + 1) * K * BLOCK, x, K, u);
    for (int j = 0; j < BLOCK; ++j) act[b * BLOCK + j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  }
}

static void rms_norm(const float* x, const float* weight, float* out, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  const float inv = 1.0f / sqrtf((float)(ss / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

/* HF rotate_half convention: v·cos + rotate_half(v)·sin, rotate_half(v) = (−v2, v1). */
static void rope(float* v, const float* cos_row, const float* sin_row, int64_t d) {
  const int64_t half = d / 2;
  float tmp[512];
  for (int64_t i = 0; i < d; ++i) {
    const float rot = i < half ? -v[i + half] : v[i - half];
    tmp[i] = v[i] * cos_row[i] + rot * sin_row[i];
  }
  memcpy(v, tmp, d * sizeof(float));
}

/* One query head against positions 0..pos of its key/value head. */
static void attend(const float* q, const float* keys, const float* values, int64_t pos,
                   int64_t d, float scale, float* scores, float* out) {
  float top = -INFINITY;
  for (int64_t s = 0; s <= pos; ++s) {
    float dot = 0.0f;
    for (int64_t i = 0; i < d; ++i) dot += q[i] * keys[s * d + i];
    scores[s] = dot * scale;
    if (scores[s] > top) top = scores[s];
  }
  float total = 0.0f;
  for (int64_t s = 0; s <= pos; ++s) total += (scores[s] = expf(scores[s] - top));
  for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
  for (int64_t s = 0; s <= pos; ++s) {
    const float p = scores[s] / total;
    for (int64_t i = 0; i < d; ++i) out[i] += p * values[s * d + i];
  }
}

/* Size of the packed weights for `c`, in floats: Python sizes its buffer with this formula. */
int64_t packed_floats(const Config* c) {
  const int64_t h = c->hidden, q = c->heads * c->head_dim;
  const int64_t nqkv = (c->heads + 2 * c->kv_heads) * c->head_dim;
  const int64_t vp = (c->vocab + BLOCK - 1) / BLOCK * BLOCK;
  const int64_t layer = h + nqkv * h + h * q + h + 2 * c->inter * h + h * c->inter;
  return c->layers * layer + h + vp * h;
}

/* Writes K/V of `token` at `pos` into the caches ([layers][kv_heads][max_tokens][head_dim]) and
 * the logits (vocab) of the next token. Returns 0, or −1 when scratch memory is unavailable. */
int decode_step(const Config* c, const float* w, const float* embed, const float* cos_table,
                const float* sin_table, float* k_cache, float* v_cache, int64_t token,
                int64_t pos, float* logits, int threads) {
  const int64_t h = c->hidden, d = c->head_dim, q = c->heads * d, kvd = c->kv_heads * d;
  const int64_t nqkv = q + 2 * kvd, group = c->heads / c->kv_heads, T = c->max_tokens;
  const int64_t layer_floats = h + nqkv * h + h * q + h + 2 * c->inter * h + h * c->inter;
  float* scratch = malloc(sizeof(float) * (2 * h + nqkv + q + c->inter + c->heads * T));
  if (!scratch) return -1;
  float *x = scratch, *xn = x + h, *qkv = xn + h, *att = qkv + nqkv, *act = att + q;
  float* scores = act + c->inter;
  const float* cos_row = cos_table + pos * d;
  const float* sin_row = sin_table + pos * d;
  memcpy(x, embed + token * h, h * sizeof(float));

#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    for (int64_t l = 0; l < c->layers; ++l) {
      const float* in_norm = w + l * layer_floats;
      const float* wqkv = in_norm + h;
      const float* wo = wqkv + nqkv * h;
      const float* post_norm = wo + h * q;
      const float* wgu = post_norm + h;
      const float* wdown = wgu + 2 * c->inter * h;
      float* kc = k_cache + l * c->kv_heads * T * d;
      float* vc = v_cache + l * c->kv_heads * T * d;
#pragma omp single
      rms_norm(x, in_norm, xn, h, c->eps);
      gemv(wqkv, xn, qkv, nqkv, h, STORE, t, nt);
#pragma omp barrier
#pragma omp single
      {
        for (int64_t i = 0; i < c->heads; ++i) rope(qkv + i * d, cos_row, sin_row, d);
        for (int64_t i = 0; i < c->kv_heads; ++i) {
          rope(qkv + q + i * d, cos_row, sin_row, d);
          memcpy(kc + (i * T + pos) * d, qkv + q + i * d, d * sizeof(float));
          memcpy(vc + (i * T + pos) * d, qkv + q + kvd + i * d, d * sizeof(float));
        }
      }
      int64_t lo, hi;
      split(c->heads, t, nt, &lo, &hi);
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t kv = i / group;
        attend(qkv + i * d, kc + kv * T * d, vc + kv * T * d, pos, d, c->scale, scores + i * T,
               att + i * d);
      }
#pragma omp barrier
      gemv(wo, att, x, h, q, ADD, t, nt);
#pragma omp barrier
#pragma omp single
      rms_norm(x, post_norm, xn, h, c->eps);
      gate_up(wgu, xn, act, c->inter, h, t, nt);
#pragma omp barrier
      gemv(wdown, act, x, h, c->inter, ADD, t, nt);
#pragma omp barrier
    }
    const float* final_norm = w + c->layers * layer_floats;
#pragma omp single
    rms_norm(x, final_norm, xn, h, c->eps);
    gemv(final_norm + h, xn, logits, c->vocab, h, STORE, t, nt);
  }
  free(scratch);
  return 0;
}
