/* GGML's weight blocks as a GGUF file stores them, read in place (included by stored.c).
 *
 * Every quantized format is seen the same way, 32 weights at a time: u8 codes c (0..63, or
 * int8 for Q8_0), a scale a for the 32 and, per 16 weights, an integer multiplier s (1 except
 * Q6_K's int8 sub-scales) and an offset o, so that weight = a·s·c + o. With the activations
 * quantized to 8 bits per 32 (x ≈ dx·xq, stored.c) a row's dot product is
 *     Σ_blocks a·dx·Σ s·c·xq  +  Σ_16 o·dx·Σ xq
 * — an integer dot product per block (AVX2's maddubs/madd, as llama.cpp does) and a short float
 * dot of the offsets against the activations' per-16 sums. Layouts (ggml-common.h; gguf-py's
 * quants.py dequantizes the same bytes):
 * - Q4_0 (18 bytes / 32): d f16, qs[16]: weight j < 16 = low nibble of qs[j], j + 16 the high
 *   one; value d·(c − 8)              → a = d, o = −8d
 * - Q4_1 (20): d, m f16, qs[16]       → a = d, o = m
 * - Q5_0 (22): d, qh u32, qs[16]: bit j of qh is bit 4 of weight j → a = d, o = −16d
 * - Q5_1 (24): d, m, qh, qs           → a = d, o = m
 * - Q8_0 (34): d, int8 qs[32]         → a = d, o = 0, codes signed
 * - Q4_K (144 / 256): d, dmin f16, scales[12] (eight 6-bit scales sc and mins mn), qs[128]:
 *   sub-block s (32 weights) = chunk s/2 of 32 bytes, low nibbles for s even, high for s odd;
 *   value d·sc·c − dmin·mn            → a = d·sc, o = −dmin·mn
 * - Q5_K (176): d, dmin, scales[12], qh[32], qs[128]: bit s of qh[l] is bit 4 of sub-block s's
 *   weight l                          → as Q4_K
 * - Q6_K (210 / 256): ql[128], qh[64], int8 scales[16], d f16: half h of 128 weights, quarter r
 *   (32 weights, l < 32): low (r < 2) / high (r ≥ 2) nibble of ql[64h + 32(r mod 2) + l] with
 *   bits 2r, 2r + 1 of qh[32h + l]; value d·scales[weight / 16]·(c − 32)
 *                                     → a = d, s = scales, o = −32·d·scales
 * Float formats (F32, F16, BF16) are read as floats against the float activations.
 */
#include <stdint.h>
#include <string.h>

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
       T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30, /* GGML's type numbers */
       T_Q4_0X8 = 102, /* ours: Q4_0 with 8 rows interleaved (stored_rows8.h) */
       T_Q8_0X8 = 108, /* ours: Q8_0 with 8 rows interleaved (stored_rows8q8.h) */
       T_Q4_KX8 = 112, /* ours: Q4_K with 8 rows interleaved (stored_rows8k.h) */
       T_Q6_KX8 = 114 }; /* ours: Q6_K with 8 rows interleaved (stored_rows8q6.h) */

static inline float f16(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  union {
    uint32_t u;
    float f;
  } v = {(uint32_t)(h & 0x7fffu) << 13};
  v.f *= 0x1p112f;
  if ((h & 0x7c00u) == 0x7c00u) v.u |= 0x7f800000u;
  v.u |= (uint32_t)(h & 0x8000u) << 16;
  return v.f;
}

static inline float bf16(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  union {
    uint32_t u;
    float f;
  } v = {(uint32_t)h << 16};
  return v.f;
}

static inline int is_float_type(int64_t t) { return t == T_F32 || t == T_F16 || t == T_BF16; }

/* Bytes of a block and weights in it. */
/* The GGML type an interleaved layout holds (any other type: itself). */
static inline int64_t stored_type(int64_t t) {
  return t == T_Q4_0X8 ? T_Q4_0 : t == T_Q8_0X8 ? T_Q8_0 : t == T_Q4_KX8 ? T_Q4_K
         : t == T_Q6_KX8 ? T_Q6_K : t;
}

static inline int64_t type_block_bytes(int64_t t) {
  switch (stored_type(t)) {
    case T_F32: return 4;
    case T_F16: case T_BF16: return 2;
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    default: return 0;
  }
}

static inline int64_t type_block_weights(int64_t t) {
  if (is_float_type(t)) return 1;
  t = stored_type(t);
  return (t == T_Q4_K || t == T_Q5_K || t == T_Q6_K) ? 256 : 32;
}

static inline int64_t row_bytes(int64_t t, int64_t K) {
  return K / type_block_weights(t) * type_block_bytes(t);
}

/* Q4_K / Q5_K's 6-bit scale and min of sub-block j (GGML's get_scale_min_k4). */
static inline void k_scale_min(int j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/* Block j (of 32 weights) of a row: codes, a, the two 16-weight multipliers and offsets. The
 * plain form every kernel agrees with; hot formats also have AVX2 forms in stored.c. */
static void unpack32(int64_t t, const uint8_t* row, int64_t j, uint8_t* c, float* a,
                     int16_t s[2], float o[2]) {
  s[0] = s[1] = 1;
  if (t == T_Q4_K || t == T_Q5_K || t == T_Q6_K) {
    const int64_t sb = j / 8, sub = j % 8;
    const uint8_t* b = row + sb * type_block_bytes(t);
    if (t == T_Q6_K) {
      const uint8_t *ql = b, *qh = b + 128;
      const int8_t* sc = (const int8_t*)(b + 192);
      const float d = f16(b + 208);
      const int h = sub / 4, r = sub % 4;
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = ql[64 * h + 32 * (r % 2) + l];
        c[l] = (uint8_t)(((r < 2) ? (lo & 0xF) : (lo >> 4)) | (((qh[32 * h + l] >> (2 * r)) & 3) << 4));
      }
      *a = d;
      for (int g = 0; g < 2; ++g) {
        s[g] = sc[8 * h + 2 * r + g];
        o[g] = -32.0f * d * s[g];
      }
      return;
    }
    const float d = f16(b), dmin = f16(b + 2);
    int sc, mn;
    k_scale_min((int)sub, b + 4, &sc, &mn);
    const uint8_t* qs = b + (t == T_Q4_K ? 16 : 48) + 32 * (sub / 2);
    for (int l = 0; l < 32; ++l) c[l] = (sub % 2) ? qs[l] >> 4 : qs[l] & 0xF;
    if (t == T_Q5_K)
      for (int l = 0; l < 32; ++l) c[l] |= ((b[16 + l] >> sub) & 1) << 4;
    *a = d * sc;
    o[0] = o[1] = -dmin * mn;
    return;
  }
  const uint8_t* b = row + j * type_block_bytes(t);
  const float d = f16(b);
  if (t == T_Q8_0) {
    memcpy(c, b + 2, 32);
    *a = d;
    o[0] = o[1] = 0.0f;
    return;
  }
  const int with_min = t == T_Q4_1 || t == T_Q5_1, five = t == T_Q5_0 || t == T_Q5_1;
  const uint8_t* qs = b + 2 + 2 * with_min + 4 * five;
  for (int l = 0; l < 16; ++l) {
    c[l] = qs[l] & 0xF;
    c[l + 16] = qs[l] >> 4;
  }
  if (five) {
    uint32_t qh;
    memcpy(&qh, b + 2 + 2 * with_min, 4);
    for (int l = 0; l < 32; ++l) c[l] |= ((qh >> l) & 1) << 4;
  }
  *a = d;
  o[0] = o[1] = with_min ? f16(b + 2) : (five ? -16.0f * d : -8.0f * d);
}

/* Weights of row (K) as float32, in GGML's own order of operations. */
static void dequant_row(int64_t t, const uint8_t* row, int64_t K, float* out) {
  if (t == T_F32) {
    memcpy(out, row, K * sizeof(float));
    return;
  }
  if (t == T_F16 || t == T_BF16) {
    for (int64_t k = 0; k < K; ++k) out[k] = t == T_F16 ? f16(row + 2 * k) : bf16(row + 2 * k);
    return;
  }
  uint8_t c[32];
  float a, o[2];
  int16_t s[2];
  for (int64_t j = 0; j < K / 32; ++j) {
    unpack32(t, row, j, c, &a, s, o);
    float* y = out + 32 * j;
    for (int l = 0; l < 32; ++l) {
      const int g = l / 16;
      if (t == T_Q8_0) y[l] = (int8_t)c[l] * a;
      else if (t == T_Q6_K) y[l] = a * s[g] * (c[l] - 32);
      else if (t == T_Q4_0) y[l] = (c[l] - 8) * a;
      else if (t == T_Q5_0) y[l] = (c[l] - 16) * a;
      else y[l] = a * c[l] + o[g]; /* Q4_1, Q5_1: d·c + m; Q4_K, Q5_K: d1·c − m1 */
    }
  }
}
