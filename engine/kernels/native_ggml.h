/* Kernels that read GGML's own blocks, byte for byte as a GGUF file stores them (included by
 * native_decode.c after BLOCK, Fmt, the format enum and half_to_float): F16, Q5_1 and Q5_K.
 *
 * Q5_0, Q4_K and Q6_K, the types of llama.cpp's Q4_K_M / Q6_K mixes on models like SmolLM2, are
 * not read here: native_records.py re-lays their blocks at pack time into group records
 * (native_groups.h) holding the same values, whose AVX-512 kernels run near the memory roof;
 * the row kernels here read a row's super-blocks one at a time in plain loops, compute-bound
 * well below it. A matrix in these formats is its GGML rows in order, padded with zero rows
 * (scale 0: value 0) to a multiple of BLOCK; the kernel takes a block's rows one at a time, each
 * row one sequential stream of its blocks. Layouts (ggml-common.h, gguf-py's quants.py):
 * - F16: K float16;
 * - Q5_0 (32 weights, 22 bytes): d f16, qh u32, qs[16]; weight j < 16 = low nibble of qs[j] with
 *   bit j of qh as bit 4, weight j + 16 = high nibble with bit j + 16; value d·(c − 16);
 * - Q5_1 (24 bytes): d f16, m f16, qh, qs as Q5_0; value d·c + m;
 * - Q4_K (256 weights, 144 bytes): d f16, dmin f16, scales[12] (eight 6-bit scales sc and
 *   minimums mn, unpacked by k_scales), qs[128]; sub-block s of 32 weights: chunk s / 2 of 32
 *   bytes, low nibbles for s even, high for s odd; value d·sc[s]·c − dmin·mn[s];
 * - Q5_K (176 bytes): d, dmin, scales[12], qh[32], qs[128]: Q4_K's codes with bit s of qh[l] as
 *   bit 4 of sub-block s's weight l;
 * - Q6_K (256 weights, 210 bytes): ql[128], qh[64], int8 scales[16], d f16; each half of 128
 *   weights, quarter r (32 weights): low (r < 2) or high (r ≥ 2) nibbles of ql[32·(r mod 2) + l]
 *   with bits 2r, 2r + 1 of qh[l] on top; value d·scales[weight / 16]·(c − 32).
 * Sums of x over 32 weights (sx, computed once per gemv) carry the minimums (Σ (a·c + m)·x =
 * a·Σ c·x + m·Σ x); signed codes are subtracted before the multiply, so a zero-point-free format
 * multiplies by exactly its stored values. The Q5_0, Q4_K and Q6_K layouts are listed for
 * native_records.py, which unpacks them.
 */

static inline float load_half(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, sizeof(h));
  return half_to_float(h);
}

/* Q5_0, Q4_K and Q6_K are re-laid into group records (native_groups.h); these stay as stored. */
static inline int is_ggml_row(int64_t format) {
  return format == F16 || format == Q5_1 || format == Q5_K;
}

/* Bytes of one GGML row of K weights in `format`. */
static inline int64_t ggml_row_bytes(int64_t format, int64_t K) {
  switch (format) {
    case F16: return 2 * K;
    case Q5_1: return K / 32 * 24;
    default: return K / 256 * 176; /* Q5_K */
  }
}

static inline float row_f16(const uint8_t* restrict p, const float* restrict x, int64_t K) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < K; ++k) {
    uint16_t h;
    memcpy(&h, p + 2 * k, sizeof(h));
    s += half_to_float(h) * x[k];
  }
  return s;
}

/* The sums below keep one partial sum per vector lane across a whole row (lane[l] += scale ·
 * code · x) and add the lanes up once at its end: a horizontal sum per 16 or 32 weights would
 * cost more than the weights' own arithmetic. */
static inline float lanes_sum(const float* lane, int n) {
  float s = 0.0f;
  for (int l = 0; l < n; ++l) s += lane[l];
  return s;
}

/* Q5_1: one row. */
static inline float row_q5_1(const uint8_t* restrict p, const float* restrict x,
                             const float* restrict sx, int64_t K) {
  float lane[16] = {0.0f}, minimums = 0.0f;
  for (int64_t b = 0; b < K / 32; ++b, p += 24) {
    uint32_t qh;
    memcpy(&qh, p + 4, sizeof(qh));
    const uint8_t* qs = p + 8;
    const float* xb = x + 32 * b;
    const float d = load_half(p);
#pragma omp simd
    for (int j = 0; j < 16; ++j) {
      const int c0 = (qs[j] & 15) | (((qh >> j) & 1) << 4);
      const int c1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      lane[j] += d * ((float)c0 * xb[j] + (float)c1 * xb[j + 16]);
    }
    minimums += load_half(p + 2) * sx[b];
  }
  return lanes_sum(lane, 16) + minimums;
}

/* The eight 6-bit scales and minimums of a Q4_K / Q5_K super-block (GGML's get_scale_min_k4). */
static inline void k_scales(const uint8_t* q, float* sc, float* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = (float)(q[j] & 63);
    mn[j] = (float)(q[j + 4] & 63);
    sc[j + 4] = (float)((q[j + 8] & 15) | ((q[j] >> 6) << 4));
    mn[j + 4] = (float)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
  }
}

/* Q5_K: one row; sx[s] = Σ x over sub-block s (32 weights). (Q4_K's codes without bit 4 would
 * run here too, but Q4_K is re-laid into group records instead.) */
static inline float row_k45(const uint8_t* restrict p, int64_t format, const float* restrict x,
                            const float* restrict sx, int64_t K) {
  const int five = format == Q5_K, bytes = five ? 176 : 144;
  float lane[32] = {0.0f}, minimums = 0.0f;
  for (int64_t b = 0; b < K / 256; ++b, p += bytes) {
    const float d = load_half(p), dmin = load_half(p + 2);
    float sc[8], mn[8];
    k_scales(p + 4, sc, mn);
    const uint8_t* qh = p + 16;
    const uint8_t* qs = p + (five ? 48 : 16);
    const float* xb = x + 256 * b;
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = qs + 32 * c;
      const float* xs = xb + 64 * c;
      const float d_lo = d * sc[2 * c], d_hi = d * sc[2 * c + 1];
#pragma omp simd
      for (int l = 0; l < 32; ++l) {
        const int h0 = five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0;
        const int h1 = five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
        lane[l] += d_lo * (float)((q[l] & 15) | h0) * xs[l] +
                   d_hi * (float)((q[l] >> 4) | h1) * xs[32 + l];
      }
      minimums += (dmin * mn[2 * c]) * sx[8 * b + 2 * c] +
                  (dmin * mn[2 * c + 1]) * sx[8 * b + 2 * c + 1];
    }
  }
  return lanes_sum(lane, 32) - minimums;
}

/* acc (BLOCK) = BLOCK GGML rows of `format` · x; sx = Σ x per 32 weights. */
static inline void ggml_block_dot(const uint8_t* restrict p, int64_t format,
                                  const float* restrict x, const float* restrict sx, int64_t K,
                                  float* restrict acc) {
  const int64_t row = ggml_row_bytes(format, K);
  for (int j = 0; j < BLOCK; ++j, p += row) {
    __builtin_prefetch(p + PREFETCH);
    if (format == F16)
      acc[j] = row_f16(p, x, K);
    else if (format == Q5_1)
      acc[j] = row_q5_1(p, x, sx, K);
    else
      acc[j] = row_k45(p, format, x, sx, K);
  }
}
