// y = x @ w.T with w stored as bfloat16 and every product and sum in fp32: the operator
// specdec::bf16_weights_linear(x, packed, weight).
//
// A bfloat16 is the top half of a float32, so widening one is a 16-bit shift: when the fp32
// weights hold bfloat16 values (the course zoo's do), the products are the fp32 model's
// products, the sums fp32 sums in another order, and the bytes read per weight half.
//
// Layout (bf16_weights.py packs it): rows in blocks of ROWS; within a block, for each tile of
// 16 columns, the ROWS rows' 16 values one after the other, so that a block is read as one
// sequential stream. x is m rows of k floats (k a multiple of 16, n of ROWS). Passes of more
// than MAX_ROWS rows (a prefill) use PyTorch's kernel on the fp32 weight instead.
//
// It is a C++ operator, not a C function called from Python, because a decode step makes 50
// of these calls: through Python each cost about 10 us more, a fifth of the step.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

constexpr int ROWS = 4;
constexpr int64_t MAX_ROWS = 8;
constexpr int64_t PREFETCH = 1024;  // elements ahead: the hardware prefetcher alone leaves bandwidth unused

static inline __m512 widen(const uint16_t *bits) {
    const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(bits));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}

static inline void prefetch(const uint16_t *tile) {
    _mm_prefetch(reinterpret_cast<const char *>(tile + PREFETCH), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char *>(tile + PREFETCH + 32), _MM_HINT_T0);
}

// IM (1 to 4) input rows against one block of ROWS weight rows: ROWS x IM accumulators, all
// in registers (IM is a constant).
template <int IM>
static void all_rows(const float *x, const uint16_t *block, float *y, int64_t n, int64_t k) {
    __m512 acc[ROWS][IM];
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < IM; i++) acc[r][i] = _mm512_setzero_ps();
    for (int64_t t = 0; t < k; t += 16) {
        const uint16_t *tile = block + t * ROWS;
        prefetch(tile);
        __m512 xs[IM];
        for (int i = 0; i < IM; i++) xs[i] = _mm512_loadu_ps(x + i * k + t);
        for (int r = 0; r < ROWS; r++) {
            const __m512 w = widen(tile + r * 16);
            for (int i = 0; i < IM; i++) acc[r][i] = _mm512_fmadd_ps(xs[i], w, acc[r][i]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < IM; i++) y[i * n + r] = _mm512_reduce_add_ps(acc[r][i]);
}

// IM (5 to 8) input rows: ROWS x IM accumulators would not fit in the 32 registers, so the
// block is swept twice, two weight rows at a time; the second sweep reads it from the L1
// cache, and each weight is still widened once.
template <int IM>
static void two_rows_at_a_time(const float *x, const uint16_t *block, float *y, int64_t n, int64_t k) {
    for (int r0 = 0; r0 < ROWS; r0 += 2) {
        __m512 acc[2][IM];
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < IM; i++) acc[r][i] = _mm512_setzero_ps();
        for (int64_t t = 0; t < k; t += 16) {
            const uint16_t *tile = block + t * ROWS;
            if (r0 == 0) prefetch(tile);
            for (int r = 0; r < 2; r++) {
                const __m512 w = widen(tile + (r0 + r) * 16);
                for (int i = 0; i < IM; i++) acc[r][i] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * k + t), w, acc[r][i]);
            }
        }
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < IM; i++) y[i * n + r0 + r] = _mm512_reduce_add_ps(acc[r][i]);
    }
}

using BlockKernel = void (*)(const float *, const uint16_t *, float *, int64_t, int64_t);
static const BlockKernel KERNELS[MAX_ROWS + 1] = {
    nullptr, all_rows<1>, all_rows<2>, all_rows<3>, all_rows<4>,
    two_rows_at_a_time<5>, two_rows_at_a_time<6>, two_rows_at_a_time<7>, two_rows_at_a_time<8>};

static at::Tensor bf16_weights_linear(const at::Tensor &x, const at::Tensor &packed, const at::Tensor &weight) {
    const int64_t k = x.size(-1), n = weight.size(0), m = x.numel() / k;
    if (m > MAX_ROWS || m == 0) return at::linear(x, weight);
    TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && weight.size(1) == k,
                "bf16_weights_linear: float32 input and weight with matching widths");
    TORCH_CHECK(k % 16 == 0 && n % ROWS == 0 && packed.numel() == n * k && packed.element_size() == 2,
                "bf16_weights_linear: a packed weight of a shape the kernel covers (bf16_weights.fits)");
    const at::Tensor rows = x.contiguous();
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = n;
    at::Tensor out = at::empty(sizes, x.options());
    const float *xs = rows.data_ptr<float>();
    const uint16_t *w = reinterpret_cast<const uint16_t *>(packed.data_ptr());
    float *y = out.data_ptr<float>();
    const BlockKernel kernel = KERNELS[m];
    // torch's own threads (torch.set_num_threads), each a contiguous range of blocks.
    at::parallel_for(0, n / ROWS, 1, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin * ROWS; j < end * ROWS; j += ROWS) kernel(xs, w + j * k, y + j, n, k);
    });
    return out;
}

TORCH_LIBRARY(specdec, library) {
    library.def("bf16_weights_linear(Tensor x, Tensor packed, Tensor weight) -> Tensor");
    library.impl("bf16_weights_linear", c10::DispatchKey::CPU, TORCH_FN(bf16_weights_linear));
}
