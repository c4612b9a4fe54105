/* Q4_K with 8 rows interleaved (T_Q4_KX8; included by stored.c), at the stored size.
 *
 * Why: a row at a time, each 64 weights of a Q4_K super-block cost about 14 instructions (the
 * activations loaded, the sub-blocks' scales shuffled out, the products scaled inside madd) and
 * each super-block another 25 (its twelve packed bytes of 6-bit scales unpacked, the minimums,
 * the float scales), so the decode step is compute-bound as Q4_0's was (stored_rows8.h). Eight
 * rows side by side, one 32-bit lane a row: a vector holds 4 bytes of each of the 8 rows, the 4
 * activations they meet are one broadcast, a sub-block's 8 vectors of products add up in 16 bits
 * (8 · 2 · 15 · 128 < 2¹⁵) and meet the 8 rows' scales in one madd, the 8 rows' scales and
 * minimums unpack in a dozen vector instructions, and the sums land one row a lane: no
 * reduction at all. About 12 instructions for 64 weights of a row, against 20 a row at a time.
 *
 * Layout: group g holds rows 8g..8g+7; its super-block column s (1152 bytes, the 8 rows' 144)
 * is the 8 rows' f16 d (16 bytes), f16 dmin (16), the three 4-byte words of their packed scales,
 * word by word (3 × 32: word w of row r at 32 + 32w + 4r), then the nibbles: for quarter p of the
 * row's 128 bytes and position q, bytes 4q..4q+3 of that quarter of each row (32 bytes at
 * 128 + 256p + 32q, row r at 4r). Low nibbles are sub-block 2p, high nibbles 2p + 1, as stored.
 */

/* src: rows of GGML Q4_K (rows a multiple of 8, K of 256) → dst, the same bytes interleaved. */
void repack_q4_kx8(const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst, int threads) {
  const int64_t S = K / 256, rb = S * 144;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < rows / 8; ++g)
    for (int64_t s = 0; s < S; ++s) {
      uint8_t* out = dst + (g * S + s) * 1152;
      for (int r = 0; r < 8; ++r) {
        const uint8_t* b = src + (8 * g + r) * rb + 144 * s;
        memcpy(out + 2 * r, b, 2);
        memcpy(out + 16 + 2 * r, b + 2, 2);
        for (int w = 0; w < 3; ++w) memcpy(out + 32 + 32 * w + 4 * r, b + 4 + 4 * w, 4);
        for (int p = 0; p < 4; ++p)
          for (int q = 0; q < 8; ++q)
            memcpy(out + 128 + 256 * p + 32 * q + 4 * r, b + 16 + 32 * p + 4 * q, 4);
      }
    }
}

/* Row r of a group back as stored (Q4_K rows of K): repack_q4_kx8 undone for one row. */
static void k8_row(const uint8_t* grp, int64_t K, int r, uint8_t* row) {
  for (int64_t s = 0; s < K / 256; ++s) {
    const uint8_t* b = grp + 1152 * s;
    uint8_t* out = row + 144 * s;
    memcpy(out, b + 2 * r, 2);
    memcpy(out + 2, b + 16 + 2 * r, 2);
    for (int w = 0; w < 3; ++w) memcpy(out + 4 + 4 * w, b + 32 + 32 * w + 4 * r, 4);
    for (int p = 0; p < 4; ++p)
      for (int q = 0; q < 8; ++q)
        memcpy(out + 16 + 32 * p + 4 * q, b + 128 + 256 * p + 32 * q + 4 * r, 4);
  }
}

#if FAST
/* The 8 rows' scales and minimums of a super-block column, one row a 32-bit lane (k_scales for
 * 8 rows at once): sc[0] = scales 0-3, sc[1] = 4-7; mn likewise. */
ALWAYS void k8_scales(const uint8_t* b, __m256i* sc, __m256i* mn) {
  const __m256i u0 = _mm256_loadu_si256((const __m256i*)(b + 32));
  const __m256i u1 = _mm256_loadu_si256((const __m256i*)(b + 64));
  const __m256i u2 = _mm256_loadu_si256((const __m256i*)(b + 96));
  const __m256i six = _mm256_set1_epi8(0x3f), four = _mm256_set1_epi8(0xF);
  const __m256i two = _mm256_set1_epi8(3);
  sc[0] = _mm256_and_si256(u0, six);
  mn[0] = _mm256_and_si256(u1, six);
  sc[1] = _mm256_or_si256(_mm256_and_si256(u2, four), _mm256_slli_epi32(
      _mm256_and_si256(_mm256_srli_epi32(u0, 6), two), 4));
  mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), four), _mm256_slli_epi32(
      _mm256_and_si256(_mm256_srli_epi32(u1, 6), two), 4));
}

/* Byte i of every 32-bit lane as two int16 (a row's sub-block scale, for madd). */
ALWAYS __m256i k8_pick(__m256i v, int i) {
  const char z = (char)0x80;
  return _mm256_shuffle_epi8(v, _mm256_setr_epi8(
      i, z, i, z, 4 + i, z, 4 + i, z, 8 + i, z, 8 + i, z, 12 + i, z, 12 + i, z,
      i, z, i, z, 4 + i, z, 4 + i, z, 8 + i, z, 8 + i, z, 12 + i, z, 12 + i, z));
}

/* Byte i of every 32-bit lane as an int32 (a row's unsigned 6-bit sub-block scale). */
ALWAYS __m256i k8_scale32(__m256i v, int i) {
  return _mm256_and_si256(_mm256_srli_epi32(v, 8 * i), _mm256_set1_epi32(0xFF));
}

/* Every 32-bit lane as the int16 pair (lo, hi): what madd pairs two rows' values with. */
ALWAYS __m256i pair16(int32_t lo, int32_t hi) {
  return _mm256_set1_epi32((int)((uint16_t)lo | (uint32_t)(uint16_t)hi << 16));
}

/* Σ_j mn_j · Σ xq over sub-block j, one row a lane: the minimums' integer sum (s16: the
 * super-block's 16 per-16 sums of the activations). */
ALWAYS __m256i k8_mins(const __m256i* mn, const int16_t* s16) {
  int32_t xs[8];
  for (int j = 0; j < 8; ++j) xs[j] = s16[2 * j] + s16[2 * j + 1]; /* |xs| ≤ 32 · 128 */
  const __m256i even = _mm256_set1_epi32(0x00FF00FF);
  __m256i m = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) { /* lanes' int16 pairs: mins (4h, 4h+2) and (4h+1, 4h+3) */
    const __m256i x02 = pair16(xs[4 * h], xs[4 * h + 2]);
    const __m256i x13 = pair16(xs[4 * h + 1], xs[4 * h + 3]);
    m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_and_si256(mn[h], even), x02));
    m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_srli_epi16(mn[h], 8), x13));
  }
  return m;
}

ALWAYS __m256i bcast4(const uint8_t* x) {
  int32_t v;
  memcpy(&v, x, 4);
  return _mm256_set1_epi32(v);
}

/* Quarter p's products of the 8 rows with one token's 256 activations x, scaled by sub-blocks
 * 2p and 2p + 1's scales: lo / hi are the quarter's 8 vectors of low and high nibbles. */
ALWAYS __m256i k8_quarter(const __m256i* lo, const __m256i* hi, const uint8_t* x, int p,
                          const __m256i* sc) {
#if VNNI
  __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
  for (int q = 0; q < 8; ++q) {
    a = _mm256_dpbusd_epi32(a, lo[q], bcast4(x + 64 * p + 4 * q));
    b = _mm256_dpbusd_epi32(b, hi[q], bcast4(x + 64 * p + 32 + 4 * q));
  }
  return _mm256_add_epi32(_mm256_mullo_epi32(a, k8_scale32(sc[p / 2], 2 * (p % 2))),
                          _mm256_mullo_epi32(b, k8_scale32(sc[p / 2], 2 * (p % 2) + 1)));
#else
  __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
  for (int q = 0; q < 8; ++q) {
    a = _mm256_add_epi16(a, _mm256_maddubs_epi16(lo[q], bcast4(x + 64 * p + 4 * q)));
    b = _mm256_add_epi16(b, _mm256_maddubs_epi16(hi[q], bcast4(x + 64 * p + 32 + 4 * q)));
  }
  return _mm256_add_epi32(_mm256_madd_epi16(a, k8_pick(sc[p / 2], 2 * (p % 2))),
                          _mm256_madd_epi16(b, k8_pick(sc[p / 2], 2 * (p % 2) + 1)));
#endif
}

ALWAYS void k8_unpack(const uint8_t* b, int p, __m256i* lo, __m256i* hi) {
  const __m256i low4 = _mm256_set1_epi8(0xF);
  for (int q = 0; q < 8; ++q) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)(b + 128 + 256 * p + 32 * q));
    lo[q] = _mm256_and_si256(v, low4);
    hi[q] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  }
}

/* One group against one token: out[r] (+)= row r · x. */
static void dot_k8(const uint8_t* grp, const uint8_t* act, int64_t K, float* out, int add) {
  const float* dx = act_dx(act, K);
  const int16_t* s16 = act_s16(act, K);
  const __m256i low4 = _mm256_set1_epi8(0xF);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t s = 0; s < K / 256; ++s) {
    const uint8_t* b = grp + 1152 * s;
    __m256i sc[2], mn[2], isum = _mm256_setzero_si256();
    prefetch_ahead(b, 1152);
    k8_scales(b, sc, mn);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) { /* k8_unpack and k8_quarter fused: no vectors spilled */
      const uint8_t* x = act + 256 * s + 64 * p;
      __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
#if VNNI /* int32 sums: one dpbusd each, one 32-bit multiply by the scale */
      for (int q = 0; q < 8; ++q) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(b + 128 + 256 * p + 32 * q));
        lo = _mm256_dpbusd_epi32(lo, _mm256_and_si256(v, low4), bcast4(x + 4 * q));
        hi = _mm256_dpbusd_epi32(hi, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                                 bcast4(x + 32 + 4 * q));
      }
      isum = _mm256_add_epi32(isum, _mm256_add_epi32(
          _mm256_mullo_epi32(lo, k8_scale32(sc[p / 2], 2 * (p % 2))),
          _mm256_mullo_epi32(hi, k8_scale32(sc[p / 2], 2 * (p % 2) + 1))));
#else
      for (int q = 0; q < 8; ++q) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(b + 128 + 256 * p + 32 * q));
        lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_and_si256(v, low4),
                                                        bcast4(x + 4 * q)));
        hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(
            _mm256_and_si256(_mm256_srli_epi16(v, 4), low4), bcast4(x + 32 + 4 * q)));
      }
      isum = _mm256_add_epi32(isum, _mm256_add_epi32(
          _mm256_madd_epi16(lo, k8_pick(sc[p / 2], 2 * (p % 2))),
          _mm256_madd_epi16(hi, k8_pick(sc[p / 2], 2 * (p % 2) + 1))));
#endif
    }
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b)),
                                   _mm256_set1_ps(dx[8 * s]));
    const __m256 m = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 16))),
                                   _mm256_set1_ps(dx[8 * s]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc);
    acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(k8_mins(mn, s16 + 16 * s)), m, acc);
  }
  if (add) acc = _mm256_add_ps(acc, _mm256_loadu_ps(out));
  _mm256_storeu_ps(out, acc);
}

/* The prompt's products for groups of rows [r0, r1) against TILE tokens (as tile_rows_k: their
 * per-256 views `ab` bytes apart, `d` their dx transposed [J][TILE]): each quarter of a group's
 * super-block column is unpacked once for the 8 tokens. */
ALWAYS void tile_k8(const uint8_t* w, int64_t K, int64_t r0, int64_t r1, const uint8_t* act,
                    int64_t ab, const float* d, float* y, int64_t N) {
  for (int64_t g = r0 / 8; g < r1 / 8; ++g) {
    const uint8_t* grp = w + g * (K / 256) * 1152;
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t s = 0; s < K / 256; ++s) {
      const uint8_t* b = grp + 1152 * s;
      __m256i sc[2], mn[2], isum[8];
      k8_scales(b, sc, mn);
      for (int i = 0; i < 8; ++i) isum[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        __m256i lo[8], hi[8];
        k8_unpack(b, p, lo, hi);
        for (int i = 0; i < 8; ++i)
          isum[i] = _mm256_add_epi32(isum[i], k8_quarter(lo, hi, act + i * ab + 256 * s, p, sc));
      }
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b));
      const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 16)));
      for (int i = 0; i < 8; ++i) {
        const __m256 dxi = _mm256_set1_ps(d[8 * s * 8 + i]);
        const __m256i mins = k8_mins(mn, act_s16(act + i * ab, K) + 16 * s);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_mul_ps(dv, dxi), acc[i]);
        acc[i] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(mv, dxi), acc[i]);
      }
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(y + i * N + 8 * g, acc[i]);
  }
}
#endif
