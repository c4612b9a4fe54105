/* Matrix products on GGML blocks as a GGUF file stores them (memory-mapped), and a whole decode
 * step built from them — the kernels behind a model opened from the user's own file.
 *
 * Why 8-bit activations: a 4-bit weight unpacked and multiplied in float costs more instructions
 * than the memory it saves, so a float decode step on 2 cores is compute-bound below the memory
 * roof. Quantizing the activations to int8 (per 32 values, x ≈ dx·xq, as llama.cpp does) turns
 * each 32-weight block's dot product into integer multiply-adds (AVX2 maddubs/madd: 32 products
 * in two instructions; AVX-512 VNNI's dpbusd, where the CPU has it: in one, the same integer
 * sums) and one float multiply-add. The error this adds is the activations'
 * rounding to 8 bits — the same llama.cpp makes — and tests bound it against float products.
 *
 * Activations of a row of K floats (`act_bytes(K)` bytes): xq int8[K] | dx float[K/32] | dx·Σxq
 * float[K/32] | Σ xq per 16 int16[K/16] (the last two for the offsets: stored_blocks.h). Kernels come plain and AVX2, side
 * by side (-DPLAIN_KERNELS forces the plain ones; tests compare both with the reference).
 * The prompt's products (`stored_matmul`, M tokens) share each unpacked weight block among up to
 * 8 tokens, summing their integer products into one vector (hadd transposition) scaled once.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && !defined(PLAIN_KERNELS)
#define FAST 1
#else
#define FAST 0
#endif
#if FAST && defined(__AVX512VNNI__) && defined(__AVX512VL__) && !defined(NO_VNNI)
#define VNNI 1
#else
#define VNNI 0
#endif

#include "stored_blocks.h"

/* The decode kernels ask for the weights PREFETCH bytes ahead of the block they multiply: one
 * core's stream then overlaps its memory latency with its arithmetic (bench/stored_gemv.py: the
 * hardware prefetcher alone leaves a single thread well below a plain read's speed). */
#ifndef PREFETCH
#define PREFETCH 4608
#endif
static inline void prefetch_ahead(const uint8_t* p, int64_t bytes) {
  for (int64_t l = 0; l < bytes; l += 64) __builtin_prefetch(p + PREFETCH + l, 0, 3);
}

#define TILE 8 /* tokens sharing an unpacked weight block in stored_matmul */

/* One rounding of the activations (a "view"): xq int8[K] | dx float[K/32] | dx·Σxq float[K/32] |
 * Σxq per 16 int16[K/16]. Two views follow each other: scales per 32 values (for the 32-weight
 * formats, as llama.cpp's Q8_0 / Q8_1) and, where K is a multiple of 256, one scale per 256 (for
 * the K-quants, as llama.cpp's Q8_K: dx is then the same for a super-block's eight blocks, so
 * their integer sums add up before a single float multiply). */
static inline int64_t view_bytes(int64_t K) { return K + K / 8 + K / 8 + K / 8; }
int64_t act_bytes(int64_t K) { return view_bytes(K) * (K % 256 ? 1 : 2); }
static inline int is_k_type(int64_t t) { return type_block_weights(t) == 256; }
static inline int is_x8_type(int64_t t) { return stored_type(t) != t; }
/* The view a type's kernels read. */
static inline const uint8_t* act_view(int64_t t, const uint8_t* a, int64_t K) {
  return is_k_type(t) ? a + view_bytes(K) : a;
}
static inline float* act_dx(const uint8_t* a, int64_t K) { return (float*)(a + K); }
static inline float* act_ds(const uint8_t* a, int64_t K) { return (float*)(a + K + K / 8); }
static inline int16_t* act_s16(const uint8_t* a, int64_t K) {
  return (int16_t*)(a + K + K / 4);
}

#if FAST
#include <immintrin.h>
/* max |x| over n (a multiple of 8) values. */
static inline float abs_max(const float* x, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int64_t l = 0; l < n; l += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + l)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* 32 values × id rounded to the nearest integer (ties to even, as nearbyintf) → 32 int8 at q,
 * and the sums of each 16 at s16. */
static inline void round_block(const float* x, float id, int8_t* q, int16_t* s16) {
  const __m256 m = _mm256_set1_ps(id);
  __m256i i[4];
  for (int k = 0; k < 4; ++k)
    i[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), m),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (int g = 0; g < 2; ++g) {
    const __m256i t = _mm256_add_epi32(i[2 * g], i[2 * g + 1]);
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    s16[g] = (int16_t)_mm_cvtsi128_si32(h);
  }
  /* packs interleave the 128-bit lanes: the permute puts the 8 groups of 4 back in order */
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]),
                                       _mm256_packs_epi32(i[2], i[3]));
  _mm256_storeu_si256((__m256i*)q,
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#else
static inline float abs_max(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t l = 0; l < n; ++l) amax = fmaxf(amax, fabsf(x[l]));
  return amax;
}
#endif

/* Blocks [j0, j1) (32 values each) of x (K floats) → one view at `a`, G values a scale:
 * dx = max|x| / 127, xq = round(x / dx). */
static void quantize_blocks(const float* x, int64_t K, int64_t G, uint8_t* a, int64_t j0,
                            int64_t j1) {
  int8_t* q = (int8_t*)a;
  float* dx = act_dx(a, K);
  int16_t* s16 = act_s16(a, K);
  float* ds = act_ds(a, K);
  float d = 0.0f, id = 0.0f;
  for (int64_t j = j0; j < j1; ++j) {
    if ((32 * j) % G == 0) {
      const float amax = abs_max(x + 32 * j, G);
      d = amax / 127.0f;  /* llama.cpp's Q8_0 inverts d; its Q8_K divides 127 by the max */
      id = !d ? 0.0f : G == 32 ? 1.0f / d : 127.0f / amax;
    }
    dx[j] = d;
#if FAST
    round_block(x + 32 * j, id, q + 32 * j, s16 + 2 * j);
#else
    for (int g = 0; g < 2; ++g) {
      int sum = 0;
      for (int l = 16 * g; l < 16 * g + 16; ++l) {
        q[32 * j + l] = (int8_t)nearbyintf(x[32 * j + l] * id);
        sum += q[32 * j + l];
      }
      s16[2 * j + g] = (int16_t)sum;
    }
#endif
    ds[j] = d * (s16[2 * j] + s16[2 * j + 1]);
  }
}

static void quantize_view(const float* x, int64_t K, int64_t G, uint8_t* a) {
  quantize_blocks(x, K, G, a, 0, K / 32);
}

/* This thread's share (tid of nt) of x (K floats) → both views at `a` (act_bytes(K) bytes):
 * whole groups of 256 values where K has them, so each scale's group stays in one thread. */
static void quantize_share(const float* x, int64_t K, uint8_t* a, int tid, int nt) {
  const int64_t per = K % 256 ? 1 : 8, groups = K / 32 / per;
  const int64_t j0 = groups * tid / nt * per, j1 = groups * (tid + 1) / nt * per;
  quantize_blocks(x, K, 32, a, j0, j1);
  if (K % 256 == 0) quantize_blocks(x, K, 256, a + view_bytes(K), j0, j1);
}

/* x (K floats) → both views at `a` (act_bytes(K) bytes). */
void quantize_act(const float* x, int64_t K, uint8_t* a) { quantize_share(x, K, a, 0, 1); }

/* Plain: Σ_blocks a·dx·Σ s·c·xq (integer inner sums) + Σ_16 o·dx·S16 (the offsets). */
static float dot_plain(int64_t t, const uint8_t* row, const uint8_t* act, int64_t K) {
  const int8_t* xq = (const int8_t*)act;
  const float* dx = act_dx(act, K);
  const int16_t* s16 = act_s16(act, K);
  uint8_t c[32];
  float a, o[2], sum = 0.0f;
  int16_t s[2];
  for (int64_t j = 0; j < K / 32; ++j) {
    unpack32(t, row, j, c, &a, s, o);
    int32_t isum = 0;
    for (int g = 0; g < 2; ++g) {
      /* signed codes (Q8_0) and unsigned ones in loops of their own: GCC 12 at -march=native
       * on an AVX-512 VNNI CPU vectorized the one loop that chose per element wrongly (Q8_0
       * rows came out with the wrong sums; tests/test_gguf_stored_kernels.py caught it) */
      int32_t part = 0;
      if (t == T_Q8_0) {
        const int8_t* cs = (const int8_t*)c;
        for (int l = 16 * g; l < 16 * g + 16; ++l) part += (int32_t)cs[l] * xq[32 * j + l];
      } else {
        for (int l = 16 * g; l < 16 * g + 16; ++l) part += (int32_t)c[l] * xq[32 * j + l];
      }
      isum += s[g] * part;
    }
    sum += a * dx[j] * (float)isum + dx[j] * (o[0] * s16[2 * j] + o[1] * s16[2 * j + 1]);
  }
  return sum;
}

#if FAST
#include "stored_avx2.h"
#endif
#include "stored_rows8.h"
#include "stored_rows8k.h"
#include "stored_rows8q6.h"
#include "stored_rows8q8.h"

/* Row r of an interleaved group (8 rows of K) put back as the file stores it: the plain path
 * multiplies that by dot_plain, sharing no arithmetic with the layouts' own kernels. */
static void stored_row8(int64_t t, const uint8_t* grp, int64_t K, int r, uint8_t* row) {
  if (t == T_Q4_0X8) x8_row(grp, K, r, row);
  else if (t == T_Q8_0X8) q8x8_row(grp, K, r, row);
  else if (t == T_Q4_KX8) k8_row(grp, K, r, row);
  else q6k8_row(grp, K, r, row);
}

/* Rows [lo, hi) of n for thread tid of nt: whole groups of 8 where n has them (an interleaved
 * matrix's rows are read 8 at a time; any other type reads the same split). */
static inline void split_rows(int64_t n, int tid, int nt, int64_t* lo, int64_t* hi) {
  const int64_t g = n % 8 ? 1 : 8;
  *lo = n / g * tid / nt * g;
  *hi = n / g * (tid + 1) / nt * g;
}

static inline float row_dot(int64_t t, const uint8_t* row, const uint8_t* act, int64_t K) {
#if FAST
  switch (t) {
    case T_Q4_0: return dot8(T_Q4_0, row, act, K);
    case T_Q8_0: return dot8(T_Q8_0, row, act, K);
    case T_Q4_1: return dot8(T_Q4_1, row, act, K);
    case T_Q5_0: return dot8(T_Q5_0, row, act, K);
    case T_Q5_1: return dot8(T_Q5_1, row, act, K);
    case T_Q4_K: return dot_q4_k(row, act, K);
    case T_Q6_K: return dot_q6_k(row, act, K);
    default: return dot_any(t, row, act, K);
  }
#else
  return dot_plain(t, row, act, K);
#endif
}

/* A float row against float x (F32, F16, BF16 weights). */
static float float_dot(int64_t t, const uint8_t* row, const float* x, int64_t K) {
  float sum = 0.0f;
  if (t == T_F32) {
    const float* w = (const float*)row;
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < K; ++k) sum += w[k] * x[k];
  } else if (t == T_F16) {
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < K; ++k) sum += f16(row + 2 * k) * x[k];
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < K; ++k) sum += bf16(row + 2 * k) * x[k];
  }
  return sum;
}

/* y[n] (+)= row n · x for rows [lo, hi) of one matrix; `act` = x quantized (unused for floats). */
static void rows_dot(int64_t t, const uint8_t* w, int64_t K, int64_t lo, int64_t hi, const float* x,
                     const uint8_t* act, float* y, int add) {
  const int64_t rb = row_bytes(t, K);
  act = act_view(t, act, K);
  if (is_x8_type(t)) { /* lo, hi: multiples of 8 (split_rows) */
    for (int64_t g = lo / 8; g < hi / 8; ++g) {
      const uint8_t* grp = w + 8 * g * rb;
#if FAST
      if (t == T_Q4_0X8) dot_x8(grp, act, K, y + 8 * g, add);
      else if (t == T_Q8_0X8) dot_q8x8(grp, act, K, y + 8 * g, add);
      else if (t == T_Q4_KX8) dot_k8(grp, act, K, y + 8 * g, add);
      else dot_q6k8(grp, act, K, y + 8 * g, add);
#else
      uint8_t row[rb];
      for (int r = 0; r < 8; ++r) { /* the row back as the file stores it, by the row kernel */
        stored_row8(t, grp, K, r, row);
        const float v = dot_plain(stored_type(t), row, act, K);
        y[8 * g + r] = add ? y[8 * g + r] + v : v;
      }
#endif
    }
    return;
  }
  for (int64_t n = lo; n < hi; ++n) {
    const uint8_t* row = w + n * rb;
    const float v = is_float_type(t) ? float_dot(t, row, x, K) : row_dot(t, row, act, K);
    y[n] = add ? y[n] + v : v;
  }
}

/* Y (M, N) = X (M, K) · Wᵀ, W (N, K) stored rows of type t; `work` holds matmul_work_bytes.
 * The prompt's products: each thread takes a range of rows, CHUNK rows at a time, and runs every
 * token through them while they sit in its cache, so the weights are read from memory once. */
#define CHUNK 16
void stored_matmul(const uint8_t* w, int64_t t, int64_t N, int64_t K, const float* x, int64_t M,
                   float* y, int threads, uint8_t* work) {
  const int64_t ab = act_bytes(K), J = K / 32;
  const int quantized = !is_float_type(t);
  float* dxt = (float*)(work + M * ab); /* per tile of TILE tokens: [J][TILE] dx, dx·S16 ×2 */
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    if (quantized) {
#pragma omp for schedule(static)
      for (int64_t m = 0; m < M; ++m)  /* only the view this type reads */
        quantize_view(x + m * K, K, is_k_type(t) ? 256 : 32,
                      (uint8_t*)act_view(t, work + m * ab, K));
#pragma omp for schedule(static)
      for (int64_t m0 = 0; m0 < M - M % TILE; m0 += TILE) {
        float* d = dxt + m0 * J * 3;
        for (int64_t j = 0; j < J; ++j)
          for (int i = 0; i < TILE; ++i) {
            const uint8_t* ai = act_view(t, work + (m0 + i) * ab, K);
            d[j * TILE + i] = act_dx(ai, K)[j];
            d[(J + j) * TILE + i] = act_dx(ai, K)[j] * act_s16(ai, K)[2 * j];
            d[(2 * J + j) * TILE + i] = act_dx(ai, K)[j] * act_s16(ai, K)[2 * j + 1];
          }
      }
    }
    int64_t lo, hi;
    split_rows(N, tid, nt, &lo, &hi);
    for (int64_t r0 = lo; r0 < hi; r0 += CHUNK) {
      const int64_t r1 = hi - r0 < CHUNK ? hi : r0 + CHUNK;
      for (int64_t m0 = 0; m0 < M; m0 += TILE) {
        const int64_t mt = M - m0 < TILE ? M - m0 : TILE;
#if FAST
        if (quantized && mt == TILE) {
          const float* d = dxt + m0 * J * 3;
          const uint8_t* a0 = act_view(t, work + m0 * ab, K);
          switch (t) {
            case T_Q4_0: tile_rows(T_Q4_0, w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            case T_Q4_0X8: tile_x8(w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            case T_Q8_0X8: tile_q8x8(w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            case T_Q4_KX8: tile_k8(w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            case T_Q6_KX8: tile_q6k8(w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            case T_Q8_0: tile_rows(T_Q8_0, w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            case T_Q4_K: tile_rows_k(T_Q4_K, w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            case T_Q6_K: tile_rows_k(T_Q6_K, w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            case T_Q4_1: tile_rows(T_Q4_1, w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            case T_Q5_0: tile_rows(T_Q5_0, w, K, r0, r1, a0, ab, d, y + m0 * N, N); break;
            default: tile_rows(t, w, K, r0, r1, a0, ab, d, y + m0 * N, N);
          }
          continue;
        }
#endif
        for (int64_t i = 0; i < mt; ++i)
          rows_dot(t, w, K, r0, r1, x + (m0 + i) * K, work + (m0 + i) * ab, y + (m0 + i) * N, 0);
      }
    }
  }
}

/* Work bytes stored_matmul needs. */
int64_t matmul_work_bytes(int64_t K, int64_t M) {
  return M * act_bytes(K) + M * (K / 32) * 3 * (int64_t)sizeof(float) + 64;
}

/* Rows `ids` (count) of a stored matrix dequantized to float32: the embedding lookup. */
void stored_rows(const uint8_t* w, int64_t t, int64_t K, const int64_t* ids, int64_t count,
                 float* out) {
  const int64_t rb = row_bytes(t, K);
  for (int64_t i = 0; i < count; ++i) dequant_row(t, w + ids[i] * rb, K, out + i * K);
}

/* One row's dot product with x by the kernel, or (plain) by the plain one: tests check both
 * against float products of the dequantized weights and activations. */
float stored_dot(const uint8_t* row, int64_t t, int64_t K, const float* x, uint8_t* act, int plain) {
  if (is_float_type(t)) return float_dot(t, row, x, K);
  quantize_act(x, K, act);
  const uint8_t* view = act_view(t, act, K);
  return plain ? dot_plain(t, row, view, K) : row_dot(t, row, view, K);
}

/* A plain read of n buffers (parts[i], bytes[i] bytes, whole 64-byte lines) with the step's
 * threads, each buffer's lines split among them as the step splits its rows: the bytes one
 * decode step streams, read and nothing else. The benchmark times it right before and after a
 * decode window (the bandwidth of that moment, for MBU on a VM whose bandwidth changes in
 * states that last seconds). The XOR of every 8 bytes comes back so nothing is optimized away. */
uint64_t stored_read(const uint8_t* const* parts, const int64_t* bytes, int64_t n, int threads) {
  uint64_t seen = 0;
#pragma omp parallel num_threads(threads) reduction(^ : seen)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    uint64_t acc[8] = {0};
    for (int64_t i = 0; i < n; ++i) {
      const int64_t lines = bytes[i] / 64;
      const uint64_t* w = (const uint64_t*)parts[i];
      for (int64_t l = lines * tid / nt; l < lines * (tid + 1) / nt; ++l)
        for (int k = 0; k < 8; ++k) acc[k] ^= w[8 * l + k];
    }
    for (int k = 0; k < 8; ++k) seen ^= acc[k];
  }
  return seen;
}

#include "stored_step.h"
