// Attention for a pass of a few query rows on a KV cache (a decode step, a verification pass), one
// query row at a time: specdec::few_query_attention(q, k, v, mask, scale, causal).
//
// out[b, t, h] = softmax(scale * q[b, h, t] . k[b, h / group] + mask[t]) @ v[b, h / group], every
// product and sum in fp32. A row's scores, softmax and weighted sum are computed in the same order
// whether it is alone or one of a pass's rows, so a verification pass gives each position what a
// one-token step gives, bit for bit (with PyTorch's CPU kernel, a SmolLM2 verification pass's logits
// differ from the one-token steps' in the last bits). It also sets up no blocks per call: on SmolLM2's
// shapes a layer's attention is a few microseconds of arithmetic.
//
// q: [B, Hq, T, D]; k, v: [B, Hkv, S, D] (Hq a multiple of Hkv, D a multiple of 8, the last dimension
// contiguous); mask: none, or [B or 1, Hq or 1, T, S] booleans (True: the row reads the key) or floats
// added to the scores. causal (no mask): row t reads the first S - T + t + 1 keys. Returns [B, T, Hq, D].
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <vector>

constexpr int64_t MAX_QUERIES = 16;
constexpr int64_t MAX_HEAD_DIM = 256;

static inline float total(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// e^x on 8 lanes, 0 below -87 (where e^x leaves the normal floats) and for -inf: x = n ln 2 + r with
// |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact), e^r by a degree-7 polynomial (Cephes' expf
// coefficients), 2^n put into the exponent bits.
static inline __m256 exp8(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(exponent)), keep);
}

struct Mask {
    const bool *reads = nullptr;   // boolean mask, or
    const float *added = nullptr;  // additive mask
    int64_t batch = 0, head = 0, row = 0, key = 0;  // strides (0 where broadcast)
};

// One query row: scores into `scores` (S rounded up to 8, the tail -inf), then the weighted sum of
// v into `out` (D floats).
static void attend_row(const float *q, const float *k, const float *v, int64_t key_stride, int64_t value_stride,
                       int64_t keys, int64_t d, float scale, const bool *reads, const float *added,
                       int64_t mask_key, float *scores, float *out) {
    const float lowest = -std::numeric_limits<float>::infinity();
    // Four keys at a time: four independent chains of fused multiply-adds (each key's sum in the same
    // order as alone), instead of one chain waiting on the latency of the last.
    int64_t j = 0;
    for (; j + 4 <= keys; j += 4) {
        const float *key = k + j * key_stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t c = 0; c < d; c += 8) {
            const __m256 x = _mm256_loadu_ps(q + c);
            a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(key + c), a0);
            a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(key + key_stride + c), a1);
            a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(key + 2 * key_stride + c), a2);
            a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(key + 3 * key_stride + c), a3);
        }
        scores[j] = total(a0), scores[j + 1] = total(a1), scores[j + 2] = total(a2), scores[j + 3] = total(a3);
    }
    for (; j < keys; j++) {
        const float *key = k + j * key_stride;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t c = 0; c < d; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(key + c), acc);
        scores[j] = total(acc);
    }
    float top = lowest;
    for (j = 0; j < keys; j++) {
        float score = scores[j] * scale;
        if (reads != nullptr && !reads[j * mask_key]) score = lowest;
        if (added != nullptr) score += added[j * mask_key];
        scores[j] = score;
        top = score > top ? score : top;
    }
    const int64_t padded = (keys + 7) / 8 * 8;
    for (int64_t j = keys; j < padded; j++) scores[j] = lowest;
    __m256 acc[MAX_HEAD_DIM / 8];
    for (int64_t c = 0; c < d / 8; c++) acc[c] = _mm256_setzero_ps();
    if (top == lowest) {  // a row that reads no key: zeros
        for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(out + c, acc[c / 8]);
        return;
    }
    __m256 sums = _mm256_setzero_ps();
    const __m256 shift = _mm256_set1_ps(top);
    for (int64_t j = 0; j < padded; j += 8) {
        const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), shift));
        sums = _mm256_add_ps(sums, p);
        _mm256_storeu_ps(scores + j, p);
    }
    for (int64_t j = 0; j < keys; j++) {
        if (scores[j] == 0.0f) continue;
        const __m256 p = _mm256_set1_ps(scores[j]);
        const float *value = v + j * value_stride;
        for (int64_t c = 0; c < d / 8; c++) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(value + 8 * c), acc[c]);
    }
    const __m256 norm = _mm256_set1_ps(total(sums));
    for (int64_t c = 0; c < d / 8; c++) _mm256_storeu_ps(out + 8 * c, _mm256_div_ps(acc[c], norm));
}

static at::Tensor few_query_attention(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                      const c10::optional<at::Tensor> &mask, double scale, bool causal) {
    TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "few_query_attention: 4-d q, k and v");
    TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
                value.scalar_type() == at::kFloat, "few_query_attention: float32 q, k and v");
    const int64_t b = query.size(0), heads = query.size(1), t = query.size(2), d = query.size(3);
    const int64_t kv_heads = key.size(1), s = key.size(2);
    TORCH_CHECK(t >= 1 && t <= MAX_QUERIES, "few_query_attention: 1 to 16 query rows");
    TORCH_CHECK(d % 8 == 0 && d <= MAX_HEAD_DIM, "few_query_attention: a head size that is a multiple of 8, at most 256");
    TORCH_CHECK(key.sizes() == value.sizes() && key.size(0) == b && key.size(3) == d && heads % kv_heads == 0,
                "few_query_attention: k and v of one shape, [B, Hkv, S, D] with Hq a multiple of Hkv");
    TORCH_CHECK(s >= t, "few_query_attention: at least as many keys as query rows");
    const at::Tensor q = query.stride(3) == 1 ? query : query.contiguous();
    const at::Tensor k = key.stride(3) == 1 ? key : key.contiguous();
    const at::Tensor v = value.stride(3) == 1 ? value : value.contiguous();
    Mask m;
    at::Tensor expanded;
    if (mask.has_value()) {
        TORCH_CHECK(!causal, "few_query_attention: a mask or causal, not both");
        TORCH_CHECK(mask->dim() == 4 && (mask->scalar_type() == at::kBool || mask->scalar_type() == at::kFloat),
                    "few_query_attention: a 4-d boolean or float32 mask");
        expanded = mask->expand({b, heads, t, s});
        m.batch = expanded.stride(0), m.head = expanded.stride(1), m.row = expanded.stride(2), m.key = expanded.stride(3);
        if (expanded.scalar_type() == at::kBool) m.reads = expanded.data_ptr<bool>();
        else m.added = expanded.data_ptr<float>();
    }
    at::Tensor out = at::empty({b, t, heads, d}, query.options());
    const float *qs = q.data_ptr<float>(), *ks = k.data_ptr<float>(), *vs = v.data_ptr<float>();
    float *os = out.data_ptr<float>();
    const int64_t group = heads / kv_heads, padded = (s + 7) / 8 * 8;
    at::parallel_for(0, b * heads * t, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> scores(padded);
        for (int64_t item = begin; item < end; item++) {
            const int64_t i = item / (heads * t), h = item / t % heads, row = item % t;
            const int64_t keys = causal ? s - t + row + 1 : s;
            const int64_t mask_at = i * m.batch + h * m.head + row * m.row;
            attend_row(qs + i * q.stride(0) + h * q.stride(1) + row * q.stride(2),
                       ks + i * k.stride(0) + h / group * k.stride(1), vs + i * v.stride(0) + h / group * v.stride(1),
                       k.stride(2), v.stride(2), keys, d, static_cast<float>(scale),
                       m.reads ? m.reads + mask_at : nullptr, m.added ? m.added + mask_at : nullptr, m.key,
                       scores.data(), os + ((i * t + row) * heads + h) * d);
        }
    });
    return out;
}

TORCH_LIBRARY_FRAGMENT(specdec, library) {
    library.def("few_query_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool causal) -> Tensor");
    library.impl("few_query_attention", c10::DispatchKey::CPU, TORCH_FN(few_query_attention));
}
