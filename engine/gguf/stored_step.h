/* One decode step of a llama-family model on its stored blocks (included by stored.c).
 *
 * The same step as engine/kernels/native_decode.c — rms norm, q/k/v (+ Qwen2's biases, Qwen3's
 * per-head q/k norms), RoPE from the model's own cos/sin tables (Llama 3's frequency factors are
 * in them), attention over the cache, o, SwiGLU, the LM head — inside one OpenMP region with
 * barriers between dependent phases, but every matrix is read where the file's mapping holds it,
 * in its own GGML type, through stored.c's 8-bit-activation kernels. Each matrix's rows are split
 * among the threads; a phase's input is quantized once before its products (the attention's
 * output and the MLP's, the widest, by all threads, a share each; a norm's output by one).
 *
 * Parts: p[l · PARTS + i] / ty[…] for layer l, then p[layers · PARTS + FINAL_NORM / LM_HEAD /
 * EMBED]. Norms and biases are float32 (NULL: absent). The cache is float32
 * [layers][kv_heads][max_tokens][head_dim], as NativeDecoder's, so a torch prefill's K/V copies in.
 * Recording as native_decode.c: rec_slot[l] ≥ 0 keeps layer l's softmax rows in rec_attn
 * [slots][heads][max_tokens]; rec_hidden [layers + 1][hidden] gets the residual stream.
 */

enum { P_IN_NORM, P_Q, P_K, P_V, P_O, P_POST_NORM, P_GATE, P_UP, P_DOWN, P_BQ, P_BK, P_BV,
       P_QN, P_KN, PARTS };
enum { P_FINAL_NORM, P_LM_HEAD, P_EMBED };

typedef struct {
  int64_t layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_tokens;
  float eps, scale;
} StepConfig;

static void norm_row(const float* x, const float* weight, float* out, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  const float inv = 1.0f / sqrtf((float)(ss / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

/* HF's rotate_half convention (the reader puts a llama file's q/k rows in that order). */
static void rotate(float* v, const float* cos_row, const float* sin_row, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * cos_row[i] - b * sin_row[i];
    v[i + half] = b * cos_row[i + half] + a * sin_row[i + half];
  }
}

static void attend_head(const float* q, const float* keys, const float* values, int64_t pos,
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
    const float p = scores[s] /= total;
    for (int64_t i = 0; i < d; ++i) out[i] += p * values[s * d + i];
  }
}

/* This thread's share of y (+)= W x for one stored matrix of n rows (act: x quantized). */
static inline void share(const uint8_t* w, int64_t t, int64_t n, int64_t K, const float* x,
                         const uint8_t* act, float* y, int add, int tid, int nt) {
  int64_t lo, hi;
  split_rows(n, tid, nt, &lo, &hi);
  rows_dot(t, w, K, lo, hi, x, act, y, add);
}

typedef struct {
  float *x, *xn, *qkv, *att, *gate, *up, *scores;
} StepScratch;

static int64_t step_carve(const StepConfig* c, float* base, StepScratch* s) {
  const int64_t sizes[] = {c->hidden, c->hidden, (c->heads + 2 * c->kv_heads) * c->head_dim,
                           c->heads * c->head_dim, c->inter, c->inter, c->heads * c->max_tokens};
  float** slots[] = {&s->x, &s->xn, &s->qkv, &s->att, &s->gate, &s->up, &s->scores};
  int64_t used = 0;
  for (int i = 0; i < 7; ++i) {
    *slots[i] = base ? base + used : NULL;
    used += sizes[i];
  }
  return used;
}

int64_t step_scratch_floats(const StepConfig* c) {
  StepScratch s;
  return step_carve(c, NULL, &s);
}

void stored_step(const StepConfig* c, const uint8_t* const* p, const int64_t* ty,
                 const float* cos_table, const float* sin_table, float* k_cache, float* v_cache,
                 int64_t token, int64_t pos, float* scratch, uint8_t* act, float* logits,
                 int threads, const int64_t* rec_slot, float* rec_attn, float* rec_hidden) {
  const int64_t h = c->hidden, d = c->head_dim, q = c->heads * d, kvd = c->kv_heads * d;
  const int64_t group = c->heads / c->kv_heads, T = c->max_tokens;
  StepScratch s;
  step_carve(c, scratch, &s);
  const int64_t* fin = ty + c->layers * PARTS;
  const uint8_t* const* pf = p + c->layers * PARTS;
  stored_rows(pf[P_EMBED], fin[P_EMBED], h, &token, 1, s.x);
  const float* cos_row = cos_table + pos * d;
  const float* sin_row = sin_table + pos * d;

#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    for (int64_t l = 0; l < c->layers; ++l) {
      const uint8_t* const* P = p + l * PARTS;
      const int64_t* Ty = ty + l * PARTS;
      const int64_t slot = rec_slot && rec_attn ? rec_slot[l] : -1;
      float* kc = k_cache + l * c->kv_heads * T * d;
      float* vc = v_cache + l * c->kv_heads * T * d;
#pragma omp single
      {
        if (rec_hidden) memcpy(rec_hidden + l * h, s.x, h * sizeof(float));
        norm_row(s.x, (const float*)P[P_IN_NORM], s.xn, h, c->eps);
        quantize_act(s.xn, h, act);
      }
      share(P[P_Q], Ty[P_Q], q, h, s.xn, act, s.qkv, 0, tid, nt);
      share(P[P_K], Ty[P_K], kvd, h, s.xn, act, s.qkv + q, 0, tid, nt);
      share(P[P_V], Ty[P_V], kvd, h, s.xn, act, s.qkv + q + kvd, 0, tid, nt);
#pragma omp barrier
#pragma omp single
      {
        for (int b = 0; b < 3; ++b) {
          const float* bias = (const float*)P[P_BQ + b];
          float* out = s.qkv + (b ? q + (b - 1) * kvd : 0);
          if (bias)
            for (int64_t i = 0; i < (b ? kvd : q); ++i) out[i] += bias[i];
        }
        for (int64_t i = 0; i < c->heads + c->kv_heads; ++i) {
          float* v = s.qkv + i * d;
          const float* norm = (const float*)P[i < c->heads ? P_QN : P_KN];
          if (norm) norm_row(v, norm, v, d, c->eps);
          rotate(v, cos_row, sin_row, d);
        }
        for (int64_t i = 0; i < c->kv_heads; ++i) {
          memcpy(kc + (i * T + pos) * d, s.qkv + q + i * d, d * sizeof(float));
          memcpy(vc + (i * T + pos) * d, s.qkv + q + kvd + i * d, d * sizeof(float));
        }
      }
      for (int64_t i = c->heads * tid / nt; i < c->heads * (tid + 1) / nt; ++i) {
        const int64_t kv = i / group;
        attend_head(s.qkv + i * d, kc + kv * T * d, vc + kv * T * d, pos, d, c->scale,
                    s.scores + i * T, s.att + i * d);
        if (slot >= 0)
          memcpy(rec_attn + (slot * c->heads + i) * T, s.scores + i * T, (pos + 1) * sizeof(float));
      }
#pragma omp barrier
      quantize_share(s.att, q, act, tid, nt);
#pragma omp barrier
      share(P[P_O], Ty[P_O], h, q, s.att, act, s.x, 1, tid, nt);
#pragma omp barrier
#pragma omp single
      {
        norm_row(s.x, (const float*)P[P_POST_NORM], s.xn, h, c->eps);
        quantize_act(s.xn, h, act);
      }
      {
        int64_t lo, hi;
        split_rows(c->inter, tid, nt, &lo, &hi);
        rows_dot(Ty[P_GATE], P[P_GATE], h, lo, hi, s.xn, act, s.gate, 0);
        rows_dot(Ty[P_UP], P[P_UP], h, lo, hi, s.xn, act, s.up, 0);
        for (int64_t i = lo; i < hi; ++i) s.gate[i] = s.gate[i] / (1.0f + expf(-s.gate[i])) * s.up[i];
      }
#pragma omp barrier
      quantize_share(s.gate, c->inter, act, tid, nt);
#pragma omp barrier
      share(P[P_DOWN], Ty[P_DOWN], h, c->inter, s.gate, act, s.x, 1, tid, nt);
#pragma omp barrier
    }
#pragma omp single
    {
      if (rec_hidden) memcpy(rec_hidden + c->layers * h, s.x, h * sizeof(float));
      norm_row(s.x, (const float*)pf[P_FINAL_NORM], s.xn, h, c->eps);
      quantize_act(s.xn, h, act);
    }
    share(pf[P_LM_HEAD], fin[P_LM_HEAD], c->vocab, h, s.xn, act, logits, 0, tid, nt);
  }
}
