/* Q6_K with 8 rows interleaved (T_Q6_KX8; included by stored.c), at the stored size: the same
 * scheme as Q4_K's (stored_rows8k.h says why), one row a 32-bit lane.
 *
 * Layout: group g holds rows 8g..8g+7; its super-block column s (1680 bytes, the 8 rows' 210)
 * is the 8 rows' f16 d (16 bytes), their int8 scales four at a time (4 × 32: scales 4w..4w+3 of
 * row r at 16 + 32w + 4r), their low 4 bits (ql: for half h, k and position q, bytes
 * 64h + 32k + 4q.. +3 of each row at 144 + 512h + 256k + 32q + 4r) and their high 2 bits (qh:
 * bytes 32h + 4q.. +3 at 1168 + 256h + 32q + 4r). Weight 128h + 32r + l of a row is the low or
 * high nibble (r < 2, r ≥ 2) of ql[64h + 32(r % 2) + l] with bits 2r, 2r + 1 of qh[32h + l]
 * above it, as stored; its scale is scales[8h + 2r + l / 16].
 */

/* src: rows of GGML Q6_K (rows a multiple of 8, K of 256) → dst, the same bytes interleaved. */
void repack_q6_kx8(const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst, int threads) {
  const int64_t S = K / 256, rb = S * 210;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < rows / 8; ++g)
    for (int64_t s = 0; s < S; ++s) {
      uint8_t* out = dst + (g * S + s) * 1680;
      for (int r = 0; r < 8; ++r) {
        const uint8_t* b = src + (8 * g + r) * rb + 210 * s;
        memcpy(out + 2 * r, b + 208, 2);
        for (int w = 0; w < 4; ++w) memcpy(out + 16 + 32 * w + 4 * r, b + 192 + 4 * w, 4);
        for (int h = 0; h < 2; ++h)
          for (int q = 0; q < 8; ++q) {
            for (int k = 0; k < 2; ++k)
              memcpy(out + 144 + 512 * h + 256 * k + 32 * q + 4 * r,
                     b + 64 * h + 32 * k + 4 * q, 4);
            memcpy(out + 1168 + 256 * h + 32 * q + 4 * r, b + 128 + 32 * h + 4 * q, 4);
          }
      }
    }
}

/* Row r of a group back as stored (Q6_K rows of K): repack_q6_kx8 undone for one row. */
static void q6k8_row(const uint8_t* grp, int64_t K, int r, uint8_t* row) {
  for (int64_t s = 0; s < K / 256; ++s) {
    const uint8_t* b = grp + 1680 * s;
    uint8_t* block = row + 210 * s;
    memcpy(block + 208, b + 2 * r, 2);
    for (int w = 0; w < 4; ++w) memcpy(block + 192 + 4 * w, b + 16 + 32 * w + 4 * r, 4);
    for (int h = 0; h < 2; ++h)
      for (int q = 0; q < 8; ++q) {
        for (int k = 0; k < 2; ++k)
          memcpy(block + 64 * h + 32 * k + 4 * q, b + 144 + 512 * h + 256 * k + 32 * q + 4 * r,
                 4);
        memcpy(block + 128 + 32 * h + 4 * q, b + 1168 + 256 * h + 32 * q + 4 * r, 4);
      }
  }
}

#if FAST
/* Byte i of every 32-bit lane as two sign-extended int16 (a row's int8 scale, for madd). */
ALWAYS __m256i q6k8_pick(__m256i v, int i) {
  const char z = (char)0x80;
  return _mm256_srai_epi16(_mm256_shuffle_epi8(v, _mm256_setr_epi8(
      z, i, z, i, z, 4 + i, z, 4 + i, z, 8 + i, z, 8 + i, z, 12 + i, z, 12 + i,
      z, i, z, i, z, 4 + i, z, 4 + i, z, 8 + i, z, 8 + i, z, 12 + i, z, 12 + i)), 8);
}

/* 32 · Σ_j sc_j · Σ xq over 16-group j, one row a lane: the codes' offset of 32, taken out once
 * per super-block (s16: the super-block's 16 per-16 sums of the activations). */
ALWAYS __m256i q6k8_offset(const __m256i* sc, const int16_t* s16) {
  __m256i m = _mm256_setzero_si256();
  for (int w = 0; w < 4; ++w) { /* lanes' int16 pairs: scales (4w, 4w+2) and (4w+1, 4w+3) */
    const int16_t* x = s16 + 4 * w;
    const __m256i x02 = pair16(x[0], x[2]), x13 = pair16(x[1], x[3]);
    const __m256i even = _mm256_srai_epi16(_mm256_slli_epi16(sc[w], 8), 8);
    const __m256i odd = _mm256_srai_epi16(sc[w], 8);
    m = _mm256_add_epi32(m, _mm256_madd_epi16(even, x02));
    m = _mm256_add_epi32(m, _mm256_madd_epi16(odd, x13));
  }
  return _mm256_slli_epi32(m, 5);
}

/* Half h, positions q0, q0 + 1's codes for quarters r = 0..3 (8 rows × 4 weights each). */
ALWAYS void q6k8_codes(const uint8_t* b, int h, int q, __m256i* c) {
  const __m256i low4 = _mm256_set1_epi8(0xF), three = _mm256_set1_epi8(3);
  const __m256i l0 = _mm256_loadu_si256((const __m256i*)(b + 144 + 512 * h + 32 * q));
  const __m256i l1 = _mm256_loadu_si256((const __m256i*)(b + 144 + 512 * h + 256 + 32 * q));
  const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 1168 + 256 * h + 32 * q));
  c[0] = _mm256_or_si256(_mm256_and_si256(l0, low4),
                         _mm256_slli_epi16(_mm256_and_si256(qh, three), 4));
  c[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), three), 4));
  c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                         _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
  c[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), _mm256_set1_epi8(0x30)));
}

#if VNNI
/* One super-block column of the 8 rows against one token's 256 int8s x: Σ sc · Σ c · xq per
 * row (the offset not yet taken out). AVX-512 VNNI: one dpbusd sums a lane's 4 products into
 * int32 (maddubs, its int16 pairs and madd in one instruction), so a 16-group's 4 positions
 * sum in 4 instructions and meet their scale in one 32-bit multiply. */
ALWAYS __m256i q6k8_isum(const uint8_t* b, const __m256i* sc, const uint8_t* x) {
  __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      __m256i c[4][4];
      for (int i = 0; i < 4; ++i) q6k8_codes(b, h, 4 * half + i, c[i]);
      for (int r = 0; r < 4; ++r) {
        const uint8_t* xr = x + 128 * h + 32 * r + 16 * half;
        __m256i t = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i) t = _mm256_dpbusd_epi32(t, c[i][r], bcast4(xr + 4 * i));
        const int j = 8 * h + 2 * r + half; /* the 16-group's scale: byte j % 4 of sc[j / 4] */
        const __m256i s = _mm256_srai_epi32(_mm256_slli_epi32(sc[j / 4], 24 - 8 * (j % 4)), 24);
        isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(t, s));
      }
    }
  return isum;
}
#else
/* One super-block column of the 8 rows against one token's 256 int8s x: Σ sc · Σ c · xq per
 * row (the offset not yet taken out). Pairs of positions: 2 · 2 · 63 · 128 < 2¹⁵. */
ALWAYS __m256i q6k8_isum(const uint8_t* b, const __m256i* sc, const uint8_t* x) {
  __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
    for (int q = 0; q < 8; q += 2) {
      __m256i c0[4], c1[4];
      q6k8_codes(b, h, q, c0);
      q6k8_codes(b, h, q + 1, c1);
      for (int r = 0; r < 4; ++r) {
        const uint8_t* xr = x + 128 * h + 32 * r + 4 * q;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(c0[r], bcast4(xr)),
                                           _mm256_maddubs_epi16(c1[r], bcast4(xr + 4)));
        const int j = 8 * h + 2 * r + q / 4; /* the 16-group's scale */
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, q6k8_pick(sc[j / 4], j % 4)));
      }
    }
  return isum;
}
#endif

ALWAYS void q6k8_scales(const uint8_t* b, __m256i* sc) {
  for (int w = 0; w < 4; ++w) sc[w] = _mm256_loadu_si256((const __m256i*)(b + 16 + 32 * w));
}

/* One group against one token: out[r] (+)= row r · x. */
static void dot_q6k8(const uint8_t* grp, const uint8_t* act, int64_t K, float* out, int add) {
  const float* dx = act_dx(act, K);
  const int16_t* s16 = act_s16(act, K);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t s = 0; s < K / 256; ++s) {
    const uint8_t* b = grp + 1680 * s;
    prefetch_ahead(b, 1680);
    __m256i sc[4];
    q6k8_scales(b, sc);
    const __m256i isum = _mm256_sub_epi32(q6k8_isum(b, sc, act + 256 * s),
                                          q6k8_offset(sc, s16 + 16 * s));
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b)),
                                   _mm256_set1_ps(dx[8 * s]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc);
  }
  if (add) acc = _mm256_add_ps(acc, _mm256_loadu_ps(out));
  _mm256_storeu_ps(out, acc);
}

/* The prompt's products for groups of rows [r0, r1) against TILE tokens (as tile_k8). The
 * codes are rebuilt for each token from the column, which sits in the L1 cache by then. */
ALWAYS void tile_q6k8(const uint8_t* w, int64_t K, int64_t r0, int64_t r1, const uint8_t* act,
                      int64_t ab, const float* d, float* y, int64_t N) {
  for (int64_t g = r0 / 8; g < r1 / 8; ++g) {
    const uint8_t* grp = w + g * (K / 256) * 1680;
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t s = 0; s < K / 256; ++s) {
      const uint8_t* b = grp + 1680 * s;
      __m256i sc[4];
      q6k8_scales(b, sc);
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b));
      for (int i = 0; i < 8; ++i) {
        const uint8_t* a = act + i * ab;
        const __m256i isum = _mm256_sub_epi32(q6k8_isum(b, sc, a + 256 * s),
                                              q6k8_offset(sc, act_s16(a, K) + 16 * s));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                                 _mm256_mul_ps(dv, _mm256_set1_ps(d[8 * s * 8 + i])), acc[i]);
      }
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(y + i * N + 8 * g, acc[i]);
  }
}
#endif
