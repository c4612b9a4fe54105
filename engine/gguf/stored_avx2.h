/* AVX2 kernels on stored blocks (included by stored.c where the CPU has AVX2): the integer
 * products of 8-bit activations with each type's codes, as stored_blocks.h describes them. The
 * plain kernels in stored.c compute the same sums; tests check both against gguf-py. */
#include <immintrin.h>

#define ALWAYS static inline __attribute__((always_inline))
ALWAYS float h2f(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* 0x10 in byte i where bit i of the 32 bits at p is set: Q5's fifth bit. */
ALWAYS __m256i high_bits(const uint8_t* p) {
  uint32_t bits;
  memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32((int)bits), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                      0x0101010101010101, 0x0000000000000000));
  const __m256i which = _mm256_set1_epi64x((int64_t)0x8040201008040201);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, which), which);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* Block j's codes as 32 bytes in weight order, its scale a, its offsets o per 16 and (Q6_K)
 * the madd multipliers. */
ALWAYS __m256i codes_avx2(int64_t t, const uint8_t* row, int64_t j, float* a, __m256i* mul,
                                 float* o) {
  const __m256i low4 = _mm256_set1_epi8(0xF);
  if (t == T_Q4_0) {
    const uint8_t* b = row + j * 18;
    *a = h2f(b);
    o[0] = o[1] = -8.0f * *a;
    const __m128i q = _mm_loadu_si128((const __m128i*)(b + 2));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
  }
  if (t == T_Q4_1 || t == T_Q5_0 || t == T_Q5_1) {
    const int with_min = t != T_Q5_0, five = t != T_Q4_1;
    const uint8_t* b = row + j * (t == T_Q4_1 ? 20 : t == T_Q5_0 ? 22 : 24);
    *a = h2f(b);
    o[0] = o[1] = with_min ? h2f(b + 2) : -16.0f * *a;
    const __m128i q = _mm_loadu_si128((const __m128i*)(b + 2 + 2 * with_min + 4 * five));
    __m256i c = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
    if (five) c = _mm256_or_si256(c, high_bits(b + 2 + 2 * with_min));
    return c;
  }
  if (t == T_Q8_0) {
    const uint8_t* b = row + j * 34;
    *a = h2f(b);
    o[0] = o[1] = 0.0f;
    return _mm256_loadu_si256((const __m256i*)(b + 2));
  }
  if (t == T_Q4_K) {
    const int64_t sub = j % 8;
    const uint8_t* b = row + (j / 8) * 144;
    int sc, mn;
    k_scale_min((int)sub, b + 4, &sc, &mn);
    *a = h2f(b) * sc;
    o[0] = o[1] = -h2f(b + 2) * mn;
    const __m256i q = _mm256_loadu_si256((const __m256i*)(b + 16 + 32 * (sub / 2)));
    return _mm256_and_si256(sub % 2 ? _mm256_srli_epi16(q, 4) : q, low4);
  }
  if (t == T_Q6_K) {
    const int64_t sub = j % 8;
    const uint8_t* b = row + (j / 8) * 210;
    const int h = (int)sub / 4, r = (int)sub % 4;
    const int8_t* sc = (const int8_t*)(b + 192) + 8 * h + 2 * r;
    *a = h2f(b + 208);
    *mul = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
    o[0] = -32.0f * *a * sc[0];
    o[1] = -32.0f * *a * sc[1];
    const __m256i ql = _mm256_loadu_si256((const __m256i*)(b + 64 * h + 32 * (r % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256(r < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
  uint8_t c[32];
  int16_t s[2];
  unpack32(t, row, j, c, a, s, o);
  *mul = _mm256_set_m128i(_mm_set1_epi16(s[1]), _mm_set1_epi16(s[0]));
  return _mm256_loadu_si256((const __m256i*)c);
}

/* The 8 int32 partial sums of Σ s·c·xq for one block against one token's 32 int8s. */
static inline __m256i block_isum(int64_t t, __m256i c, __m256i x, __m256i mul) {
#if VNNI /* the same sums, a lane's 4 products in one dpbusd where mul is all ones */
  if (t == T_Q8_0)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(c, c),
                               _mm256_sign_epi8(x, c));
  if (t == T_Q4_0 || t == T_Q4_1 || t == T_Q5_0 || t == T_Q5_1 || t == T_Q4_K)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), c, x);
#endif
  if (t == T_Q8_0)
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(x, c)),
                             mul);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), mul);
}

/* One vector of 8 sums: lane i = Σ of v[i]'s 8 lanes (8 blocks, or 8 tokens, at once). */
static inline __m256i transpose_sum8(const __m256i* v) {
  const __m256i s01 = _mm256_hadd_epi32(v[0], v[1]), s23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i s45 = _mm256_hadd_epi32(v[4], v[5]), s67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i s0123 = _mm256_hadd_epi32(s01, s23), s4567 = _mm256_hadd_epi32(s45, s67);
  /* s0123 = [0 1 2 3 | 0 1 2 3] halves of tokens 0-3; s4567 likewise for 4-7 */
  const __m256i lo = _mm256_permute2x128_si256(s0123, s4567, 0x20);
  const __m256i hi = _mm256_permute2x128_si256(s0123, s4567, 0x31);
  return _mm256_add_epi32(lo, hi);
}

/* Decode kernels: a row against one token's activations. Types with a float16 scale per 32
 * weights take 8 blocks at a time: their 8 integer sums become one vector (transpose_sum8), so
 * the scales (8 halves converted at once), the products with dx and the offsets are vector
 * operations per 8 blocks rather than scalar ones per block. */
ALWAYS float dot8(int64_t t, const uint8_t* row, const uint8_t* act, int64_t K) {
  const float *dx = act_dx(act, K), *ds = act_ds(act, K);
  const int64_t J = K / 32, bytes = type_block_bytes(t);
  const int min_at = (t == T_Q4_1 || t == T_Q5_1) ? 2 : 0;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  __m256 off = _mm256_setzero_ps();
  int64_t j0 = 0;
  for (; j0 + 8 <= J; j0 += 8) {
    uint16_t dh[8], mh[8];
    prefetch_ahead(row + j0 * bytes, 8 * bytes);
    for (int i = 0; i < 8; ++i) {
      memcpy(dh + i, row + (j0 + i) * bytes, 2);
      if (min_at) memcpy(mh + i, row + (j0 + i) * bytes + min_at, 2);
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)dh));
    float scale[8];
    _mm256_storeu_ps(scale, _mm256_mul_ps(d, _mm256_loadu_ps(dx + j0)));
    for (int i = 0; i < 8; ++i) {
      float a, o[2];
      __m256i mul = _mm256_set1_epi16(1);
      const __m256i p = block_isum(t, codes_avx2(t, row, j0 + i, &a, &mul, o),
                                   _mm256_loadu_si256((const __m256i*)(act + 32 * (j0 + i))), mul);
      acc[i % 4] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(scale + i), acc[i % 4]);
    }
    const __m256 o = min_at ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)mh)) : d;
    if (t != T_Q8_0) off = _mm256_fmadd_ps(o, _mm256_loadu_ps(ds + j0), off);
  }
  const float per = t == T_Q4_0 ? -8.0f : t == T_Q5_0 ? -16.0f : 1.0f;
  float tail = 0.0f;
  for (; j0 < J; ++j0) {
    float a, o[2];
    __m256i mul = _mm256_set1_epi16(1);
    const __m256i c = codes_avx2(t, row, j0, &a, &mul, o);
    tail += hsum8(_mm256_cvtepi32_ps(
                block_isum(t, c, _mm256_loadu_si256((const __m256i*)(act + 32 * j0)), mul))) *
                a * dx[j0] + o[0] * ds[j0];
  }
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  return hsum8(sum) + per * hsum8(off) + tail;
}

ALWAYS __m256i isum(__m256i c, const uint8_t* x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(c, _mm256_loadu_si256((const __m256i*)x)),
                           _mm256_set1_epi16(1));
}

/* Q4_K / Q5_K's eight 6-bit scales (bytes 0-7) and minimums (bytes 8-15) of a super-block, from
 * its 12 packed bytes (k_scale_min for all eight at once). */
ALWAYS __m128i k_scales(const uint8_t* packed) {
  uint32_t u[3];
  memcpy(u, packed, 12);
  const uint32_t six = 0x3f3f3f3fu, four = 0x0f0f0f0fu, two = 0x03030303u;
  const uint32_t sc_lo = u[0] & six, m_lo = u[1] & six;
  const uint32_t sc_hi = (u[2] & four) | (((u[0] >> 6) & two) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & four) | (((u[1] >> 6) & two) << 4);
  return _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
}

/* Q4_K against the per-256 view: a super-block's activations share one dx, so its eight
 * sub-blocks' integer sums, each multiplied by its 6-bit scale inside madd, add up in int32
 * (at most 8 · 2 · 15 · 127 · 63 · 16 per lane) and meet the float scale d·dx once; the
 * minimums are one madd of the eight mins against the activations' per-16 sums. */
static float dot_q4_k(const uint8_t* row, const uint8_t* act, int64_t K) {
  const float* dx = act_dx(act, K);
  const int16_t* s16 = act_s16(act, K);
  const __m256i low4 = _mm256_set1_epi8(0xF);
  __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < K / 256; ++sb) {
    const uint8_t* b = row + sb * 144;
    prefetch_ahead(b, 144);
    const __m128i sm = k_scales(b + 4);
    /* sc0..sc7 as 16-bit, in both lanes; mins doubled: m0 m0 m1 m1 … (one per 16 weights) */
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const __m256i mn = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_srli_si128(sm, 8), _mm_srli_si128(sm, 8)));
    const __m256i mins = _mm256_madd_epi16(mn, _mm256_loadu_si256((const __m256i*)(s16 + 16 * sb)));
    const float d = dx[8 * sb];
    off = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(h2f(b + 2) * d), off);
    const uint8_t* x = act + 256 * sb;
    __m256i sum = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i q = _mm256_loadu_si256((const __m256i*)(b + 16 + 32 * p));
      const __m256i lo = _mm256_and_si256(q, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      const __m256i s_lo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((int16_t)(0x0100 + 0x0404 * p)));
      const __m256i s_hi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((int16_t)(0x0302 + 0x0404 * p)));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(
          _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)(x + 64 * p))), s_lo));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(
          _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(x + 64 * p + 32))), s_hi));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(h2f(b) * d), acc);
  }
  return hsum8(acc) - hsum8(off);
}

/* Q6_K against the per-256 view: the quarters' integer sums, each multiplied by its two 16-weight
 * scales inside madd, add up in int32 per super-block; the −32 of every code is taken out once
 * per super-block (Σ sc·32·Σ xq from the per-16 sums). */
static float dot_q6_k(const uint8_t* row, const uint8_t* act, int64_t K) {
  const float* dx = act_dx(act, K);
  const int16_t* s16 = act_s16(act, K);
  const __m256i low4 = _mm256_set1_epi8(0xF), three = _mm256_set1_epi8(3);
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < K / 256; ++sb) {
    const uint8_t* b = row + sb * 210;
    prefetch_ahead(b, 210);
    const __m128i sc8 = _mm_loadu_si128((const __m128i*)(b + 192));
    const __m256i pairs = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, split));
    const __m256i offs = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                           _mm256_loadu_si256((const __m256i*)(s16 + 16 * sb)));
    __m256i sum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offs, 5));
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256((const __m256i*)(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256((const __m256i*)(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h));
      for (int r = 0; r < 4; ++r) {
        const int j = 4 * h + r;
        const __m256i ql = r % 2 ? ql1 : ql0;
        const __m256i lo = _mm256_and_si256(r < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), three);
        const __m256i c = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        const __m256i x = _mm256_loadu_si256((const __m256i*)(act + 256 * sb + 32 * j));
        const __m256i mul = _mm256_shuffle_epi8(pairs, _mm256_set1_epi16((int16_t)(0x0100 + 0x0202 * j)));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), mul));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(h2f(b + 208) * dx[8 * sb]), acc);
  }
  return hsum8(acc);
}

/* Q5_K (and any type codes_avx2 unpacks in plain C): one offset for its 32 weights. */
static float dot_any(int64_t t, const uint8_t* row, const uint8_t* act, int64_t K) {
  const float *dx = act_dx(act, K), *ds = act_ds(act, K);
  __m256 acc = _mm256_setzero_ps();
  float off = 0.0f;
  for (int64_t j = 0; j < K / 32; ++j) {
    float a, o[2];
    __m256i mul = _mm256_set1_epi16(1);
    const __m256i c = codes_avx2(t, row, j, &a, &mul, o);
    const __m256i p = _mm256_madd_epi16(
        _mm256_maddubs_epi16(c, _mm256_loadu_si256((const __m256i*)(act + 32 * j))), mul);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(a * dx[j]), acc);
    off += o[0] * ds[j];
  }
  return hsum8(acc) + off;
}

/* The prompt's products for rows [r0, r1) against TILE tokens (their activations `act`, `ab`
 * bytes apart; `d` their dx, dx·S16 even and odd, transposed [J][TILE]): each row's block is
 * unpacked once for the TILE tokens, whose integer sums become one vector (transpose_sum8). */
ALWAYS void tile_rows(int64_t t, const uint8_t* w, int64_t K, int64_t r0, int64_t r1,
                      const uint8_t* act, int64_t ab, const float* d, float* y, int64_t N) {
  const int64_t J = K / 32;
  const float *ds0 = d + J * 8, *ds1 = d + 2 * J * 8;
  for (int64_t n = r0; n < r1; ++n) {
    const uint8_t* row = w + n * row_bytes(t, K);
    __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
    for (int64_t j = 0; j < J; ++j) {
      float a, o[2];
      __m256i mul = _mm256_set1_epi16(1), part[8];
      const __m256i c = codes_avx2(t, row, j, &a, &mul, o);
      for (int i = 0; i < 8; ++i)
        part[i] = block_isum(t, c, _mm256_loadu_si256((const __m256i*)(act + i * ab + 32 * j)), mul);
      const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(a), _mm256_loadu_ps(d + j * 8));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(transpose_sum8(part)), scale, acc);
      off = _mm256_fmadd_ps(_mm256_set1_ps(o[0]), _mm256_loadu_ps(ds0 + j * 8), off);
      off = _mm256_fmadd_ps(_mm256_set1_ps(o[1]), _mm256_loadu_ps(ds1 + j * 8), off);
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(acc, off));
    for (int i = 0; i < 8; ++i) y[i * N + n] = out[i];
  }
}

/* The prompt's products for Q4_K and Q6_K rows [r0, r1) against 8 tokens' per-256 views: per
 * super-block each token's sub-block sums add up in int32 (scales inside madd, as dot_q4_k /
 * dot_q6_k do), and the 8 tokens' sums are transposed into one vector once per super-block. */
ALWAYS void tile_rows_k(int64_t t, const uint8_t* w, int64_t K, int64_t r0, int64_t r1,
                        const uint8_t* act, int64_t ab, const float* d, float* y, int64_t N) {
  const __m256i low4 = _mm256_set1_epi8(0xF), three = _mm256_set1_epi8(3);
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const int64_t rb = row_bytes(t, K);
  for (int64_t n = r0; n < r1; ++n) {
    const uint8_t* row = w + n * rb;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < K / 256; ++sb) {
      const __m256 dx = _mm256_loadu_ps(d + 8 * sb * 8); /* the 8 tokens' dx of this super-block */
      __m256i sum[8], low[8];
      if (t == T_Q4_K) {
        const uint8_t* b = row + sb * 144;
        const __m128i sm = k_scales(b + 4);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        const __m128i m8 = _mm_srli_si128(sm, 8);
        const __m256i mn = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        for (int i = 0; i < 8; ++i) {
          sum[i] = _mm256_setzero_si256();
          low[i] = _mm256_madd_epi16(
              mn, _mm256_loadu_si256((const __m256i*)(act_s16(act + i * ab, K) + 16 * sb)));
        }
        for (int p = 0; p < 4; ++p) {
          const __m256i q = _mm256_loadu_si256((const __m256i*)(b + 16 + 32 * p));
          const __m256i lo = _mm256_and_si256(q, low4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
          const __m256i s_lo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((int16_t)(0x0100 + 0x0404 * p)));
          const __m256i s_hi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((int16_t)(0x0302 + 0x0404 * p)));
          for (int i = 0; i < 8; ++i) {
            const uint8_t* x = act + i * ab + 256 * sb + 64 * p;
            sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)x)), s_lo));
            sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(x + 32))), s_hi));
          }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(transpose_sum8(sum)),
                              _mm256_mul_ps(dx, _mm256_set1_ps(h2f(b))), acc);
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(transpose_sum8(low)),
                               _mm256_mul_ps(dx, _mm256_set1_ps(h2f(b + 2))), acc);
      } else {
        const uint8_t* b = row + sb * 210;
        const __m128i sc8 = _mm_loadu_si128((const __m128i*)(b + 192));
        const __m256i pairs = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, split));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        for (int i = 0; i < 8; ++i)
          sum[i] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(
              sc16, _mm256_loadu_si256((const __m256i*)(act_s16(act + i * ab, K) + 16 * sb))), 5));
        for (int h = 0; h < 2; ++h) {
          const __m256i ql0 = _mm256_loadu_si256((const __m256i*)(b + 64 * h));
          const __m256i ql1 = _mm256_loadu_si256((const __m256i*)(b + 64 * h + 32));
          const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h));
          for (int r = 0; r < 4; ++r) {
            const int j = 4 * h + r;
            const __m256i ql = r % 2 ? ql1 : ql0;
            const __m256i lo = _mm256_and_si256(r < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), three);
            const __m256i c = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            const __m256i mul = _mm256_shuffle_epi8(pairs, _mm256_set1_epi16((int16_t)(0x0100 + 0x0202 * j)));
            for (int i = 0; i < 8; ++i)
              sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(_mm256_maddubs_epi16(
                  c, _mm256_loadu_si256((const __m256i*)(act + i * ab + 256 * sb + 32 * j))), mul));
          }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(transpose_sum8(sum)),
                              _mm256_mul_ps(dx, _mm256_set1_ps(h2f(b + 208))), acc);
      }
    }
    float out[8];
    _mm256_storeu_ps(out, acc);
    for (int i = 0; i < 8; ++i) y[i * N + n] = out[i];
  }
}
