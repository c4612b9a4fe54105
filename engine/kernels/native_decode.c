/* One decode step of a Llama-family model on the CPU, written out by hand (llama.cpp style).
 *
 * Why: a decode step reads every weight once to produce one token, so its speed is set by how
 * close the matrix-vector products get to the memory roof. Library kernels are tuned for
 * matrices with many rows; here each weight matrix arrives packed in BLOCK-row blocks laid out
 * k-major ([block][k][BLOCK]), so a block is one sequential stream, x[k] is broadcast, and BLOCK
 * accumulators stay in vector registers (no horizontal sums). The float32 loops are vectorized
 * by the compiler for whatever this CPU has (-march=native); hand-written AVX-512 intrinsics
 * measured no faster for them (unlike the quantized formats, below).
 * All steps of the forward run inside one OpenMP parallel region with barriers between dependent phases: no per-op dispatch at all.
 *
 * The weights `w` (packed by engine/kernels/native_pack.py) are a sequence of parts whose order,
 * shapes, formats and byte offsets `layout()` there computes once; they arrive here as `off` and
 * `fmt`: part p of layer l starts at w + off[i], i = l * LAYER_PARTS + p, in format fmt[2i] with
 * group fmt[2i + 1] (the final norm and the LM head: i = layers * LAYER_PARTS + FINAL_NORM /
 * LM_HEAD). Every matrix has its own format, as a GGUF file's tensors do (llama.cpp's Q4_K_M
 * mixes Q4_K, Q6_K, Q5_0 and Q8_0 in one layer), so q, k and v are three parts (one gemv over
 * all three) and gate and up two (block b of each in the same thread, for silu(gate)·up without
 * a barrier). Norms are float32. Every matrix is stored in BLOCK-row blocks:
 * - F32: [k][BLOCK] floats, k-major;
 * - Q8 / Q4_0 / Q4_1 (codes of a group of G consecutive k, G = the format's group or the whole
 *   row): per group [codes][BLOCK float16 scales d][BLOCK float16 minimums m, Q4_1 only]; codes
 *   are [k][BLOCK] int8 (Q8: value d·c) or [k/2][BLOCK] bytes holding k even in the low nibble
 *   and k odd in the high one (Q4_0: value d·(c − 8); Q4_1: value d·c + m). The codes are
 *   unpacked in registers: a group's Σ c·x is summed first and scaled once per row
 *   (Σ (d·c + m)·x = d·Σ c·x + m·Σ x), so the low-bit step streams 1 or ½ byte per weight
 *   (native_groups.h);
 * - Q5_0, Q4_K, Q6_K: GGML's blocks re-laid into group records of the same kind (32, 32 and 16
 *   weights; Q5_0 adds a plane of bit 4, Q4_K / Q6_K have float32 scales: native_groups.h);
 * - F16, Q5_1, Q5_K: GGML's own blocks, BLOCK rows of them (native_ggml.h).
 * The group kernels come twice, side by side: plain loops any compiler vectorizes
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

/* Weight formats of a matrix part (engine/kernels/native_formats.py FORMAT_CODES). */
enum { F32, Q8, Q4_0, Q4_1, F16, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K };
#ifndef MAX_GROUPS
#define MAX_GROUPS 4096 /* groups per row a quantized gemv sums x over; passed as -DMAX_GROUPS */
#endif
#ifndef PREFETCH
#define PREFETCH 16384 /* bytes ahead the quantized kernels prefetch (see group_dot) */
#endif

/* The parts of one layer, in the order of LAYER_PARTS in engine/kernels/native_pack.py, then the
 * final ones. */
enum { IN_NORM, WQ, WK, WV, O, POST_NORM, GATE, UP, DOWN, LAYER_PARTS };
enum { FINAL_NORM, LM_HEAD };

typedef struct {
  int64_t layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_tokens;
  float eps, scale;
} Config;

typedef struct {
  int64_t format, group; /* group 0: one group per row */
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
#include "native_groups.h"
#include "native_ggml.h"

/* Bytes of one BLOCK-row block of a (n, K) matrix in format f. */
static inline int64_t block_bytes(Fmt f, int64_t K) {
  if (f.format == F32) return K * BLOCK * (int64_t)sizeof(float);
  if (is_ggml_row(f.format)) return BLOCK * ggml_row_bytes(f.format, K);
  const int64_t G = group_of(f, K);
  return K / G * group_bytes(f, G);
}

/* The group whose sums of x (sx) a format's kernel reads: 0 for none. */
static inline int64_t sum_group(Fmt f, int64_t K) {
  if (f.format == F32) return 0;
  return is_ggml_row(f.format) ? 32 : group_of(f, K);
}

/* acc = block b of a matrix in format f, times x. */
static inline void any_block_dot(const uint8_t* w, Fmt f, int64_t b, const float* x,
                                 const float* sx, int64_t K, float* acc) {
  const uint8_t* p = w + b * block_bytes(f, K);
  if (f.format == F32)
    block_dot((const float*)p, x, K, acc);
  else if (is_ggml_row(f.format))
    ggml_block_dot(p, f.format, x, sx, K, acc);
  else
#ifdef FAST_BLOCK_DOT
    block_dot_q_avx512(p, f, x, sx, K, acc);
#else
    block_dot_q(p, f, x, sx, K, acc);
#endif
}

enum { STORE, ADD };

/* One matrix of a gemv: its packed bytes, format and rows. */
typedef struct {
  const uint8_t* w;
  Fmt f;
  int64_t n;
} Mat;

/* y = W x (STORE) or y += W x (ADD), W the `count` matrices stacked (their rows one after the
 * other in y: q, k and v are one gemv). Their blocks are split among the threads as one range,
 * so three matrices balance like one; rows of a matrix's last block past its n are dropped. */
static void gemv(const Mat* m, int count, const float* x, float* y, int64_t K, int mode, int t,
                 int T) {
  int64_t total = 0;
  for (int i = 0; i < count; ++i) total += (m[i].n + BLOCK - 1) / BLOCK;
  int64_t lo, hi, first = 0, row0 = 0, summed = 0;
  split(total, t, T, &lo, &hi);
  float acc[BLOCK], sx[MAX_GROUPS];
  for (int i = 0; i < count; first += (m[i].n + BLOCK - 1) / BLOCK, row0 += m[i].n, ++i) {
    const int64_t blocks = (m[i].n + BLOCK - 1) / BLOCK, G = sum_group(m[i].f, K);
    const int64_t a = lo > first ? lo : first, z = hi < first + blocks ? hi : first + blocks;
    if (a >= z) continue;
    if (G && G != summed) group_sums(x, K, summed = G, sx);
    for (int64_t b = a - first; b < z - first; ++b) {
      any_block_dot(m[i].w, m[i].f, b, x, sx, K, acc);
      const int64_t r0 = b * BLOCK, rows = m[i].n - r0 < BLOCK ? m[i].n - r0 : BLOCK;
      float* out = y + row0 + r0;
      for (int64_t j = 0; j < rows; ++j) out[j] = mode == ADD ? out[j] + acc[j] : acc[j];
    }
  }
}

/* Part i of the packed weights as a matrix of n rows. */
static inline Mat matrix(const uint8_t* w, const int64_t* off, const int64_t* fmt, int64_t i,
                         int64_t n) {
  const Mat m = {w + off[i], {fmt[2 * i], fmt[2 * i + 1]}, n};
  return m;
}

/* act = silu(gate x) · (up x) for this thread's blocks: block b of gate and block b of up in
 * one thread, so no barrier between them. */
static void gate_up(Mat gate, Mat up, const float* x, float* act, int64_t K, int t, int T) {
  int64_t lo, hi;
  split(gate.n / BLOCK, t, T, &lo, &hi);
  float g[BLOCK], u[BLOCK], sxg[MAX_GROUPS], sxu[MAX_GROUPS];
  const int64_t Gg = sum_group(gate.f, K), Gu = sum_group(up.f, K);
  if (Gg) group_sums(x, K, Gg, sxg);
  if (Gu) group_sums(x, K, Gu, sxu);
  for (int64_t b = lo; b < hi; ++b) {
    any_block_dot(gate.w, gate.f, b, x, sxg, K, g);
    any_block_dot(up.w, up.f, b, x, sxu, K, u);
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
#pragma omp simd reduction(+ : dot) /* a vector of partial sums: the plain loop is serial */
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
void decode_step(const Config* c, const uint8_t* w, const int64_t* off, const int64_t* fmt,
                 const float* embed,
                 const float* cos_table, const float* sin_table, float* k_cache, float* v_cache,
                 int64_t token, int64_t pos, float* scratch, float* logits, int threads,
                 const int64_t* rec_slot, float* rec_attn, float* rec_hidden) {
  const int64_t h = c->hidden, d = c->head_dim, q = c->heads * d, kvd = c->kv_heads * d;
  const int64_t group = c->heads / c->kv_heads, T = c->max_tokens;
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
      const Mat qkv_m[3] = {matrix(w, off, fmt, l * LAYER_PARTS + WQ, q),
                            matrix(w, off, fmt, l * LAYER_PARTS + WK, kvd),
                            matrix(w, off, fmt, l * LAYER_PARTS + WV, kvd)};
      const Mat o_m = matrix(w, off, fmt, l * LAYER_PARTS + O, h);
      const Mat gate_m = matrix(w, off, fmt, l * LAYER_PARTS + GATE, c->inter);
      const Mat up_m = matrix(w, off, fmt, l * LAYER_PARTS + UP, c->inter);
      const Mat down_m = matrix(w, off, fmt, l * LAYER_PARTS + DOWN, h);
      const int64_t slot = rec_slot && rec_attn ? rec_slot[l] : -1;
      float* kc = k_cache + l * c->kv_heads * T * d;
      float* vc = v_cache + l * c->kv_heads * T * d;
#pragma omp single
      {
        if (rec_hidden) memcpy(rec_hidden + l * h, x, h * sizeof(float));
        rms_norm(x, in_norm, xn, h, c->eps);
      }
      gemv(qkv_m, 3, xn, qkv, h, STORE, t, nt);
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
      gemv(&o_m, 1, att, x, q, ADD, t, nt);
#pragma omp barrier
#pragma omp single
      rms_norm(x, post_norm, xn, h, c->eps);
      gate_up(gate_m, up_m, xn, act, h, t, nt);
#pragma omp barrier
      gemv(&down_m, 1, act, x, c->inter, ADD, t, nt);
#pragma omp barrier
    }
    const int64_t* final = off + c->layers * LAYER_PARTS;
#pragma omp single
    {
      if (rec_hidden) memcpy(rec_hidden + c->layers * h, x, h * sizeof(float));
      rms_norm(x, (const float*)(w + final[FINAL_NORM]), xn, h, c->eps);
    }
    const Mat head_m = matrix(w, off, fmt, c->layers * LAYER_PARTS + LM_HEAD, c->vocab);
    gemv(&head_m, 1, xn, logits, h, STORE, t, nt);
  }
}

/* y (n) = one matrix (n, K) packed as native_pack.py stores it, in `format` with `group`, times
 * x (K): the step's own gemv alone, so tests can check each format's kernel against a reference
 * and benchmarks can time it. */
void matvec(const uint8_t* w, int64_t format, int64_t group, int64_t n, int64_t K, const float* x,
            float* y, int threads) {
  const Mat m = {w, {format, group}, n};
#pragma omp parallel num_threads(threads)
  gemv(&m, 1, x, y, K, STORE, omp_get_thread_num(), omp_get_num_threads());
}
