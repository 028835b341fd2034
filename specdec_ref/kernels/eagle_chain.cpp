// An EAGLE head's greedy chain of drafts in one call: specdec::eagle_greedy_chain(...).
//
// The head (specdec_ref/eagle.py: fc over [embedding; feature], then one Llama decoder layer without its
// input norm) reads the tokens whose target features are new, then drafts num_tokens tokens, each step
// reading the token it drafted and the feature it predicted. Its linear layers are the bf16-weight
// operator (bf16_weights.cpp), its LM head rows the GGUF-code operator (gguf_weights.cpp), its attention
// the few-query operator (attention.cpp), called through the dispatcher; RMSNorm, the rotary embedding
// and the argmax are loops here. Step by step from Python, a draft of SmolLM2's head took about 1.6 ms,
// two thirds of it Python and dispatch around 0.7 ms of weights.
//
// ids: [m] token ids, features: [m, D] the target's features before them; embedding: [vocabulary, D];
// keys, values: the head's cache [1, Hkv, S, head_dim]; cos, sin: [P, head_dim / 2] the rotary embedding
// at positions 0 .. P - 1 (P >= S + m + num_tokens - 1), the new tokens at S, S + 1, ...; layers: fc, q, k,
// v, o, gate, up, down, each its packed bf16 weight then its fp32 weight; norm: the post-attention
// RMSNorm's weight; lm_codes: the LM head rows' Q8_0 or Q4_1 codes (lm_rows rows of lm_bits); draft_vocab:
// each row's target id (empty: row r is token r). Returns the drafts (target ids), the other candidates
// - 1 best first tokens (target ids, best first), and the cache with the new positions.
#include <torch/library.h>

#include <tuple>

#include "pass_ops.h"

enum Layer { FC, Q, K, V, O, GATE, UP, DOWN, LAYERS };

// Layer `layer` of the head: its packed bf16 weight, then its fp32 weight, in `layers`.
static at::Tensor linear(const at::Tensor &x, at::TensorList layers, int layer) {
    return bf16_linear(x, layers[2 * layer], layers[2 * layer + 1]);
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> eagle_greedy_chain(
    const at::Tensor &ids, const at::Tensor &features, const at::Tensor &embedding, const at::Tensor &keys,
    const at::Tensor &values, const at::Tensor &cos, const at::Tensor &sin, int64_t num_tokens, int64_t candidates,
    at::TensorList layers, const at::Tensor &norm, double eps, const at::Tensor &lm_codes, int64_t lm_rows,
    int64_t lm_bits, const at::Tensor &draft_vocab, int64_t heads) {
    const int64_t m = ids.size(0), d = embedding.size(1), head_dim = d / heads, half = head_dim / 2;
    const int64_t kv_heads = keys.size(1), cached = keys.size(2), total = cached + m + num_tokens - 1;
    TORCH_CHECK(ids.dim() == 1 && m >= 1 && ids.scalar_type() == at::kLong && ids.is_contiguous(),
                "eagle_greedy_chain: ids [m], int64, at least one");
    TORCH_CHECK(features.dim() == 2 && features.size(0) == m && features.size(1) == d && features.is_contiguous() &&
                features.scalar_type() == at::kFloat, "eagle_greedy_chain: features [m, D], float32, contiguous");
    TORCH_CHECK(num_tokens >= 1 && candidates >= 1 && static_cast<int64_t>(layers.size()) == 2 * LAYERS,
                "eagle_greedy_chain: at least one draft and one candidate; eight layers, each packed and fp32");
    TORCH_CHECK(keys.dim() == 4 && keys.sizes() == values.sizes() && keys.size(0) == 1 && keys.size(3) == head_dim &&
                keys.is_contiguous() && values.is_contiguous() && heads % kv_heads == 0,
                "eagle_greedy_chain: a cache [1, Hkv, S, head_dim] of keys and one of values, contiguous");
    TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(0) >= total && cos.size(1) == half &&
                cos.is_contiguous() && sin.is_contiguous(), "eagle_greedy_chain: cos and sin [P >= S + m + k - 1, head_dim / 2]");
    TORCH_CHECK(draft_vocab.numel() == 0 || draft_vocab.numel() == lm_rows, "eagle_greedy_chain: one target id per LM head row");

    const auto options = embedding.options();
    at::Tensor new_keys = at::empty({1, kv_heads, total, head_dim}, options);
    at::Tensor new_values = at::empty({1, kv_heads, total, head_dim}, options);
    new_keys.narrow(2, 0, cached).copy_(keys);
    new_values.narrow(2, 0, cached).copy_(values);
    float *ks = new_keys.data_ptr<float>(), *vs = new_values.data_ptr<float>();
    const float *cosines = cos.data_ptr<float>(), *sines = sin.data_ptr<float>(), *gamma = norm.data_ptr<float>();
    const int64_t *vocab = draft_vocab.numel() ? draft_vocab.data_ptr<int64_t>() : nullptr;
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));

    at::Tensor drafts = at::empty({num_tokens}, ids.options()), siblings = at::empty({0}, ids.options());
    at::Tensor step_ids = ids, step_features = features;
    int64_t position = cached;
    for (int64_t step = 0; step < num_tokens; step++) {
        const int64_t rows = step_ids.size(0);
        const at::Tensor inputs = at::cat({embedding.index_select(0, step_ids), step_features}, 1);
        const at::Tensor x = linear(inputs, layers, FC);
        const at::Tensor q = linear(x, layers, Q), k = linear(x, layers, K), v = linear(x, layers, V);
        at::Tensor query = at::empty({1, heads, rows, head_dim}, options);
        const float *qs = q.data_ptr<float>(), *kn = k.data_ptr<float>(), *vn = v.data_ptr<float>();
        float *qr = query.data_ptr<float>();
        for (int64_t row = 0; row < rows; row++) {
            const float *c = cosines + (position + row) * half, *s = sines + (position + row) * half;
            for (int64_t head = 0; head < heads; head++)
                rotate(qs + row * d + head * head_dim, c, s, qr + (head * rows + row) * head_dim, head_dim);
            for (int64_t head = 0; head < kv_heads; head++) {
                const int64_t at_position = (head * total + position + row) * head_dim;
                rotate(kn + (row * kv_heads + head) * head_dim, c, s, ks + at_position, head_dim);
                for (int64_t i = 0; i < head_dim; i++) vs[at_position + i] = vn[(row * kv_heads + head) * head_dim + i];
            }
        }
        position += rows;
        const at::Tensor attended =
            attend(query, new_keys.narrow(2, 0, position), new_values.narrow(2, 0, position), c10::nullopt, scale);
        const at::Tensor h = x + linear(attended.view({rows, d}), layers, O);
        // The head's RMSNorm on the last row only from here on: the rows before it are cached already and
        // predict nothing the chain reads.
        at::Tensor normed = at::empty({1, d}, options);
        rms_norm(h.data_ptr<float>() + (rows - 1) * d, gamma, normed.data_ptr<float>(), 1, d, static_cast<float>(eps));
        const at::Tensor mlp = linear(at::silu(linear(normed, layers, GATE)) * linear(normed, layers, UP), layers, DOWN);
        const at::Tensor predicted = h.narrow(0, rows - 1, 1) + mlp;
        const at::Tensor logits = coded_linear(predicted, lm_codes, lm_rows, lm_bits);
        if (step == 0 && candidates > 1) {
            siblings = std::get<1>(logits.view(-1).topk(std::min(candidates, lm_rows))).narrow(0, 1, std::min(candidates, lm_rows) - 1);
            if (vocab != nullptr) siblings = draft_vocab.index_select(0, siblings);
        }
        const float *ls = logits.data_ptr<float>();
        int64_t best = 0;  // the first of equal maxima, as torch.argmax
        for (int64_t r = 1; r < lm_rows; r++) best = ls[r] > ls[best] ? r : best;
        const int64_t token = vocab != nullptr ? vocab[best] : best;
        drafts.data_ptr<int64_t>()[step] = token;
        step_ids = at::full({1}, token, ids.options());
        step_features = predicted;
    }
    return {drafts, siblings, new_keys, new_values};
}

TORCH_LIBRARY_FRAGMENT(specdec, library) {
    library.def("eagle_greedy_chain(Tensor ids, Tensor features, Tensor embedding, Tensor keys, Tensor values, "
                "Tensor cos, Tensor sin, int num_tokens, int candidates, Tensor[] layers, Tensor norm, float eps, "
                "Tensor lm_codes, int lm_rows, int lm_bits, Tensor draft_vocab, int heads) -> "
                "(Tensor, Tensor, Tensor, Tensor)");
    library.impl("eagle_greedy_chain", c10::DispatchKey::CPU, TORCH_FN(eagle_greedy_chain));
}
