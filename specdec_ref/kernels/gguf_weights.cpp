// y = x @ w.T where every 32 weights of a row are a GGUF block code, read as that code, every
// product and sum in fp32: the operator specdec::gguf_weights_linear(x, packed, out_features, bits).
//
// Q4_1 (bits = 4): w = d * q + m, q a 4-bit unsigned code; Q8_0 (bits = 8): w = d * q, q a signed
// byte; d and m are float16 values, one pair per 32 weights. d * q is exact in fp32 (11 + 8
// significant bits at most), so fma(d, q, m) is the fp32 weight the de-quantised model holds, bit
// for bit (gguf_weights.py checks every layer before using it): the products are the fp32
// model's products and the sums fp32 sums in another order, from 5 or 9 bits per weight instead
// of 32 (6 or 9 here: d, and Q4_1's m, are kept as fp32).
//
// Layout (gguf_weights.py packs it): rows in blocks of ROWS; a block is one sequential stream of
// groups of 32 columns, each group its ROWS rows' (d, m) as floats (d alone at 8 bits), then each
// row's codes for the group: 32 bytes at 8 bits; 16 bytes at 4 bits, byte 4 * (c % 4) + c / 4
// holding column c (0-15) in its low half and column c + 16 in its high half, the order in which
// AVX-512 lanes pick them (decode below; AVX2 puts them back in column order with one byte
// shuffle). Passes of more than MAX_ROWS rows (a prefill) use PyTorch's kernel (gguf.py). Layers
// that read the same input (q, k and v; gate and up) are one stream of codes, one call
// (gguf.StackedCodes): every output what its layer's own call gives, since a row's sums do not
// depend on the rows around it.
//
// AVX-512 where the compiler targets it (-march=native on an AVX-512 CPU): a 4-bit group's 16
// possible weights fma(d, 0..15, m) are one register, and each code picks its weight from it
// (vpermps reads the low 4 bits of each lane), so a code becomes its fp32 weight in one shuffle
// instead of a conversion and an fma; AVX2 with FMA elsewhere (SPECDEC_BF16_KERNEL=avx2 builds it
// on an AVX-512 CPU too). Both add a row's products in column order, 16 (AVX-512) or 8 (AVX2)
// lanes at a time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

constexpr int ROWS = 4;
constexpr int GROUP = 32;
constexpr int64_t MAX_ROWS = 16;
constexpr int64_t PREFETCH = 1536;  // bytes ahead in the stream

constexpr int row_bytes(int bits) { return GROUP * bits / 8; }  // one row's codes in one group
constexpr int row_scales(int bits) { return bits == 4 ? 2 : 1; }  // (d, m) for Q4_1, d for Q8_0
constexpr int group_bytes(int bits) { return ROWS * (row_scales(bits) * sizeof(float) + row_bytes(bits)); }

// Sums kept in registers per sweep: 32 AVX-512 registers less a block's decoded weights, an input
// and the decoding's constants; 16 AVX2 ones less a row's decoded weights, d and m.
#if defined(__AVX512F__)
constexpr int ACCUMULATORS = 20;
#else
constexpr int ACCUMULATORS = 10;
#endif
constexpr int SWEEP_INPUTS = ACCUMULATORS / 2;
constexpr int rows_per_sweep(int im) { return ROWS * im <= ACCUMULATORS ? ROWS : 2 * im <= ACCUMULATORS ? 2 : 1; }

// multiply_group<BITS, R, IM> adds one group of 32 columns of R weight rows times IM input rows to
// the sums acc[R][IM]; block_kernel<BITS, IM> multiplies IM (1 to MAX_ROWS) input rows by one
// block of ROWS weight rows, in sweeps. Each sum sees its products in the same order whatever IM
// is, so a row's output does not depend on how many rows share the pass: a verification pass gives
// each position what a one-token step would.
#if defined(__AVX512F__)
constexpr int LANES = 16;
using Sums = __m512;
static inline Sums zero() { return _mm512_setzero_ps(); }
static inline float total(Sums v) { return _mm512_reduce_add_ps(v); }

// A row's 32 weights of one group, in two registers: w = d * q + m rounded once as the fma rounds
// (Q4_1), or the exact product d * q (Q8_0).
template <int BITS>
static inline void decode(const uint8_t *codes, const float *scales, __m512 (&w)[2]) {
    const __m512 d = _mm512_set1_ps(scales[0]);
    if constexpr (BITS == 4) {
        const __m512 weights = _mm512_fmadd_ps(d, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_ps(scales[1]));
        // Every 128-bit lane gets the 16 bytes; lane L shifts dword L % 4 by 8 * (L / 4), so its low
        // byte is byte 4 * (L % 4) + L / 4, which holds columns L and L + 16 (pack's order).
        const __m512i bytes = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(codes)));
        const __m512i low = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
        w[0] = _mm512_permutexvar_ps(_mm512_srlv_epi32(bytes, low), weights);  // vpermps reads a lane's low 4 bits
        w[1] = _mm512_permutexvar_ps(_mm512_srlv_epi32(bytes, _mm512_add_epi32(low, _mm512_set1_epi32(4))), weights);
    } else {
        for (int half = 0; half < 2; half++)
            w[half] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128(reinterpret_cast<const __m128i *>(codes + 16 * half)))));
    }
}
#else
constexpr int LANES = 8;
using Sums = __m256;
static inline Sums zero() { return _mm256_setzero_ps(); }
static inline float total(Sums v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <int BITS>
static inline void decode(const uint8_t *codes, const float *scales, __m256 (&w)[4]) {
    const __m256 d = _mm256_broadcast_ss(scales);
    __m128i quarters[4];
    if constexpr (BITS == 4) {
        const __m256 m = _mm256_broadcast_ss(scales + 1);
        const __m128i order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m128i bytes = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i *>(codes)), order);
        const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(15));
        const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15));
        quarters[0] = low, quarters[1] = _mm_srli_si128(low, 8), quarters[2] = high, quarters[3] = _mm_srli_si128(high, 8);
        for (int q = 0; q < 4; q++) w[q] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(quarters[q])), m);
    } else {
        for (int q = 0; q < 4; q++)
            w[q] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64(reinterpret_cast<const __m128i *>(codes + 8 * q)))));
    }
}
#endif

#if defined(__AVX512F__)
// All R rows' weights are decoded first, so each input vector is loaded once for all of them.
template <int BITS, int R, int IM>
static inline void multiply_group(Sums (&acc)[R][IM], const float *x, int64_t k, int64_t column,
                                  const float *scales, const uint8_t *codes) {
    __m512 w[R][2];
    for (int r = 0; r < R; r++) decode<BITS>(codes + r * row_bytes(BITS), scales + row_scales(BITS) * r, w[r]);
    for (int i = 0; i < IM; i++)
        for (int part = 0; part < 2; part++) {
            const __m512 input = _mm512_loadu_ps(x + i * k + column + part * LANES);
            for (int r = 0; r < R; r++) acc[r][i] = _mm512_fmadd_ps(input, w[r][part], acc[r][i]);
        }
}
#else
template <int BITS, int R, int IM>
static inline void multiply_group(Sums (&acc)[R][IM], const float *x, int64_t k, int64_t column,
                                  const float *scales, const uint8_t *codes) {
    for (int r = 0; r < R; r++) {
        Sums w[GROUP / LANES];
        decode<BITS>(codes + r * row_bytes(BITS), scales + row_scales(BITS) * r, w);
        for (int i = 0; i < IM; i++)
            for (int part = 0; part < GROUP / LANES; part++)
                acc[r][i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * k + column + part * LANES), w[part], acc[r][i]);
    }
}
#endif

// One sweep: IM input rows times R weight rows (from r0) of one block, group by group.
template <int BITS, int R, int IM>
static void sweep(const float *x, const uint8_t *block, float *y, int64_t n, int64_t k, int r0) {
    Sums acc[R][IM];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < IM; i++) acc[r][i] = zero();
    for (int64_t g = 0; g < k / GROUP; g++) {
        const uint8_t *group = block + g * group_bytes(BITS);
        for (int line = 0; line < group_bytes(BITS); line += 64)
            _mm_prefetch(reinterpret_cast<const char *>(group + PREFETCH + line), _MM_HINT_T0);
        const float *scales = reinterpret_cast<const float *>(group) + row_scales(BITS) * r0;
        const uint8_t *codes = group + ROWS * row_scales(BITS) * sizeof(float) + r0 * row_bytes(BITS);
        multiply_group<BITS, R, IM>(acc, x, k, g * GROUP, scales, codes);
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < IM; i++) y[i * n + r0 + r] = total(acc[r][i]);
}

// A sweep takes at most SWEEP_INPUTS input rows, with as many weight rows as the sums' registers
// allow (then the block's other rows); a longer pass is cut into even chunks of inputs, so the rows
// a sweep reads stay in the L1 cache (16 rows of 1536 floats would not) and its sums in registers.
template <int BITS, int IM>
static void block_kernel(const float *x, const uint8_t *block, float *y, int64_t n, int64_t k) {
    constexpr int CHUNKS = (IM + SWEEP_INPUTS - 1) / SWEEP_INPUTS;
    constexpr int CHUNK = (IM + CHUNKS - 1) / CHUNKS;  // 16 rows: two chunks of 8 (AVX-512), four of 4 (AVX2)
    constexpr int R = rows_per_sweep(CHUNK);
    for (int r0 = 0; r0 < ROWS; r0 += R) sweep<BITS, R, CHUNK>(x, block, y, n, k, r0);
    if constexpr (IM > CHUNK) block_kernel<BITS, IM - CHUNK>(x + CHUNK * k, block, y + CHUNK * n, n, k);
}

using BlockKernel = void (*)(const float *, const uint8_t *, float *, int64_t, int64_t);
template <int BITS>
static constexpr BlockKernel KERNELS[MAX_ROWS + 1] = {
    nullptr, block_kernel<BITS, 1>, block_kernel<BITS, 2>, block_kernel<BITS, 3>, block_kernel<BITS, 4>,
    block_kernel<BITS, 5>, block_kernel<BITS, 6>, block_kernel<BITS, 7>, block_kernel<BITS, 8>,
    block_kernel<BITS, 9>, block_kernel<BITS, 10>, block_kernel<BITS, 11>, block_kernel<BITS, 12>,
    block_kernel<BITS, 13>, block_kernel<BITS, 14>, block_kernel<BITS, 15>, block_kernel<BITS, 16>};

// y = x @ w.T for the n weight rows coded in `packed`, 1 to MAX_ROWS input rows.
static at::Tensor coded_linear(const at::Tensor &x, const at::Tensor &packed, int64_t n, int64_t bits) {
    const int64_t k = x.size(-1), m = x.numel() / k;
    TORCH_CHECK(bits == 4 || bits == 8, "gguf_weights_linear: codes of 4 or 8 bits");
    TORCH_CHECK(x.scalar_type() == at::kFloat, "gguf_weights_linear: a float32 input");
    const int64_t stream = n / ROWS * k / GROUP * (bits == 4 ? group_bytes(4) : group_bytes(8));
    TORCH_CHECK(k % GROUP == 0 && n % ROWS == 0 && packed.scalar_type() == at::kByte && packed.numel() == stream,
                "gguf_weights_linear: a packed weight of a shape the kernel covers (gguf_weights.fits)");
    const at::Tensor rows = x.contiguous();
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = n;
    at::Tensor out = at::empty(sizes, x.options());
    const float *xs = rows.data_ptr<float>();
    const uint8_t *w = packed.data_ptr<uint8_t>();
    float *y = out.data_ptr<float>();
    const BlockKernel kernel = bits == 4 ? KERNELS<4>[m] : KERNELS<8>[m];
    const int64_t block_bytes = stream / (n / ROWS);
    // torch's own threads (torch.set_num_threads), each a contiguous range of blocks.
    at::parallel_for(0, n / ROWS, 1, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; b++) kernel(xs, w + b * block_bytes, y + b * ROWS, n, k);
    });
    return out;
}

// y = x @ w.T for 1 to MAX_ROWS rows of x and the out_features weight rows coded in `packed`
// (stacked layers: their rows one after another). A longer pass (a prefill) is the caller's to run
// on the fp32 weight (gguf.py): the operator does not take it, so a compiled graph of decode steps
// and verification passes has only the codes as inputs.
static at::Tensor gguf_weights_linear(const at::Tensor &x, const at::Tensor &packed, int64_t out_features,
                                      int64_t bits) {
    const int64_t m = x.numel() / x.size(-1);
    TORCH_CHECK(m >= 1 && m <= MAX_ROWS, "gguf_weights_linear: 1 to 16 input rows (a longer pass reads the fp32 weight)");
    return coded_linear(x, packed, out_features, bits);
}

TORCH_LIBRARY_FRAGMENT(specdec, library) {
    library.def("gguf_weights_linear(Tensor x, Tensor packed, int out_features, int bits) -> Tensor");
    library.impl("gguf_weights_linear", c10::DispatchKey::CPU, TORCH_FN(gguf_weights_linear));
}
