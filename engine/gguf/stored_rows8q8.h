/* Q8_0 with 8 rows interleaved (T_Q8_0X8; included by stored.c), at the stored size.
 *
 * Why: a row at a time, the prompt's tile multiplies one row's block with 8 tokens and must
 * then turn 8 vectors of partial sums into one (transpose_sum8: a tree of hadds) for every
 * block of every row, and the decode step does the same per 8 blocks; so both are
 * compute-bound on 2 cores (llama.cpp repacks Q8_0 too). Eight rows side by side, one 32-bit
 * lane a row, need no reduction at all: 4 codes of each of the 8 rows meet one broadcast of
 * the token's 4 activations.
 *
 * Layout: group g holds rows 8g..8g+7; its block column j (272 bytes, the 8 rows' 34) is the 8
 * rows' f16 scales in row order, then for position q (0..7) 32 bytes: codes 4q..4q+3 of each
 * row (row r at 16 + 32q + 4r), each code c stored as the unsigned byte c + 128 (its sign bit
 * flipped). Why the flip: AVX-512 VNNI's dpbusd multiplies unsigned bytes by signed ones, so
 * Σ (c + 128)·x is one instruction, and 128·Σx, which the activations carry already (dx·Σxq
 * per 32: stored.c), is taken out once per block. The AVX2 kernels flip the bit back.
 */

/* src: rows of GGML Q8_0 (rows a multiple of 8) → dst, the same bytes interleaved (codes
 * with their sign bit flipped). */
void repack_q8_0x8(const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst, int threads) {
  const int64_t J = K / 32, rb = J * 34;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < rows / 8; ++g)
    for (int64_t j = 0; j < J; ++j) {
      uint8_t* out = dst + (g * J + j) * 272;
      for (int r = 0; r < 8; ++r) {
        const uint8_t* b = src + (8 * g + r) * rb + 34 * j;
        memcpy(out + 2 * r, b, 2);
        for (int q = 0; q < 8; ++q)
          for (int i = 0; i < 4; ++i) out[16 + 32 * q + 4 * r + i] = b[2 + 4 * q + i] ^ 0x80;
      }
    }
}

/* Row r of a group back as stored (Q8_0 rows of K): repack_q8_0x8 undone for one row. */
static void q8x8_row(const uint8_t* grp, int64_t K, int r, uint8_t* row) {
  for (int64_t j = 0; j < K / 32; ++j) {
    const uint8_t* b = grp + 272 * j;
    memcpy(row + 34 * j, b + 2 * r, 2);
    for (int q = 0; q < 8; ++q)
      for (int i = 0; i < 4; ++i) row[34 * j + 2 + 4 * q + i] = b[16 + 32 * q + 4 * r + i] ^ 0x80;
  }
}

#if FAST
/* Σ over the block's 32 weights of (c + 128)·x for the 8 rows, one row a lane (`s` added to). */
ALWAYS __m256i q8x8_isum(const uint8_t* b, const uint8_t* x, __m256i s) {
#if VNNI
  for (int q = 0; q < 8; ++q)
    s = _mm256_dpbusd_epi32(s, _mm256_loadu_si256((const __m256i*)(b + 16 + 32 * q)),
                            bcast4(x + 4 * q));
  return s;
#else /* c back to signed; |c|·sign(x, c) pairs ≤ 2·128·127: no saturation; + 128·Σx after */
  const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
  __m256i sx = _mm256_setzero_si256();
  for (int q = 0; q < 8; ++q) {
    const __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(b + 16 + 32 * q)), flip);
    const __m256i xq = bcast4(x + 4 * q);
    s = _mm256_add_epi32(s, _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(xq, c)), ones));
    sx = _mm256_add_epi32(sx, _mm256_madd_epi16(_mm256_maddubs_epi16(flip, xq), ones));
  }
  return _mm256_add_epi32(s, sx); /* the same Σ (c + 128)·x as dpbusd's */
#endif
}

/* One group against one token: out[r] (+)= row r · x. */
static void dot_q8x8(const uint8_t* grp, const uint8_t* act, int64_t K, float* out, int add) {
  const float *dx = act_dx(act, K), *ds = act_ds(act, K);
  __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
  for (int64_t j = 0; j < K / 32; ++j) {
    const uint8_t* b = grp + 272 * j;
    prefetch_ahead(b, 272);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b));
    const __m256i s = q8x8_isum(b, act + 32 * j, _mm256_setzero_si256());
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(dx[j])), acc);
    off = _mm256_fmadd_ps(d, _mm256_set1_ps(ds[j]), off);
  }
  acc = _mm256_fnmadd_ps(_mm256_set1_ps(128.0f), off, acc);
  if (add) acc = _mm256_add_ps(acc, _mm256_loadu_ps(out));
  _mm256_storeu_ps(out, acc);
}

/* The prompt's products for groups of rows [r0, r1) against TILE tokens (as tile_x8): each
 * block column's codes are read once for the 8 tokens. */
ALWAYS void tile_q8x8(const uint8_t* w, int64_t K, int64_t r0, int64_t r1, const uint8_t* act,
                      int64_t ab, const float* d, float* y, int64_t N) {
  const int64_t J = K / 32;
  const float *ds0 = d + J * 8, *ds1 = d + 2 * J * 8;
  for (int64_t g = r0 / 8; g < r1 / 8; ++g) {
    const uint8_t* grp = w + g * J * 272;
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < J; ++j) {
      const uint8_t* b = grp + 272 * j;
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b));
      for (int i = 0; i < 8; ++i) {
        const __m256i s = q8x8_isum(b, act + i * ab + 32 * j, _mm256_setzero_si256());
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dv, _mm256_set1_ps(d[j * 8 + i])),
                                 acc[i]);
        acc[i] = _mm256_fmadd_ps(dv, _mm256_set1_ps(-128.0f * (ds0[j * 8 + i] + ds1[j * 8 + i])),
                                 acc[i]);
      }
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(y + i * N + 8 * g, acc[i]);
  }
}
#endif
