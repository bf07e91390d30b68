// Native tests of the patch stack: a row's result must not depend on the batch it is in.
//
//   mul_mat:    for each weight type of dgr's default model (Q4_K, Q6_K, Q5_0, Q8_0), the other
//               tiled K-quants, Q4_0, F16, BF16 and F32, every column of W x X is bitwise the same whether X
//               has 1, 2, 7, 8, 9, 16, 33, 64 or 512 (n_batch) columns.
//   mul_mat_id: for every weight type the CPU backend tiles or vec_dots, a token's MoE expert
//               outputs are bitwise the same alone and in batches whose experts get 1 to many
//               tokens each.
//   repacked_mul_mat: weights in the CPU backend's extra buffer types (CPU_REPACK, AMX), for
//               each type they take: mul_mat columns and mul_mat_id tokens alone and in
//               batches, printed; fails where a type dgr repacks (Q4_0, IQ4_NL, MXFP4, and
//               Q4_K on x86; those, Q8_0 and Q6_K on ARM; in CPU_REPACK) is not
//               bitwise equal to solo.
//   flash_attn: a query row's attention output is bitwise the same alone and beside other
//               sequences (split KV: one stream each; unified KV: rows of one stream), at KV
//               lengths below and above 512, with and without a sliding window; in a unified
//               stream also when the sequence's cells lie among other sequences' cells (in
//               position order), for decode rows and for a prompt chunk of 96 rows (tiled path).
//
// Usage: test-row-invariance mul_mat|mul_mat_id|repacked_mul_mat|flash_attn|flash_attn_prompt_rows [n_threads]

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

static int n_threads = 2;

struct scratch {
    ggml_context * ctx;
    explicit scratch(size_t bytes) {
        ggml_init_params p = { bytes, nullptr, false };
        ctx = ggml_init(p);
    }
    ~scratch() { ggml_free(ctx); }
};

static void compute(ggml_context * ctx, ggml_tensor * out) {
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    if (ggml_graph_compute_with_ctx(ctx, gf, n_threads) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed\n");
        exit(2);
    }
}

static std::vector<float> randoms(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto & x : v) {
        x = dist(rng);
    }
    return v;
}

// ---------------------------------------------------------------------------------- mul_mat

// Compares the first n results (each as long as solo[j]) laid one after another in
// `batched` with solo[j] and prints a line for `op` on `type` with n `unit`s; 1 if any differs.
static int check_batch(const char * op, ggml_type type, int n, const char * unit,
                       const std::vector<float> & batched, const std::vector<std::vector<float>> & solo) {
    int bad = 0;
    float worst = 0.0f;
    for (int j = 0; j < n; j++) {
        const size_t width = solo[j].size();
        const float * got = batched.data() + j * width;
        if (memcmp(got, solo[j].data(), width * sizeof(float)) != 0) {
            bad++;
            for (size_t i = 0; i < width; i++) {
                worst = fmaxf(worst, fabsf(got[i] - solo[j][i]));
            }
        }
    }
    printf("%s %-7s %2d %s: %s", op, ggml_type_name(type), n, unit, bad ? "DIFFERS" : "bitwise equal to solo");
    if (bad) {
        printf(" (%d of %d %s, max |diff| %g)", bad, n, unit, worst);
    }
    printf("\n");
    return bad != 0;
}


// The other types llama.cpp quantizes to and people download (IQ4_NL is covered repacked,
// repacked_mul_mat; its plain kernel is not row-invariant with AVX2)
#define OTHER_TYPES \
    GGML_TYPE_Q4_1, GGML_TYPE_Q5_1, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ2_XXS, \
    GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M, GGML_TYPE_TQ1_0, \
    GGML_TYPE_TQ2_0, GGML_TYPE_MXFP4,

static const int MM_K = 1024;   // a multiple of 256, as K-quants need
static const int MM_ROWS = 88;  // not a multiple of 16: ragged tiles
static const int MM_COLS[] = { 1, 2, 7, 8, 9, 16, 33, 64, 512 };
static const int MM_MAX_COLS = 512;  // n_batch

// W (MM_ROWS x MM_K, of `type`) times the first n columns of X; returns n x MM_ROWS floats
static std::vector<float> mul_mat(ggml_type type, const std::vector<uint8_t> & w, const std::vector<float> & x, int n) {
    scratch s((size_t) 64 << 20);
    ggml_tensor * W = ggml_new_tensor_2d(s.ctx, type, MM_K, MM_ROWS);
    memcpy(W->data, w.data(), ggml_nbytes(W));
    ggml_tensor * X = ggml_new_tensor_2d(s.ctx, GGML_TYPE_F32, MM_K, n);
    memcpy(X->data, x.data(), ggml_nbytes(X));
    ggml_tensor * Y = ggml_mul_mat(s.ctx, W, X);
    compute(s.ctx, Y);
    std::vector<float> out((size_t) n * MM_ROWS);
    memcpy(out.data(), Y->data, out.size() * sizeof(float));
    return out;
}

static std::vector<uint8_t> make_weights(ggml_type type, uint32_t seed) {
    std::vector<float> f = randoms((size_t) MM_K * MM_ROWS, seed, 0.05f);
    std::vector<uint8_t> w(ggml_row_size(type, MM_K) * MM_ROWS);
    if (type == GGML_TYPE_F32) {
        memcpy(w.data(), f.data(), w.size());
    } else if (type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(f.data(), (ggml_fp16_t *) w.data(), (int64_t) f.size());
    } else {
        // the types llama.cpp quantizes only with an importance matrix get a flat one
        const std::vector<float> flat(MM_K, 1.0f);
        ggml_quantize_chunk(type, f.data(), w.data(), 0, MM_ROWS, MM_K,
                            ggml_quantize_requires_imatrix(type) ? flat.data() : nullptr);
    }
    return w;
}

static int test_mul_mat() {
    const ggml_type types[] = {
        GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0,  // dgr's default model
        GGML_TYPE_Q5_K, GGML_TYPE_Q3_K, GGML_TYPE_Q2_K, GGML_TYPE_IQ4_XS, // the other tiled formats
        GGML_TYPE_Q4_0, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32,
        // the other types llama.cpp quantizes to and people download
        OTHER_TYPES
    };
    int failures = 0;
    // activations with a wide range, so that rounding differences cannot hide
    const std::vector<float> x = randoms((size_t) MM_K * MM_MAX_COLS, 7, 3.0f);
    for (ggml_type type : types) {
        const std::vector<uint8_t> w = make_weights(type, 11 + (uint32_t) type);
        // reference: each column alone
        std::vector<std::vector<float>> solo(MM_MAX_COLS);
        for (int j = 0; j < MM_MAX_COLS; j++) {
            std::vector<float> xj(x.begin() + (size_t) j * MM_K, x.begin() + (size_t) (j + 1) * MM_K);
            solo[j] = mul_mat(type, w, xj, 1);
        }
        for (int n : MM_COLS) {
            failures += check_batch("mul_mat", type, n, "columns", mul_mat(type, w, x, n), solo);
        }
    }
    return failures;
}

// ------------------------------------------------------------------------------- mul_mat_id

static const int MOE_EXPERTS = 8;
static const int MOE_USED = 2;  // experts per token
static const int MOE_TOKENS[] = { 1, 3, 8, 17, 64 };
static const int MOE_MAX_TOKENS = 64;

// The expert of token t's slot e: a fixed pseudo-random routing, so that in a batch each expert
// gets anywhere from 0 to many tokens.
static int moe_route(int t, int e) {
    return (t * 5 + e * 3 + (t * t) % 7) % MOE_EXPERTS;
}

// MOE_EXPERTS stacked weights W times the first n tokens of X, each token through its
// MOE_USED experts; returns n x MOE_USED x MM_ROWS floats
static std::vector<float> mul_mat_id(ggml_type type, const std::vector<uint8_t> & w, const std::vector<float> & x,
                                     int first, int n) {
    scratch s((size_t) 64 << 20);
    ggml_tensor * W = ggml_new_tensor_3d(s.ctx, type, MM_K, MM_ROWS, MOE_EXPERTS);
    memcpy(W->data, w.data(), ggml_nbytes(W));
    ggml_tensor * X = ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, MM_K, 1, n);  // one row per token
    memcpy(X->data, x.data() + (size_t) first * MM_K, ggml_nbytes(X));
    ggml_tensor * ids = ggml_new_tensor_2d(s.ctx, GGML_TYPE_I32, MOE_USED, n);
    for (int t = 0; t < n; t++) {
        for (int e = 0; e < MOE_USED; e++) {
            ((int32_t *) ids->data)[t * MOE_USED + e] = moe_route(first + t, e);
        }
    }
    ggml_tensor * Y = ggml_mul_mat_id(s.ctx, W, X, ids);  // [MM_ROWS, MOE_USED, n]
    compute(s.ctx, Y);
    std::vector<float> out((size_t) n * MOE_USED * MM_ROWS);
    memcpy(out.data(), Y->data, out.size() * sizeof(float));
    return out;
}

// MoE: a token's expert outputs are bitwise the same computed alone (each expert gets one row)
// and in batches of 3 to 64 tokens (each expert gets however many tokens were routed to it).
static int test_mul_mat_id() {
    const ggml_type types[] = {
        GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_K, GGML_TYPE_Q3_K, GGML_TYPE_Q2_K, GGML_TYPE_IQ4_XS,
        GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32,
        OTHER_TYPES
    };
    int failures = 0;
    const std::vector<float> x = randoms((size_t) MM_K * MOE_MAX_TOKENS, 17, 3.0f);
    for (ggml_type type : types) {
        std::vector<uint8_t> w;
        for (int e = 0; e < MOE_EXPERTS; e++) {
            const std::vector<uint8_t> we = make_weights(type, 101 + 13 * (uint32_t) e + (uint32_t) type);
            w.insert(w.end(), we.begin(), we.end());
        }
        std::vector<std::vector<float>> solo(MOE_MAX_TOKENS);
        for (int t = 0; t < MOE_MAX_TOKENS; t++) {
            solo[t] = mul_mat_id(type, w, x, t, 1);
        }
        for (int n : MOE_TOKENS) {
            failures += check_batch("mul_mat_id", type, n, "tokens", mul_mat_id(type, w, x, 0, n), solo);
        }
    }
    return failures;
}

// ---------------------------------------------------------------------------- repacked mul_mat

// The CPU backend's extra buffer types (AMX, CPU_REPACK): weights placed in them are repacked
// at load and multiplied by their own kernels.
static std::vector<ggml_backend_buffer_type_t> extra_buffer_types(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    std::vector<ggml_backend_buffer_type_t> out;
    for (ggml_backend_buffer_type_t * b = get ? get(dev) : nullptr; b && *b; b++) {
        out.push_back(*b);
    }
    return out;
}

static const int RP_ROWS = 96;  // a multiple of 8 (repacked tiles) and 32 (AMX tiles)

// Through the CPU backend, with the weights placed in `buft`: experts == 0: W (RP_ROWS x MM_K of
// `type`) times the first n columns of X (n x RP_ROWS floats); experts > 0: that many stacked W
// times the tokens first..first+n-1 of X, each through MOE_USED experts (n x MOE_USED x RP_ROWS
// floats). Empty when `buft` does not take the op (asked as llama.cpp's loader asks).
static std::vector<float> matmul_placed(ggml_backend_t backend, ggml_backend_buffer_type_t buft, ggml_type type,
                                        int experts, const std::vector<uint8_t> & w, const std::vector<float> & x,
                                        int first, int n) {
    ggml_init_params p = { 8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * wctx = ggml_init(p);
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * W = ggml_new_tensor_3d(wctx, type, MM_K, RP_ROWS, std::max(experts, 1));
    ggml_tensor * X;
    ggml_tensor * ids = nullptr;
    ggml_tensor * Y;
    if (experts) {
        X = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, MM_K, 1, n);
        ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, MOE_USED, n);
        Y = ggml_mul_mat_id(ctx, W, X, ids);
    } else {
        X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, MM_K, n);
        Y = ggml_mul_mat(ctx, W, X);
    }
    std::vector<float> out;
    ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(buft, 0);
    W->buffer = probe;
    const bool taken = ggml_backend_dev_supports_op(ggml_backend_get_device(backend), Y);
    W->buffer = nullptr;
    ggml_backend_buffer_free(probe);
    if (taken) {
        ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
        ggml_backend_tensor_set(W, w.data(), 0, ggml_nbytes(W));
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
        ggml_backend_tensor_set(X, x.data() + (size_t) first * MM_K, 0, ggml_nbytes(X));
        if (ids) {
            std::vector<int32_t> route((size_t) n * MOE_USED);
            for (int t = 0; t < n; t++) {
                for (int e = 0; e < MOE_USED; e++) {
                    route[t * MOE_USED + e] = moe_route(first + t, e);
                }
            }
            ggml_backend_tensor_set(ids, route.data(), 0, ggml_nbytes(ids));
        }
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, Y);
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "graph compute failed\n");
            exit(2);
        }
        out.resize((size_t) ggml_nelements(Y));
        ggml_backend_tensor_get(Y, out.data(), 0, ggml_nbytes(Y));
        ggml_backend_buffer_free(buf);
        ggml_backend_buffer_free(wbuf);
    }
    ggml_free(ctx);
    ggml_free(wctx);
    return out;
}

// The weight types dgr places in CPU_REPACK (dgr/weight_repack.py): their repacked kernels must
// be row-invariant. On x86 (AVX2), Q4_0, IQ4_NL, MXFP4 and Q4_K (patch 0017); on ARM, Q4_0,
// Q8_0, IQ4_NL, MXFP4, Q4_K (patch 0021) and Q6_K. The survey prints the others too.
static bool dgr_repacks(ggml_backend_buffer_type_t buft, ggml_type type) {
#if defined(__aarch64__)
    const bool taken = type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0 || type == GGML_TYPE_IQ4_NL ||
                       type == GGML_TYPE_MXFP4 || type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
#elif defined(__AVX2__)
    const bool taken = type == GGML_TYPE_Q4_0 || type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_MXFP4 ||
                       type == GGML_TYPE_Q4_K;
#else
    const bool taken = false;
#endif
    return strcmp(ggml_backend_buft_name(buft), "CPU_REPACK") == 0 && taken;
}

// Weight repacking, one extra buffer type: for each weight type it takes, whether every column
// of W x X is bitwise the same at every batch width, and every token's expert outputs the same
// alone and in batches; the number of cases that differ among the types dgr repacks.
static int repacked_matmuls(ggml_backend_t backend, ggml_backend_buffer_type_t buft) {
    const ggml_type types[] = {
        GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4,
        GGML_TYPE_Q2_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS,
    };
    const std::vector<float> x = randoms((size_t) MM_K * MM_MAX_COLS, 7, 3.0f);
    int failures = 0;
    for (ggml_type type : types) {
        for (int experts : { 0, MOE_EXPERTS }) {
            const int n_w = std::max(experts, 1);
            std::vector<float> f = randoms((size_t) MM_K * RP_ROWS * n_w, 11 + (uint32_t) type, 0.05f);
            std::vector<uint8_t> w(ggml_row_size(type, MM_K) * RP_ROWS * n_w);
            ggml_quantize_chunk(type, f.data(), w.data(), 0, RP_ROWS * n_w, MM_K, nullptr);
            const int n_max = experts ? MOE_MAX_TOKENS : MM_MAX_COLS;
            std::vector<std::vector<float>> solo(n_max);
            for (int j = 0; j < n_max; j++) {
                solo[j] = matmul_placed(backend, buft, type, experts, w, x, j, 1);
            }
            char op[64];
            snprintf(op, sizeof(op), "%s %s", ggml_backend_buft_name(buft), experts ? "mul_mat_id" : "mul_mat");
            if (solo[0].empty()) {
                printf("%s %-7s: not taken\n", op, ggml_type_name(type));
                continue;
            }
            int differ = 0;
            if (experts) {
                for (int n : MOE_TOKENS) {
                    differ += check_batch(op, type, n, "tokens", matmul_placed(backend, buft, type, experts, w, x, 0, n), solo);
                }
            } else {
                for (int n : MM_COLS) {
                    differ += check_batch(op, type, n, "columns", matmul_placed(backend, buft, type, 0, w, x, 0, n), solo);
                }
            }
            if (differ && !dgr_repacks(buft, type)) {
                printf("%s %-7s: differs; dgr does not repack it\n", op, ggml_type_name(type));
            } else {
                failures += differ;
            }
        }
    }
    return failures;
}

// Weight repacking: every extra buffer type of the CPU backend surveyed in a child process of
// its own, so that one whose kernels crash on this machine (AMX under some hypervisors) is
// reported and the others still run. Fails where a type dgr repacks differs; a crash of a
// buffer type dgr does not use (AMX) is reported only.
static int test_repacked_mul_mat() {
    // the repacking logs a line per tensor
    ggml_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, n_threads);
    int failures = 0;
    for (ggml_backend_buffer_type_t buft : extra_buffer_types(ggml_backend_get_device(backend))) {
        fflush(stdout);
        const pid_t child = fork();
        if (child == 0) {
            const int bad = repacked_matmuls(backend, buft);
            fflush(stdout);
            _exit(bad ? 1 : 0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        const bool used = strcmp(ggml_backend_buft_name(buft), "CPU_REPACK") == 0;
        if (WIFSIGNALED(status)) {
            printf("%s: its matmul dies with signal %d on this machine%s\n", ggml_backend_buft_name(buft),
                   WTERMSIG(status), used ? "" : "; dgr does not use it");
        }
        failures += status != 0 && (used || !WIFSIGNALED(status));
    }
    ggml_backend_free(backend);
    return failures;
}

// ------------------------------------------------------------------------------- flash_attn

static const int FA_D = 256;      // head size of Gemma 3
static const int FA_HEADS = 4;
static const int FA_HEADS_KV = 1;

static int pad256(int n) { return (n + 255) / 256 * 256; }

// One sequence: cells at positions 0..len-1 and n_rows query rows at the last n_rows
// positions (1 for a decode row, more for a prompt chunk), causal or (an encoder's input)
// each row seeing every cell; window = 0 for full attention.
struct fa_rows {
    int len;
    int window;
    int n_rows;
    bool causal = true;
    std::vector<float> q;  // FA_D * FA_HEADS * n_rows
    std::vector<float> k;  // FA_D * len * FA_HEADS_KV
    std::vector<float> v;
    fa_rows(int len, int window, int n_rows, uint32_t seed) : len(len), window(window), n_rows(n_rows) {
        q = randoms((size_t) FA_D * FA_HEADS * n_rows, seed);
        k = randoms((size_t) FA_D * len * FA_HEADS_KV, seed + 1);
        v = randoms((size_t) FA_D * len * FA_HEADS_KV, seed + 2);
    }
    bool visible(int row, int pos) const {
        const int qpos = len - n_rows + row;
        return !causal || (pos <= qpos && (window == 0 || pos > qpos - window));
    }
};

static void put_kv(ggml_tensor * t, const std::vector<float> & src, int len, int n_kv, int64_t stream, int cell0) {
    // t: [FA_D, n_kv, FA_HEADS_KV, n_stream] f16
    for (int h = 0; h < FA_HEADS_KV; h++) {
        for (int c = 0; c < len; c++) {
            ggml_fp16_t * dst = (ggml_fp16_t *) ((char *) t->data + (cell0 + c) * t->nb[1] + h * t->nb[2] + stream * t->nb[3]);
            ggml_fp32_to_fp16_row(&src[((size_t) h * len + c) * FA_D], dst, FA_D);
        }
    }
    (void) n_kv;
}

static void fill_f16(ggml_tensor * t, uint32_t seed) {
    std::vector<float> junk = randoms((size_t) ggml_nelements(t), seed);
    ggml_fp32_to_fp16_row(junk.data(), (ggml_fp16_t *) t->data, ggml_nelements(t));
}

// Split KV: each sequence in a stream of its own, one query row each. Returns the output of `probe`.
static std::vector<float> fa_split(const std::vector<const fa_rows *> & seqs, size_t probe) {
    const int n_stream = (int) seqs.size();
    int n_kv = 0;
    for (auto * s : seqs) {
        n_kv = std::max(n_kv, pad256(s->len));
    }
    scratch sc((size_t) 256 << 20);
    ggml_tensor * q = ggml_new_tensor_4d(sc.ctx, GGML_TYPE_F32, FA_D, 1, FA_HEADS, n_stream);
    ggml_tensor * k = ggml_new_tensor_4d(sc.ctx, GGML_TYPE_F16, FA_D, n_kv, FA_HEADS_KV, n_stream);
    ggml_tensor * v = ggml_new_tensor_4d(sc.ctx, GGML_TYPE_F16, FA_D, n_kv, FA_HEADS_KV, n_stream);
    ggml_tensor * m = ggml_new_tensor_4d(sc.ctx, GGML_TYPE_F16, n_kv, 1, 1, n_stream);
    fill_f16(k, 99);  // cells no query may see hold junk, never zeros
    fill_f16(v, 98);
    for (int st = 0; st < n_stream; st++) {
        const fa_rows & s = *seqs[st];
        for (int h = 0; h < FA_HEADS; h++) {
            memcpy((char *) q->data + h * q->nb[2] + st * q->nb[3], &s.q[(size_t) h * FA_D], FA_D * sizeof(float));
        }
        put_kv(k, s.k, s.len, n_kv, st, 0);
        put_kv(v, s.v, s.len, n_kv, st, 0);
        ggml_fp16_t * mask = (ggml_fp16_t *) ((char *) m->data + st * m->nb[3]);
        for (int c = 0; c < n_kv; c++) {
            mask[c] = ggml_fp32_to_fp16(s.visible(0, c) ? 0.0f : -INFINITY);
        }
    }
    ggml_tensor * out = ggml_flash_attn_ext(sc.ctx, q, k, v, m, 1.0f / 16.0f, 0.0f, 0.0f);
    compute(sc.ctx, out);
    // out: [FA_D, FA_HEADS, 1, n_stream]
    std::vector<float> r((size_t) FA_D * FA_HEADS);
    memcpy(r.data(), (char *) out->data + probe * out->nb[3], r.size() * sizeof(float));
    return r;
}

static int report(const char * what, int len, int window, const std::vector<float> & got, const std::vector<float> & solo) {
    const bool same = memcmp(got.data(), solo.data(), solo.size() * sizeof(float)) == 0;
    float worst = 0.0f;
    for (size_t i = 0; i < solo.size(); i++) {
        worst = fmaxf(worst, fabsf(got[i] - solo[i]));
    }
    printf("flash_attn kv=%4d window=%3d %-34s %s", len, window, what, same ? "bitwise equal to solo" : "DIFFERS");
    if (!same) {
        printf(" (max |diff| %g)", worst);
    }
    printf("\n");
    return same ? 0 : 1;
}

// cells first, first + stride, ... for len positions
static std::vector<int> strided(int len, int first, int stride) {
    std::vector<int> cells(len);
    for (int i = 0; i < len; i++) {
        cells[i] = first + i * stride;
    }
    return cells;
}

// One unified stream holding each sequence at the given cells (in position order); the output
// rows of the first sequence.
static std::vector<float> fa_placed(const std::vector<std::pair<const fa_rows *, std::vector<int>>> & seqs) {
    int n_q = 0;
    int used = 0;
    for (auto & [s, cells] : seqs) {
        n_q += s->n_rows;
        used = std::max(used, cells.back() + 1);
    }
    const int n_kv = pad256(used);
    scratch sc((size_t) 512 << 20);
    ggml_tensor * q = ggml_new_tensor_4d(sc.ctx, GGML_TYPE_F32, FA_D, n_q, FA_HEADS, 1);
    ggml_tensor * k = ggml_new_tensor_4d(sc.ctx, GGML_TYPE_F16, FA_D, n_kv, FA_HEADS_KV, 1);
    ggml_tensor * v = ggml_new_tensor_4d(sc.ctx, GGML_TYPE_F16, FA_D, n_kv, FA_HEADS_KV, 1);
    ggml_tensor * m = ggml_new_tensor_4d(sc.ctx, GGML_TYPE_F16, n_kv, n_q, 1, 1);
    fill_f16(k, 95);  // cells no query may see hold junk, never zeros
    fill_f16(v, 94);
    std::vector<ggml_fp16_t> masked(n_kv, ggml_fp32_to_fp16(-INFINITY));
    int row0 = 0;
    for (auto & [s, cells] : seqs) {
        for (int h = 0; h < FA_HEADS_KV; h++) {
            for (int p = 0; p < s->len; p++) {
                const size_t at = ((size_t) h * s->len + p) * FA_D;
                ggml_fp32_to_fp16_row(&s->k[at], (ggml_fp16_t *) ((char *) k->data + cells[p] * k->nb[1] + h * k->nb[2]), FA_D);
                ggml_fp32_to_fp16_row(&s->v[at], (ggml_fp16_t *) ((char *) v->data + cells[p] * v->nb[1] + h * v->nb[2]), FA_D);
            }
        }
        for (int r = 0; r < s->n_rows; r++) {
            for (int h = 0; h < FA_HEADS; h++) {
                memcpy((char *) q->data + (row0 + r) * q->nb[1] + h * q->nb[2],
                       &s->q[((size_t) r * FA_HEADS + h) * FA_D], FA_D * sizeof(float));
            }
            ggml_fp16_t * mask = (ggml_fp16_t *) ((char *) m->data + (row0 + r) * m->nb[1]);
            memcpy(mask, masked.data(), n_kv * sizeof(ggml_fp16_t));
            for (int p = 0; p < s->len; p++) {
                if (s->visible(r, p)) {
                    mask[cells[p]] = ggml_fp32_to_fp16(0.0f);
                }
            }
        }
        row0 += s->n_rows;
    }
    ggml_tensor * out = ggml_flash_attn_ext(sc.ctx, q, k, v, m, 1.0f / 16.0f, 0.0f, 0.0f);
    compute(sc.ctx, out);
    // out: [FA_D, FA_HEADS, n_q, 1]; the first sequence's rows come first
    std::vector<float> r((size_t) FA_D * FA_HEADS * seqs[0].first->n_rows);
    memcpy(r.data(), out->data, r.size() * sizeof(float));
    return r;
}

// Unified KV: all sequences in one stream, cells laid out one sequence after the other (the
// probe first, at cells 0..len-1, as when it was admitted first).
static std::vector<float> fa_unified(const std::vector<const fa_rows *> & seqs) {
    std::vector<std::pair<const fa_rows *, std::vector<int>>> placed;
    int used = 0;
    for (auto * s : seqs) {
        placed.push_back({ s, strided(s->len, used, 1) });
        used += s->len;
    }
    return fa_placed(placed);
}

// Unified KV with a sequence's cells among other sequences' cells, as a shared pool leaves
// them: a decode row beside 15 others, and a prompt chunk of 96 rows (tiled path) alone in
// its call, each against the same sequence alone at cells 0..len-1.
static int test_flash_attn_spread_cells() {
    int failures = 0;
    for (int len : { 100, 600, 1100, 2100 }) {
        for (int window : { 0, 512 }) {
            if (window && len <= window) {
                continue;
            }
            const fa_rows probe(len, window, 1, 3000 + len);
            const std::vector<float> solo = fa_placed({ { &probe, strided(len, 0, 1) } });
            // the probe at every third cell from 7, the others in between and after
            std::vector<std::pair<const fa_rows *, std::vector<int>>> pool = { { &probe, strided(len, 7, 3) } };
            std::vector<fa_rows> others;
            others.reserve(15);
            for (int i = 0; i < 15; i++) {
                others.emplace_back(i % 2 ? 40 : 300, 0, 1, 4000 + i);
            }
            int next = 3 * len + 8;
            for (int i = 0; i < 15; i++) {
                const fa_rows & o = others[i];
                pool.push_back({ &o, i < 2 ? strided(o.len, 8 + i, 3) : strided(o.len, next, 1) });
                if (i >= 2) {
                    next += o.len;
                }
            }
            failures += report("unified KV, spread cells, 16 rows", len, window, fa_placed(pool), solo);

            const fa_rows chunk(len, window, 96, 5000 + len);
            const std::vector<float> chunk_solo = fa_placed({ { &chunk, strided(len, 0, 1) } });
            const fa_rows neighbour(len, 0, 0, 6000 + len);
            failures += report("unified KV, spread cells, 96-row chunk", len, window,
                               fa_placed({ { &chunk, strided(len, 1, 2) }, { &neighbour, strided(len, 0, 2) } }),
                               chunk_solo);
        }
    }
    return failures;
}

static int test_flash_attn() {
    int failures = 0;
    const fa_rows other_short(37, 0, 1, 500), other_long(2500, 0, 1, 600), other_mid(800, 0, 1, 700);
    const int lens[] = { 100, 511, 600, 1100, 2100 };
    for (int len : lens) {
        for (int window : { 0, 512 }) {
            if (window && len <= window) {
                continue;
            }
            const fa_rows probe(len, window, 1, 1000 + len);
            const std::vector<float> solo = fa_split({ &probe }, 0);
            failures += report("split KV, beside 3 sequences", len, window,
                               fa_split({ &other_short, &other_long, &probe, &other_mid }, 2), solo);
            failures += report("split KV, beside a short one", len, window,
                               fa_split({ &probe, &other_short }, 0), solo);
            failures += report("unified KV, alone", len, window, fa_unified({ &probe }), solo);
            failures += report("unified KV, 3 rows", len, window,
                               fa_unified({ &probe, &other_short, &other_mid }), solo);
            std::vector<const fa_rows *> many = { &probe };
            for (int i = 0; i < 15; i++) {
                many.push_back(i % 2 ? &other_short : &other_mid);
            }
            failures += report("unified KV, 16 rows", len, window, fa_unified(many), solo);
        }
    }
    return failures + test_flash_attn_spread_cells();
}

// Row r of `rows` (FA_HEADS * FA_D floats a row) against the same row computed alone:
// a difference counts in bad, its largest |diff| in worst.
static void compare_row(const std::vector<float> & rows, int r, const std::vector<float> & alone,
                        int & bad, float & worst) {
    const float * got = rows.data() + (size_t) r * FA_HEADS * FA_D;
    if (memcmp(got, alone.data(), alone.size() * sizeof(float)) != 0) {
        bad++;
        for (size_t i = 0; i < alone.size(); i++) {
            worst = fmaxf(worst, fabsf(got[i] - alone[i]));
        }
    }
}

// Prints the verdict on 6 rows compared by compare_row; 1 if any differed.
static int report_rows(const char * what, int bad, float worst) {
    printf("flash_attn %s: %s", what, bad ? "DIFFERS" : "bitwise equal");
    if (bad) {
        printf(" (%d of 6 rows, max |diff| %g)", bad, worst);
    }
    printf("\n");
    return bad ? 1 : 0;
}

// A prompt chunk's rows against the same rows decoded one at a time: row r of a 96-row
// chunk (which the tiled path takes by default) must give what a lone query row at its
// position gives over the same cells; and so must a row of an encoder's non-causal input.
static int test_flash_attn_prompt_rows() {
    int failures = 0;
    const int n_rows = 96;
    for (int len : { 100, 600, 1100 }) {
        for (int window : { 0, 512 }) {
            if (window && len <= window) {
                continue;
            }
            const fa_rows chunk(len, window, n_rows, 7000 + len);
            const std::vector<float> rows = fa_placed({ { &chunk, strided(len, 0, 1) } });
            int bad = 0;
            float worst = 0.0f;
            for (int r : { 0, 1, 37, 63, 64, 95 }) {
                fa_rows one(len - n_rows + r + 1, window, 1, 0);
                one.q.assign(chunk.q.begin() + (size_t) r * FA_HEADS * FA_D,
                             chunk.q.begin() + (size_t) (r + 1) * FA_HEADS * FA_D);
                one.k.assign(chunk.k.begin(), chunk.k.begin() + (size_t) one.len * FA_D);  // FA_HEADS_KV == 1
                one.v.assign(chunk.v.begin(), chunk.v.begin() + (size_t) one.len * FA_D);
                compare_row(rows, r, fa_placed({ { &one, strided(one.len, 0, 1) } }), bad, worst);
            }
            char what[96];
            snprintf(what, sizeof(what), "kv=%4d window=%3d 96-row prompt chunk vs rows decoded alone",
                     len, window);
            failures += report_rows(what, bad, worst);
        }
    }
    // an encoder's input (every row sees every cell of its input) packed after another
    // input in one call, against each row as a lone query over the input's cells
    for (int len : { 100, 600 }) {
        fa_rows input(len, 0, len, 8000 + len);
        input.causal = false;
        fa_rows before(len / 2 + 3, 0, len / 2 + 3, 9000 + len);
        before.causal = false;
        const std::vector<float> rows = fa_placed({ { &input, strided(len, before.len, 1) },
                                                    { &before, strided(before.len, 0, 1) } });
        int bad = 0;
        float worst = 0.0f;
        for (int r : { 0, 1, 37, 63, 64, len - 1 }) {
            fa_rows one(len, 0, 1, 0);
            one.causal = false;
            one.q.assign(input.q.begin() + (size_t) r * FA_HEADS * FA_D,
                         input.q.begin() + (size_t) (r + 1) * FA_HEADS * FA_D);
            one.k = input.k;
            one.v = input.v;
            compare_row(rows, r, fa_placed({ { &one, strided(len, 0, 1) } }), bad, worst);
        }
        char what[96];
        snprintf(what, sizeof(what), "kv=%4d non-causal %d-row input beside another vs rows alone",
                 len, len);
        failures += report_rows(what, bad, worst);
    }
    return failures;
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s mul_mat|mul_mat_id|repacked_mul_mat|flash_attn|flash_attn_prompt_rows [n_threads]\n", argv[0]);
        return 2;
    }
    if (argc > 2) {
        n_threads = atoi(argv[2]);
    }
    const std::string what = argv[1];
    int failures;
    if (what == "mul_mat") {
        failures = test_mul_mat();
    } else if (what == "mul_mat_id") {
        failures = test_mul_mat_id();
    } else if (what == "repacked_mul_mat") {
        failures = test_repacked_mul_mat();
    } else if (what == "flash_attn") {
        failures = test_flash_attn();
    } else if (what == "flash_attn_prompt_rows") {
        failures = test_flash_attn_prompt_rows();
    } else {
        fprintf(stderr, "unknown test %s\n", what.c_str());
        return 2;
    }
    printf("%s: %d failure(s)\n", what.c_str(), failures);
    return failures ? 1 : 0;
}
