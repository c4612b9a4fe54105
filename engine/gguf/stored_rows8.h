/* Q4_0 with 8 rows interleaved (T_Q4_0X8; included by stored.c), at the stored size.
 *
 * Why: a row at a time, a 32-weight block costs about 12 instructions (its nibbles unpacked, two
 * multiply-adds, its scale fetched from the row's strided blocks and multiplied in float), so
 * one core multiplies blocks slower than it reads them (bench/stored_gemv.py measures both): the
 * decode step is compute-bound. Eight rows side by side share the activations' loads, their eight
 * scales convert in one instruction, and their integer sums meet in one vector (two levels of
 * hadd): about 6 instructions a row-block. llama.cpp repacks Q4_0 the same way for AVX2.
 *
 * Layout: group g holds rows 8g..8g+7; its block column j (144 bytes, the 8 rows' 18) is the
 * 8 rows' f16 scales in ROW_ORDER (0 2 4 6 1 3 5 7: the order the hadd tree leaves the sums
 * in), then each row's 16 bytes of nibbles in row order (row r at 16 + 16r), unchanged.
 */
static const int ROW_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/* src: rows of GGML Q4_0 (rows a multiple of 8) → dst, the same bytes interleaved. */
void repack_q4_0x8(const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst, int threads) {
  const int64_t J = K / 32, rb = J * 18;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < rows / 8; ++g)
    for (int64_t j = 0; j < J; ++j) {
      uint8_t* out = dst + (g * J + j) * 144;
      for (int i = 0; i < 8; ++i) {
        memcpy(out + 2 * i, src + (8 * g + ROW_ORDER[i]) * rb + 18 * j, 2);
        memcpy(out + 16 + 16 * i, src + (8 * g + i) * rb + 18 * j + 2, 16);
      }
    }
}

/* Row r of a group back as stored (Q4_0 rows of K): its scale and nibbles from each column. */
static void x8_row(const uint8_t* grp, int64_t K, int r, uint8_t* row) {
  const int at = r % 2 ? 4 + r / 2 : r / 2; /* r's place in ROW_ORDER */
  for (int64_t j = 0; j < K / 32; ++j) {
    memcpy(row + 18 * j, grp + 144 * j + 2 * at, 2);
    memcpy(row + 18 * j + 2, grp + 144 * j + 16 + 16 * r, 16);
  }
}

#if FAST
/* The 8 rows' integer sums of one block column against one token's 32 int8s, one lane a row
 * in ROW_ORDER. lo/hi: the 4 vectors of 2 rows' low and high nibbles. */
ALWAYS __m256i x8_isum(const __m256i* lo, const __m256i* hi, const uint8_t* x) {
  const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)x));
  const __m256i xh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(x + 16)));
  __m256i s[4];
#if VNNI /* dpbusd: a lane's 4 products summed into int32 in one instruction */
  for (int p = 0; p < 4; ++p)
    s[p] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo[p], xl), hi[p], xh);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  for (int p = 0; p < 4; ++p) /* [row 2p ×4 | row 2p+1 ×4]; pairs ≤ 2·15·127: no saturation */
    s[p] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo[p], xl),
                                              _mm256_maddubs_epi16(hi[p], xh)), ones);
#endif
  return _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
}

ALWAYS void x8_unpack(const uint8_t* b, __m256i* lo, __m256i* hi) {
  const __m256i low4 = _mm256_set1_epi8(0xF);
  for (int p = 0; p < 4; ++p) {
    const __m256i q = _mm256_loadu_si256((const __m256i*)(b + 16 + 32 * p));
    lo[p] = _mm256_and_si256(q, low4);
    hi[p] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
  }
}

/* y[r] (+)= the lane of row r (lanes in ROW_ORDER). */
static inline void x8_store(__m256 v, float* y, int add) {
  float lanes[8];
  _mm256_storeu_ps(lanes, v);
  for (int i = 0; i < 8; ++i) y[ROW_ORDER[i]] = add ? y[ROW_ORDER[i]] + lanes[i] : lanes[i];
}

/* One group against one token: out[r] (+)= row r · x. */
static void dot_x8(const uint8_t* grp, const uint8_t* act, int64_t K, float* out, int add) {
  const float *dx = act_dx(act, K), *ds = act_ds(act, K);
  __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
  for (int64_t j = 0; j < K / 32; ++j) {
    const uint8_t* b = grp + 144 * j;
    prefetch_ahead(b, 144);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b));
    __m256i lo[4], hi[4];
    x8_unpack(b, lo, hi);
    const __m256i h = x8_isum(lo, hi, act + 32 * j);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(d, _mm256_set1_ps(dx[j])), acc);
    off = _mm256_fmadd_ps(d, _mm256_set1_ps(ds[j]), off);
  }
  x8_store(_mm256_fnmadd_ps(_mm256_set1_ps(8.0f), off, acc), out, add);
}

/* The prompt's products for groups of rows [r0, r1) against TILE tokens (as tile_rows: their
 * activations `ab` bytes apart, `d` their dx and dx·S16 transposed [J][TILE]): each group's
 * block column is unpacked once for the 8 tokens. */
ALWAYS void tile_x8(const uint8_t* w, int64_t K, int64_t r0, int64_t r1, const uint8_t* act,
                    int64_t ab, const float* d, float* y, int64_t N) {
  const int64_t J = K / 32;
  const float *ds0 = d + J * 8, *ds1 = d + 2 * J * 8;
  for (int64_t g = r0 / 8; g < r1 / 8; ++g) {
    const uint8_t* grp = w + g * J * 144;
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < J; ++j) {
      const uint8_t* b = grp + 144 * j;
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b));
      __m256i lo[4], hi[4];
      x8_unpack(b, lo, hi);
      for (int i = 0; i < 8; ++i) {
        const __m256i h = x8_isum(lo, hi, act + i * ab + 32 * j);
        const float* dj = d + j * 8;
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(dv, _mm256_set1_ps(dj[i])),
                                 acc[i]);
        acc[i] = _mm256_fmadd_ps(dv, _mm256_set1_ps(-8.0f * (ds0[j * 8 + i] + ds1[j * 8 + i])),
                                 acc[i]);
      }
    }
    for (int i = 0; i < 8; ++i) x8_store(acc[i], y + i * N + 8 * g, 0);
  }
}
#endif
