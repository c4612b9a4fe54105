/* The native step's own layouts (included by native_decode.c, which defines BLOCK, Fmt, the
 * format enum and half_to_float first): float32 blocks and the group records of int8 / Q8_0 /
 * Q4_0 / Q4_1 and of GGML's Q5_0 / Q4_K / Q6_K re-laid (native_records.py), where BLOCK rows are
 * interleaved so BLOCK accumulators stay in registers. A record is [codes][high bits, Q5_0
 * only][scales][minimums, Q4_1 / Q4_K only]:
 * - Q8, Q6_K: (G, BLOCK) int8 codes, value s·c (Q6_K: G = 16, its c − 32 stored signed);
 * - Q4_0, Q4_1, Q5_0, Q4_K: (G/2, BLOCK) bytes, k even in the low nibble, k odd in the high one;
 *   Q5_0 then (G) uint32 words, bit j of word k = bit 4 of row j's code k (BLOCK = 32);
 * - scales and minimums: BLOCK float16 (Q8, Q4_0, Q4_1, Q5_0) or BLOCK float32 (Q4_K: d·sc and
 *   dmin·mn, the products GGML dequantizes with; Q6_K: d·sc), one per row;
 * values: Q4_0 d·(c − 8), Q5_0 d·(c − 16), Q4_1 d·c + m, Q4_K s·c − m. Q5_0 and Q4_K groups are
 * 32 weights, Q6_K's 16, whatever Fmt.group says.
 * Why a file of its own: these are the fast paths, tuned to the memory roof (plain loops and
 * AVX-512 side by side); native_ggml.h holds the kernels that read GGML's blocks as stored.
 */
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

static inline int64_t group_of(Fmt f, int64_t K) {
  if (f.format == Q5_0 || f.format == Q4_K) return 32;
  if (f.format == Q6_K) return 16;
  return f.group ? f.group : K;
}

static inline int is_byte_code(int64_t format) { return format == Q8 || format == Q6_K; }

/* Bytes of one group's record: codes (and high bits), then scales (and minimums). */
static inline int64_t group_bytes(Fmt f, int64_t G) {
  const int64_t codes = is_byte_code(f.format) ? G * BLOCK : G / 2 * BLOCK;
  const int64_t high = f.format == Q5_0 ? G * 4 : 0;
  const int64_t tables = f.format == Q4_K ? 8 : f.format == Q6_K || f.format == Q4_1 ? 4 : 2;
  return codes + high + tables * BLOCK;
}

/* The codes of one group times x, in float: a[j] = Σ_k c[k][j] · x[k] — the plain loops, which
 * the compiler vectorizes for any CPU. Returns the record past its codes (and high bits). */
static inline const uint8_t* group_dot(const uint8_t* restrict p, Fmt f, const float* restrict xg,
                                       int64_t G, float* restrict a) {
  for (int j = 0; j < BLOCK; ++j) a[j] = 0.0f;
  if (is_byte_code(f.format)) {
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
  if (f.format != Q5_0) return c;
  for (int64_t k = 0; k < G; ++k, c += 4) {
    uint32_t word;
    memcpy(&word, c, sizeof(word));
    const float x16 = 16.0f * xg[k];
#pragma omp simd
    for (int j = 0; j < BLOCK; ++j) a[j] += (float)((word >> j) & 1) * x16;
  }
  return c;
}

#if defined(__AVX512F__) && BLOCK == 32 && !defined(PLAIN_KERNELS)
#include <immintrin.h>
#define FAST_BLOCK_DOT 1
/* block_dot_q written out with AVX-512: 16 rows per register, codes widened straight from memory
 * (vpmovsxbd / vpmovzxbd), low and high nibbles (even and odd k) into separate accumulators so
 * each FMA chain has one add per iteration, and the float16 scales converted 16 at a time
 * (vcvtph2ps). The plain loops below compile to 16-bit widening shuffles and one scalar
 * conversion per scale, about half as fast (tests check both give the reference's logits). */
/* Codes c (16 rows) with bit 4 set on the rows of mask m, as floats (Q5_0). */
static inline __m512 with_bit4(__m512i c, __mmask16 m) {
  return _mm512_cvtepi32_ps(_mm512_mask_or_epi32(c, m, c, _mm512_set1_epi32(16)));
}

static inline void block_dot_q_avx512(const uint8_t* restrict p, Fmt f, const float* restrict x,
                                      const float* restrict sx, int64_t K, float* restrict acc) {
  const int64_t G = group_of(f, K);
  const __m512i low = _mm512_set1_epi32(15);
  __m512 t0 = _mm512_setzero_ps(), t1 = _mm512_setzero_ps();
  for (int64_t g = 0; g < K / G; ++g) {
    const float* xg = x + g * G;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (is_byte_code(f.format)) {
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
    } else if (f.format == Q5_0) { /* bit 4 ORed into the codes from the words (rows 0-15 in a
                                     word's low half, 16-31 in its high one): masks from memory */
      const __mmask16* half = (const __mmask16*)(p + G / 2 * BLOCK);
      for (int64_t k = 0; k < G; k += 2) {
        _mm_prefetch((const char*)p + PREFETCH, _MM_HINT_T0);
        const __m512 x0 = _mm512_set1_ps(xg[k]), x1 = _mm512_set1_ps(xg[k + 1]);
        const __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
        const __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p + 1));
        const __m512i l0 = _mm512_and_si512(v0, low), l1 = _mm512_and_si512(v1, low);
        const __m512i h0 = _mm512_srli_epi32(v0, 4), h1 = _mm512_srli_epi32(v1, 4);
        const __mmask16* m = half + 2 * k;
        a0 = _mm512_fmadd_ps(with_bit4(l0, m[0]), x0, a0);
        a1 = _mm512_fmadd_ps(with_bit4(l1, m[1]), x0, a1);
        b0 = _mm512_fmadd_ps(with_bit4(h0, m[2]), x1, b0);
        b1 = _mm512_fmadd_ps(with_bit4(h1, m[3]), x1, b1);
        p += BLOCK;
      }
      p += 4 * G;
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
    if (f.format == Q4_K || f.format == Q6_K) { /* float32 scales (and minimums) */
      const __m512 s0 = _mm512_loadu_ps((const float*)p);
      const __m512 s1 = _mm512_loadu_ps((const float*)p + 16);
      p += 4 * BLOCK;
      t0 = _mm512_fmadd_ps(s0, a0, t0);
      t1 = _mm512_fmadd_ps(s1, a1, t1);
      if (f.format == Q4_K) {
        const __m512 s = _mm512_set1_ps(sx[g]);
        t0 = _mm512_fnmadd_ps(_mm512_loadu_ps((const float*)p), s, t0);
        t1 = _mm512_fnmadd_ps(_mm512_loadu_ps((const float*)p + 16), s, t1);
        p += 4 * BLOCK;
      }
      continue;
    }
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
      if (f.format == Q4_0 || f.format == Q5_0) {
        const __m512 s8 = _mm512_set1_ps((f.format == Q5_0 ? 16.0f : 8.0f) * sx[g]);
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
    if (f.format == Q4_K || f.format == Q6_K) { /* float32 scales (and minimums) */
      const float* s = (const float*)p;
      p += 4 * BLOCK;
#pragma omp simd
      for (int j = 0; j < BLOCK; ++j) total[j] += s[j] * a[j];
      if (f.format == Q4_K) {
        const float* m = (const float*)p;
        p += 4 * BLOCK;
#pragma omp simd
        for (int j = 0; j < BLOCK; ++j) total[j] -= m[j] * sx[g];
      }
      continue;
    }
    const uint16_t* d = (const uint16_t*)p;
    p += 2 * BLOCK;
    if (f.format == Q4_1) {
      const uint16_t* m = (const uint16_t*)p;
      p += 2 * BLOCK;
#pragma omp simd
      for (int j = 0; j < BLOCK; ++j)
        total[j] += half_to_float(d[j]) * a[j] + half_to_float(m[j]) * sx[g];
    } else if (f.format == Q4_0 || f.format == Q5_0) {
      const float offset = (f.format == Q5_0 ? 16.0f : 8.0f) * sx[g];
#pragma omp simd
      for (int j = 0; j < BLOCK; ++j) total[j] += half_to_float(d[j]) * (a[j] - offset);
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
