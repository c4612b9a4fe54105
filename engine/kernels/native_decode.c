/* One decode step of a Llama-family model on the CPU, written out by hand (llama.cpp style).
 *
 * Why: a decode step reads every weight once to produce one token, so its speed is set by how
 * close the matrix-vector products get to the memory roof. Library kernels are tuned for
 * matrices with many rows; here each weight matrix arrives packed in BLOCK-row blocks laid out
 * k-major ([block][k][BLOCK]), so a block is one sequential stream, x[k] is broadcast, and BLOCK
 * accumulators stay in vector registers (no horizontal sums). The float32 loops are vectorized
 * by the compiler for whatever this CPU has (-march=native); hand-written AVX-512 intrinsics
 * measured no faster for them (unlike the quantized formats, below). All steps of the forward run inside one OpenMP parallel region with
 * barriers between dependent phases: no per-op dispatch at all.
 *
 * The weights `w` (packed by engine/kernels/native_pack.py) are a sequence of parts whose order,
 * shapes and byte offsets `layout()` there computes once; they arrive here as `off`: part p of layer l
 * starts at w + off[l * LAYER_PARTS + p], the final norm and the LM head at
 * w + off[layers * LAYER_PARTS + FINAL_NORM / LM_HEAD]. Norms are float32. Every matrix is stored
 * in BLOCK-row blocks; gate_up interleaves each block of gate with the same block of up, so one
 * thread computes silu(gate)·up for its rows without another barrier. Inside a block:
 * - F32: [k][BLOCK] floats, k-major;
 * - Q8 / Q4_0 / Q4_1 (codes of a group of G consecutive k, G = the format's group or the whole
 *   row): per group [codes][BLOCK float16 scales d][BLOCK float16 minimums m, Q4_1 only]; codes
 *   are [k][BLOCK] int8 (Q8: value d·c) or [k/2][BLOCK] bytes holding k even in the low nibble
 *   and k odd in the high one (Q4_0: value d·(c − 8); Q4_1: value d·c + m). The codes are
 *   unpacked in registers: a group's Σ c·x is summed first and scaled once per row
 *   (Σ (d·c + m)·x = d·Σ c·x + m·Σ x), so the low-bit step streams 1 or ½ byte per weight.
 * The quantized kernels come twice, side by side: plain loops any compiler vectorizes
 * (block_dot_q) and the same sums written with AVX-512 intrinsics (block_dot_q_avx512), used
 * where the CPU has them (-DPLAIN_KERNELS forces the plain ones; tests run both). Both prefetch
 * PREFETCH bytes ahead: with ¼ or ⅛ of the bytes per weight, the hardware prefetcher alone
 * left them at half the read bandwidth.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#ifndef BLOCK
#define BLOCK 32 /* rows per packed block; engine/kernels/native.py passes -DBLOCK */
#endif
#ifndef MAX_HEAD_DIM
#define MAX_HEAD_DIM 512 /* largest head_dim rope() holds on its stack; passed as -DMAX_HEAD_DIM */
#endif

/* Weight formats of a matrix part (engine/kernels/native_pack.py format_code). */
enum { F32, Q8, Q4_0, Q4_1 };
#ifndef MAX_GROUPS
#define MAX_GROUPS 4096 /* groups per row a quantized gemv sums x over; passed as -DMAX_GROUPS */
#endif
#ifndef PREFETCH
#define PREFETCH 16384 /* bytes ahead the quantized kernels prefetch (see group_dot) */
#endif

/* The parts of one layer, in the order of LAYER_PARTS in engine/kernels/native_pack.py, then the
 * final ones. */
enum { IN_NORM, QKV, O, POST_NORM, GATE_UP, DOWN, LAYER_PARTS };
enum { FINAL_NORM, LM_HEAD };

typedef struct {
  int64_t layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_tokens;
  int64_t layer_format, layer_group, head_format, head_group; /* group 0: one group per row */
  float eps, scale;
} Config;

typedef struct {
  int64_t format, group;
} Fmt;

/* A stored float16 (IEEE binary16) as float, by bit arithmetic: no _Float16 type, which older
 * compilers lack. The exponent and mantissa move into float32's fields and a multiply by 2^112
 * rebiases the exponent (15 → 127), which also makes subnormal halves exact; all-ones exponents
 * (inf / NaN, never stored by the quantizer) keep theirs. Branch-free, so loops vectorize. */
static inline float half_to_float(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v = {(uint32_t)(h & 0x7fffu) << 13};
  v.f *= 0x1p112f;
  if ((h & 0x7c00u) == 0x7c00u) v.u |= 0x7f800000u;
  v.u |= (uint32_t)(h & 0x8000u) << 16;
  return v.f;
}

static void split(int64_t n, int t, int T, int64_t* lo, int64_t* hi) {
  *lo = n * t / T;
  *hi = n * (t + 1) / T;
}

/* acc (BLOCK) = packed float32 block (K, BLOCK) · x (K) */
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

static inline int64_t group_of(Fmt f, int64_t K) { return f.group ? f.group : K; }

/* Bytes of one group's record: codes, then float16 scales (and minimums). */
static inline int64_t group_bytes(Fmt f, int64_t G) {
  const int64_t codes = f.format == Q8 ? G * BLOCK : G / 2 * BLOCK;
  return codes + (f.format == Q4_1 ? 4 : 2) * BLOCK;
}

/* Bytes of one BLOCK-row block of a (n, K) matrix in format f. */
static inline int64_t block_bytes(Fmt f, int64_t K) {
  if (f.format == F32) return K * BLOCK * (int64_t)sizeof(float);
  const int64_t G = group_of(f, K);
  return K / G * group_bytes(f, G);
}

/* The codes of one group times x, in float: a[j] = Σ_k c[k][j] · x[k] — the plain loops, which
 * the compiler vectorizes for any CPU. */
static inline const uint8_t* group_dot(const uint8_t* restrict p, Fmt f, const float* restrict xg,
                                       int64_t G, float* restrict a) {
  for (int j = 0; j < BLOCK; ++j) a[j] = 0.0f;
  if (f.format == Q8) {
    const int8_t* c = (const int8_t*)p;
    for (int64_t k = 0; k < G; ++k) {
      const float xk = xg[k];
      __builtin_prefetch(c + PREFETCH);
#pragma omp simd
      for (int j = 0; j < BLOCK; ++j) a[j] += (float)c[j] * xk;
      c += BLOCK;
    }
    return p + G * BLOCK;
  }
  const uint8_t* c = p;
  for (int64_t k = 0; k < G; k += 2) {
    const float x0 = xg[k], x1 = xg[k + 1];
    __builtin_prefetch(c + PREFETCH);
#pragma omp simd
    for (int j = 0; j < BLOCK; ++j) a[j] += (float)(c[j] & 15) * x0 + (float)(c[j] >> 4) * x1;
    c += BLOCK;
  }
  return p + G / 2 * BLOCK;
}

#if defined(__AVX512F__) && BLOCK == 32 && !defined(PLAIN_KERNELS)
#include <immintrin.h>
#define FAST_BLOCK_DOT 1
/* block_dot_q written out with AVX-512: 16 rows per register, codes widened straight from memory
 * (vpmovsxbd / vpmovzxbd), low and high nibbles (even and odd k) into separate accumulators so
 * each FMA chain has one add per iteration, and the float16 scales converted 16 at a time
 * (vcvtph2ps). The plain loops below compile to 16-bit widening shuffles and one scalar
 * conversion per scale, about half as fast (tests check both give the reference's logits). */
static inline void block_dot_q_avx512(const uint8_t* restrict p, Fmt f, const float* restrict x,
                                      const float* restrict sx, int64_t K, float* restrict acc) {
  const int64_t G = group_of(f, K);
  const __m512i low = _mm512_set1_epi32(15);
  __m512 t0 = _mm512_setzero_ps(), t1 = _mm512_setzero_ps();
  for (int64_t g = 0; g < K / G; ++g) {
    const float* xg = x + g * G;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (f.format == Q8) {
      for (int64_t k = 0; k < G; k += 2) {
        _mm_prefetch((const char*)p + PREFETCH, _MM_HINT_T0);
        const __m512 x0 = _mm512_set1_ps(xg[k]), x1 = _mm512_set1_ps(xg[k + 1]);
        const __m128i* c = (const __m128i*)p;
        a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c))), x0, a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c + 1))), x0,
                             a1);
        b0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c + 2))), x1,
                             b0);
        b1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c + 3))), x1,
                             b1);
        p += 2 * BLOCK;
      }
    } else {
      for (int64_t k = 0; k < G; k += 2) {
        _mm_prefetch((const char*)p + PREFETCH, _MM_HINT_T0);
        const __m512 x0 = _mm512_set1_ps(xg[k]), x1 = _mm512_set1_ps(xg[k + 1]);
        const __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
        const __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p + 1));
        a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v0, low)), x0, a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v1, low)), x0, a1);
        b0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v0, 4)), x1, b0);
        b1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v1, 4)), x1, b1);
        p += BLOCK;
      }
    }
    a0 = _mm512_add_ps(a0, b0);
    a1 = _mm512_add_ps(a1, b1);
    const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
    const __m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p + 1));
    p += 2 * BLOCK;
    if (f.format == Q4_1) {
      const __m512 s = _mm512_set1_ps(sx[g]);
      const __m512 m0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
      const __m512 m1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p + 1));
      p += 2 * BLOCK;
      t0 = _mm512_fmadd_ps(m0, s, _mm512_fmadd_ps(d0, a0, t0));
      t1 = _mm512_fmadd_ps(m1, s, _mm512_fmadd_ps(d1, a1, t1));
    } else {
      if (f.format == Q4_0) {
        const __m512 s8 = _mm512_set1_ps(8.0f * sx[g]);
        a0 = _mm512_sub_ps(a0, s8);
        a1 = _mm512_sub_ps(a1, s8);
      }
      t0 = _mm512_fmadd_ps(d0, a0, t0);
      t1 = _mm512_fmadd_ps(d1, a1, t1);
    }
  }
  _mm512_storeu_ps(acc, t0);
  _mm512_storeu_ps(acc + 16, t1);
}
#endif

/* acc (BLOCK) = a quantized block · x; sx[g] = Σ x over group g (for Q4's offsets). */
static inline void block_dot_q(const uint8_t* restrict p, Fmt f, const float* restrict x,
                               const float* restrict sx, int64_t K, float* restrict acc) {
  const int64_t G = group_of(f, K);
  float total[BLOCK];
  for (int j = 0; j < BLOCK; ++j) total[j] = 0.0f;
  for (int64_t g = 0; g < K / G; ++g) {
    float a[BLOCK];
    p = group_dot(p, f, x + g * G, G, a);
    const uint16_t* d = (const uint16_t*)p;
    p += 2 * BLOCK;
    if (f.format == Q4_1) {
      const uint16_t* m = (const uint16_t*)p;
      p += 2 * BLOCK;
#pragma omp simd
      for (int j = 0; j < BLOCK; ++j)
        total[j] += half_to_float(d[j]) * a[j] + half_to_float(m[j]) * sx[g];
    } else if (f.format == Q4_0) {
#pragma omp simd
      for (int j = 0; j < BLOCK; ++j) total[j] += half_to_float(d[j]) * (a[j] - 8.0f * sx[g]);
    } else {
#pragma omp simd
      for (int j = 0; j < BLOCK; ++j) total[j] += half_to_float(d[j]) * a[j];
    }
  }
  memcpy(acc, total, sizeof(total));
}

/* sx[g] = Σ x over each group of G (K / G of them). */
static void group_sums(const float* x, int64_t K, int64_t G, float* sx) {
  for (int64_t g = 0; g < K / G; ++g) {
    float s = 0.0f;
    for (int64_t k = 0; k < G; ++k) s += x[g * G + k];
    sx[g] = s;
  }
}

/* acc = block b of a matrix in format f, times x. */
static inline void any_block_dot(const uint8_t* w, Fmt f, int64_t b, const float* x,
                                 const float* sx, int64_t K, float* acc) {
  const uint8_t* p = w + b * block_bytes(f, K);
  if (f.format == F32)
    block_dot((const float*)p, x, K, acc);
  else
#ifdef FAST_BLOCK_DOT
    block_dot_q_avx512(p, f, x, sx, K, acc);
#else
    block_dot_q(p, f, x, sx, K, acc);
#endif
}

enum { STORE, ADD };

/* y = W x (STORE) or y += W x (ADD) over this thread's share of the blocks; rows ≥ n dropped. */
static void gemv(const uint8_t* w, Fmt f, const float* x, float* y, int64_t n, int64_t K, int mode,
                 int t, int T) {
  int64_t lo, hi;
  split((n + BLOCK - 1) / BLOCK, t, T, &lo, &hi);
  float acc[BLOCK], sx[MAX_GROUPS];
  if (f.format != F32) group_sums(x, K, group_of(f, K), sx);
  for (int64_t b = lo; b < hi; ++b) {
    any_block_dot(w, f, b, x, sx, K, acc);
    const int64_t r0 = b * BLOCK, rows = n - r0 < BLOCK ? n - r0 : BLOCK;
    for (int64_t j = 0; j < rows; ++j) y[r0 + j] = mode == ADD ? y[r0 + j] + acc[j] : acc[j];
  }
}

/* act = silu(gate x) · (up x) for this thread's blocks of the interleaved gate/up matrix. */
static void gate_up(const uint8_t* w, Fmt f, const float* x, float* act, int64_t inter, int64_t K,
                    int t, int T) {
  int64_t lo, hi;
  split(inter / BLOCK, t, T, &lo, &hi);
  float g[BLOCK], u[BLOCK], sx[MAX_GROUPS];
  if (f.format != F32) group_sums(x, K, group_of(f, K), sx);
  for (int64_t b = lo; b < hi; ++b) {
    any_block_dot(w, f, 2 * b, x, sx, K, g);
    any_block_dot(w, f, 2 * b + 1, x, sx, K, u);
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
  float tmp[MAX_HEAD_DIM];
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
    const float p = scores[s] /= total; /* the softmax row stays in `scores` for recording */
    for (int64_t i = 0; i < d; ++i) out[i] += p * values[s * d + i];
  }
}

/* The step's working memory, carved from one buffer the caller allocates once per decoder. */
typedef struct {
  float *x, *xn, *qkv, *att, *act, *scores;
} Scratch;

/* Points `s` into `base` (NULL: sizes only) and returns the floats the step uses. */
static int64_t carve(const Config* c, float* base, Scratch* s) {
  const int64_t sizes[] = {c->hidden, c->hidden, (c->heads + 2 * c->kv_heads) * c->head_dim,
                           c->heads * c->head_dim, c->inter, c->heads * c->max_tokens};
  float** slots[] = {&s->x, &s->xn, &s->qkv, &s->att, &s->act, &s->scores};
  int64_t used = 0;
  for (int i = 0; i < 6; ++i) {
    *slots[i] = base ? base + used : NULL;
    used += sizes[i];
  }
  return used;
}

/* Floats of scratch memory `decode_step` needs for `c`: Python allocates it once. */
int64_t scratch_floats(const Config* c) {
  Scratch s;
  return carve(c, NULL, &s);
}

/* Writes K/V of `token` at `pos` into the caches ([layers][kv_heads][max_tokens][head_dim]) and
 * the logits (vocab) of the next token. `scratch` holds scratch_floats(c) floats.
 * Recording (each may be NULL): `rec_slot[l]` ≥ 0 marks layer l as recorded into slot
 * rec_slot[l] of `rec_attn` ([slots][heads][max_tokens]: the new token's softmax row over
 * positions 0..pos); `rec_hidden` ([layers + 1][hidden]) gets the residual stream: the input of
 * every layer, then the last layer's output before the final norm (as engine/forward.py records). */
void decode_step(const Config* c, const uint8_t* w, const int64_t* off, const float* embed,
                 const float* cos_table, const float* sin_table, float* k_cache, float* v_cache,
                 int64_t token, int64_t pos, float* scratch, float* logits, int threads,
                 const int64_t* rec_slot, float* rec_attn, float* rec_hidden) {
  const int64_t h = c->hidden, d = c->head_dim, q = c->heads * d, kvd = c->kv_heads * d;
  const int64_t nqkv = q + 2 * kvd, group = c->heads / c->kv_heads, T = c->max_tokens;
  const Fmt lf = {c->layer_format, c->layer_group}, hf = {c->head_format, c->head_group};
  Scratch s;
  carve(c, scratch, &s);
  float *x = s.x, *xn = s.xn, *qkv = s.qkv, *att = s.att, *act = s.act, *scores = s.scores;
  const float* cos_row = cos_table + pos * d;
  const float* sin_row = sin_table + pos * d;
  memcpy(x, embed + token * h, h * sizeof(float));

#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    for (int64_t l = 0; l < c->layers; ++l) {
      const int64_t* part = off + l * LAYER_PARTS;
      const float* in_norm = (const float*)(w + part[IN_NORM]);
      const float* post_norm = (const float*)(w + part[POST_NORM]);
      const uint8_t *wqkv = w + part[QKV], *wo = w + part[O], *wgu = w + part[GATE_UP];
      const uint8_t* wdown = w + part[DOWN];
      const int64_t slot = rec_slot && rec_attn ? rec_slot[l] : -1;
      float* kc = k_cache + l * c->kv_heads * T * d;
      float* vc = v_cache + l * c->kv_heads * T * d;
#pragma omp single
      {
        if (rec_hidden) memcpy(rec_hidden + l * h, x, h * sizeof(float));
        rms_norm(x, in_norm, xn, h, c->eps);
      }
      gemv(wqkv, lf, xn, qkv, nqkv, h, STORE, t, nt);
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
        if (slot >= 0)
          memcpy(rec_attn + (slot * c->heads + i) * T, scores + i * T, (pos + 1) * sizeof(float));
      }
#pragma omp barrier
      gemv(wo, lf, att, x, h, q, ADD, t, nt);
#pragma omp barrier
#pragma omp single
      rms_norm(x, post_norm, xn, h, c->eps);
      gate_up(wgu, lf, xn, act, c->inter, h, t, nt);
#pragma omp barrier
      gemv(wdown, lf, act, x, h, c->inter, ADD, t, nt);
#pragma omp barrier
    }
    const int64_t* final = off + c->layers * LAYER_PARTS;
#pragma omp single
    {
      if (rec_hidden) memcpy(rec_hidden + c->layers * h, x, h * sizeof(float));
      rms_norm(x, (const float*)(w + final[FINAL_NORM]), xn, h, c->eps);
    }
    gemv(w + final[LM_HEAD], hf, xn, logits, c->vocab, h, STORE, t, nt);
  }
}
