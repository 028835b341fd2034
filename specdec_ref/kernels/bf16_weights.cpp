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
constexpr int TILE = 16;  // columns per packed tile (COLUMNS in bf16_weights.py)
constexpr int64_t MAX_ROWS = 16;
constexpr int64_t PREFETCH = 2048;  // elements ahead: the hardware prefetcher alone leaves bandwidth unused

// One fp32 vector register and what the kernel does with it: AVX-512 where the CPU has it
// (-march=native), else AVX2 with FMA (most laptops), which covers a tile in two halves.
// ACCUMULATORS: the registers a sweep keeps sums in, the rest holding inputs and weights (on
// AVX2, 13 of 16 timed faster for 5 and 6 input rows than 8).
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int LANES = 16, REGISTERS = 32, ACCUMULATORS = 16;
static inline Vec zero() { return _mm512_setzero_ps(); }
static inline Vec load(const float *p) { return _mm512_loadu_ps(p); }
static inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline float sum(Vec v) { return _mm512_reduce_add_ps(v); }
static inline Vec widen(const uint16_t *bits) {
    const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(bits));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int LANES = 8, REGISTERS = 16, ACCUMULATORS = 13;
static inline Vec zero() { return _mm256_setzero_ps(); }
static inline Vec load(const float *p) { return _mm256_loadu_ps(p); }
static inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline float sum(Vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline Vec widen(const uint16_t *bits) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i *>(bits));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}
#else
#error "bf16_weights.cpp needs AVX-512, or AVX2 with FMA (bf16_weights.available checks the CPU first)"
#endif

// Requests the weight stream PREFETCH elements ahead of tile t of a block's sweep. A block swept
// several times comes from memory in its first sweep only, so each sweep requests 1/SWEEPS of
// the stream: memory stays busy through all of them (the course target's matmuls at 5 input
// rows, AVX2: about 1.3x one row's time this way, 1.5x with every request in the first sweep).
template <int SWEEPS>
static inline void prefetch(const uint16_t *block, int sweep, int64_t t, int64_t k) {
    const uint16_t *ahead = block + (sweep * k + t) * ROWS / SWEEPS + PREFETCH;
    _mm_prefetch(reinterpret_cast<const char *>(ahead), _MM_HINT_T0);
    if constexpr (SWEEPS == 1) _mm_prefetch(reinterpret_cast<const char *>(ahead + 32), _MM_HINT_T0);  // a tile is 2 lines
}

// Weight rows swept at once for IM input rows: as many as keep rows x IM sums in registers.
constexpr int rows_per_sweep(int im) { return ROWS * im <= ACCUMULATORS ? ROWS : 2 * im <= ACCUMULATORS ? 2 : 1; }

// IM (1 to MAX_ROWS) input rows against one block of ROWS weight rows, all accumulators in
// registers (IM is a constant). Where a block needs several sweeps, the later ones read it
// from the L1 cache, and each weight is still widened once. The inputs stay in registers
// across a tile's weight rows where they fit too, else they are reloaded (from L1). Kept ones
// are pinned to registers: left to itself the compiler folds the load into every FMA that uses
// it, and those extra loads slowed 2 to 5 input rows by up to a third (AVX2, from L2).
template <int IM>
static void block_kernel(const float *x, const uint16_t *block, float *y, int64_t n, int64_t k) {
    constexpr int R = rows_per_sweep(IM);
    constexpr bool KEEP_X = R * IM + IM + 1 <= REGISTERS;
    for (int r0 = 0; r0 < ROWS; r0 += R) {
        Vec acc[R][IM];
        for (int r = 0; r < R; r++)
            for (int i = 0; i < IM; i++) acc[r][i] = zero();
        for (int64_t t = 0; t < k; t += TILE) {
            const uint16_t *tile = block + t * ROWS;
            prefetch<ROWS / R>(block, r0 / R, t, k);
            for (int h = 0; h < TILE; h += LANES) {
                Vec xs[KEEP_X ? IM : 1];
                if constexpr (KEEP_X)
                    for (int i = 0; i < IM; i++) {
                        xs[i] = load(x + i * k + t + h);
                        asm volatile("" : "+v"(xs[i]));  // an empty statement that needs xs[i] in a register
                    }
                for (int r = 0; r < R; r++) {
                    const Vec w = widen(tile + (r0 + r) * TILE + h);
                    for (int i = 0; i < IM; i++)
                        acc[r][i] = fmadd(KEEP_X ? xs[i] : load(x + i * k + t + h), w, acc[r][i]);
                }
            }
        }
        for (int r = 0; r < R; r++)
            for (int i = 0; i < IM; i++) y[i * n + r0 + r] = sum(acc[r][i]);
    }
}

using BlockKernel = void (*)(const float *, const uint16_t *, float *, int64_t, int64_t);
static const BlockKernel KERNELS[MAX_ROWS + 1] = {
    nullptr, block_kernel<1>, block_kernel<2>, block_kernel<3>, block_kernel<4>,
    block_kernel<5>, block_kernel<6>, block_kernel<7>, block_kernel<8>,
    block_kernel<9>, block_kernel<10>, block_kernel<11>, block_kernel<12>,
    block_kernel<13>, block_kernel<14>, block_kernel<15>, block_kernel<16>};

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
