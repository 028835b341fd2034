// A Llama model's decoder layers for a pass of a few tokens (a decode step, a verification pass) in one
// call, never returning to Python between layers: specdec::llama_layers(...).
//
// Each layer: RMSNorm, q/k/v in one GGUF-code call, the rotary embedding, the new keys and values
// written into the preallocated cache, few-query attention on the cache, o_proj, the residual add;
// RMSNorm, gate/up in one call, SiLU(gate) * up, down_proj, the residual add. The linear layers and
// the attention are the course's operators (gguf_weights.cpp, attention.cpp), called through the
// dispatcher; the small operations are plain loops over a few rows of a few hundred floats. Every row
// is computed as if alone, so a verification pass gives each position what a one-token step gives,
// bit for bit, as with the operators one call at a time.
//
// On SmolLM2 (a 2-core Ice Lake Xeon) a step called from Python operation by operation took 21-24 ms, of
// which the kernels about 6; compiled by torch.compile, 9.4-9.7 ms; in this one call, 7.5 ms, the LM head
// included: the operators' own time and a few microseconds of loops per layer.
//
// ids: [T] the tokens; embedding: [vocabulary, D] their embeddings; cos, sin: [T, head_dim / 2] the rotary embedding at each token's
// position; mask: none (causal) or [1, 1, T, start + T] booleans or floats added to the scores (a tree
// of drafts); keys[l], values[l]: layer l's cache buffers [1, Hkv, capacity, head_dim], written at
// positions start .. start + T - 1; norms: each layer's input and post-attention RMSNorm weights, then
// the final norm's; codes: each layer's packed (q, k, v), o, (gate, up) and down codes; bits: their
// code widths. Returns the final norm of the last layer's output, [T, D], and with keep_inputs each
// layer's input (the residual stream: what a model's hidden_states hold before the last), [L, T, D].
#include <torch/library.h>

#include "pass_ops.h"

static std::tuple<at::Tensor, at::Tensor> llama_layers(const at::Tensor &ids, const at::Tensor &embedding, const at::Tensor &cos, const at::Tensor &sin,
                               const c10::optional<at::Tensor> &mask, at::TensorList keys, at::TensorList values,
                               int64_t start, at::TensorList norms, at::TensorList codes, at::IntArrayRef bits,
                               int64_t heads, int64_t kv_heads, int64_t intermediate, double eps, bool keep_inputs) {
    const int64_t layers = static_cast<int64_t>(keys.size());
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong && ids.is_contiguous(), "llama_layers: ids [T], int64");
    TORCH_CHECK(embedding.dim() == 2 && embedding.scalar_type() == at::kFloat && embedding.is_contiguous(),
                "llama_layers: an embedding [vocabulary, D], float32, contiguous");
    const int64_t t = ids.size(0), d = embedding.size(1), head_dim = d / heads;
    TORCH_CHECK(heads * head_dim == d && heads % kv_heads == 0, "llama_layers: D a multiple of the heads, Hq of Hkv");
    TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(0) == t && cos.size(1) == head_dim / 2 && cos.is_contiguous() &&
                sin.is_contiguous(), "llama_layers: cos and sin [T, head_dim / 2], contiguous");
    TORCH_CHECK(static_cast<int64_t>(values.size()) == layers && static_cast<int64_t>(norms.size()) == 2 * layers + 1 &&
                static_cast<int64_t>(codes.size()) == 4 * layers && static_cast<int64_t>(bits.size()) == 4 * layers,
                "llama_layers: per layer one key and one value buffer, two norms, four codes; then the final norm");
    for (int64_t l = 0; l < layers; l++) {
        for (const at::Tensor &buffer : {keys[l], values[l]})
            TORCH_CHECK(buffer.dim() == 4 && buffer.size(0) == 1 && buffer.size(1) == kv_heads &&
                        buffer.size(3) == head_dim && buffer.size(2) >= start + t && buffer.is_contiguous() &&
                        buffer.scalar_type() == at::kFloat,
                        "llama_layers: cache buffers [1, Hkv, capacity >= start + T, head_dim], float32, contiguous");
    }
    const int64_t q_width = heads * head_dim, kv_width = kv_heads * head_dim;
    const float epsilon = static_cast<float>(eps);
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    const float *cosines = cos.data_ptr<float>(), *sines = sin.data_ptr<float>();

    const at::Tensor h = embedding.index_select(0, ids);
    const auto options = embedding.options();
    at::Tensor normed = at::empty({t, d}, options), query = at::empty({1, heads, t, head_dim}, options);
    at::Tensor gated = at::empty({t, intermediate}, options);
    at::Tensor inputs = at::empty({keep_inputs ? layers : 0, t, d}, options);
    float *hs = h.data_ptr<float>(), *xs = normed.data_ptr<float>(), *qs = query.data_ptr<float>();
    for (int64_t l = 0; l < layers; l++) {
        if (keep_inputs) std::copy(hs, hs + t * d, inputs.data_ptr<float>() + l * t * d);
        rms_norm(hs, norms[2 * l].data_ptr<float>(), xs, t, d, epsilon);
        const at::Tensor qkv = coded_linear(normed, codes[4 * l], q_width + 2 * kv_width, bits[4 * l]);
        const float *projected = qkv.data_ptr<float>();
        float *cached_keys = keys[l].data_ptr<float>(), *cached_values = values[l].data_ptr<float>();
        const int64_t capacity = keys[l].size(2);
        for (int64_t row = 0; row < t; row++) {
            const float *q = projected + row * (q_width + 2 * kv_width), *k = q + q_width, *v = k + kv_width;
            const float *c = cosines + row * (head_dim / 2), *s = sines + row * (head_dim / 2);
            for (int64_t head = 0; head < heads; head++)
                rotate(q + head * head_dim, c, s, qs + (head * t + row) * head_dim, head_dim);
            for (int64_t head = 0; head < kv_heads; head++) {
                const int64_t at_position = (head * capacity + start + row) * head_dim;
                rotate(k + head * head_dim, c, s, cached_keys + at_position, head_dim);
                for (int64_t i = 0; i < head_dim; i++) cached_values[at_position + i] = v[head * head_dim + i];
            }
        }
        const at::Tensor attended = attend(query, keys[l].narrow(2, 0, start + t), values[l].narrow(2, 0, start + t),
                                           mask, scale);
        const at::Tensor output = coded_linear(attended.view({t, d}), codes[4 * l + 1], d, bits[4 * l + 1]);
        const float *os = output.data_ptr<float>();
        for (int64_t i = 0; i < t * d; i++) hs[i] = hs[i] + os[i];

        rms_norm(hs, norms[2 * l + 1].data_ptr<float>(), xs, t, d, epsilon);
        const at::Tensor gate_up = coded_linear(normed, codes[4 * l + 2], 2 * intermediate, bits[4 * l + 2]);
        // SiLU(gate) * up with ATen's own vectorised SiLU, the eager model's.
        at::silu_out(gated, gate_up.narrow(1, 0, intermediate)).mul_(gate_up.narrow(1, intermediate, intermediate));
        const at::Tensor down = coded_linear(gated, codes[4 * l + 3], d, bits[4 * l + 3]);
        const float *ds = down.data_ptr<float>();
        for (int64_t i = 0; i < t * d; i++) hs[i] = hs[i] + ds[i];
    }
    rms_norm(hs, norms[2 * layers].data_ptr<float>(), xs, t, d, epsilon);
    return {normed, inputs};
}

TORCH_LIBRARY_FRAGMENT(specdec, library) {
    library.def("llama_layers(Tensor ids, Tensor embedding, Tensor cos, Tensor sin, Tensor? mask, Tensor[] keys, Tensor[] values, "
                "int start, Tensor[] norms, Tensor[] codes, int[] bits, int heads, int kv_heads, int intermediate, "
                "float eps, bool keep_inputs) -> (Tensor, Tensor)");
    library.impl("llama_layers", c10::DispatchKey::CPU, TORCH_FN(llama_layers));
}
