// What the one-call operators (llama_pass.cpp, eagle_chain.cpp) share: the course's operators they call
// through the dispatcher, and RMSNorm and the rotary embedding as loops over a few rows.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <cstdint>

// The operators are found when first used: their libraries are loaded before a one-call operator runs.
inline at::Tensor coded_linear(const at::Tensor &x, const at::Tensor &codes, int64_t out_features, int64_t bits) {
    static const auto op = c10::Dispatcher::singleton()
        .findSchemaOrThrow("specdec::gguf_weights_linear", "")
        .typed<at::Tensor(const at::Tensor &, const at::Tensor &, int64_t, int64_t)>();
    return op.call(x, codes, out_features, bits);
}

inline at::Tensor bf16_linear(const at::Tensor &x, const at::Tensor &packed, const at::Tensor &weight) {
    static const auto op = c10::Dispatcher::singleton()
        .findSchemaOrThrow("specdec::bf16_weights_linear", "")
        .typed<at::Tensor(const at::Tensor &, const at::Tensor &, const at::Tensor &)>();
    return op.call(x, packed, weight);
}

// Causal where there is no mask: the queries are the last rows of the keys.
inline at::Tensor attend(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                         const c10::optional<at::Tensor> &mask, double scale) {
    static const auto op = c10::Dispatcher::singleton()
        .findSchemaOrThrow("specdec::few_query_attention", "")
        .typed<at::Tensor(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                          const c10::optional<at::Tensor> &, double, bool)>();
    return op.call(q, k, v, mask, scale, !mask.has_value());
}

// Llama's RMSNorm in fp32, row by row: weight * (x * rsqrt(mean(x^2) + eps)).
inline void rms_norm(const float *x, const float *weight, float *out, int64_t rows, int64_t d, float eps) {
    for (int64_t r = 0; r < rows; r++, x += d, out += d) {
        float squares = 0.0f;
        for (int64_t i = 0; i < d; i++) squares += x[i] * x[i];
        const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(d) + eps);
        for (int64_t i = 0; i < d; i++) out[i] = weight[i] * (x[i] * inverse);
    }
}

// The rotary embedding of one head's head_dim values, Llama's half-split convention: x * cos + (-x2, x1) * sin,
// cos and sin given for the first half (the second half repeats them).
inline void rotate(const float *x, const float *cos, const float *sin, float *out, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        out[i] = x[i] * cos[i] - x[i + half] * sin[i];
        out[i + half] = x[i + half] * cos[i] + x[i] * sin[i];
    }
}
