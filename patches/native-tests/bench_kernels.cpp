// Times CPU kernels of a llama.cpp tree on the shapes a serving node runs. Flash attention: a
// prompt chunk of 512 rows at the end of a causal context (also of 2,048 cells among a 32k-cell
// pool's), one decode row, and 16 decode rows of 16 sequences in one unified stream; an
// encoder's non-causal inputs (one of 512 tokens, 16 of 32 in one step). MoE expert matmuls (mul_mat_id) of Qwen3-30B-A3B's
// shape (2048 -> 768, 128 experts, 8 per token, Q4_K and Q6_K) for 1, 4 and 16 tokens. A
// 2048 x 2048 matmul of the types the CPU_REPACK buffer type repacks row-invariantly (Q4_0,
// IQ4_NL, MXFP4, Q4_K; Q4_K also in a 1B Llama's feed-forward shapes), its weights in the plain
// CPU buffer and repacked, for 1, 16 and 512 columns. Built
// against each tree to compare, run alternating:
//
//   bench-kernels [n_threads] [repeats] [case]
//
// Prints one line per case (only those whose line contains `case`, if given): the shape and
// the median milliseconds of a call over the repeats.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

struct shape {
    const char * name;
    int d;        // head size
    int heads;    // query heads
    int heads_kv; // KV heads
};

static void fill(ggml_tensor * t, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x((size_t) ggml_nelements(t));
    for (auto & e : x) {
        e = dist(rng);
    }
    if (t->type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(x.data(), (ggml_fp16_t *) t->data, (int64_t) x.size());
    } else {
        memcpy(t->data, x.data(), x.size() * sizeof(float));
    }
}

// The median milliseconds of computing `out` over `repeats` calls (after one that warms the
// caches); frees ctx.
static double median_ms(ggml_context * ctx, ggml_tensor * out, int n_threads, int repeats) {
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_cplan plan = ggml_graph_plan(gf, n_threads, nullptr);
    std::vector<uint8_t> work(plan.work_size);
    plan.work_data = work.data();
    std::vector<double> ms;
    for (int i = 0; i <= repeats; i++) {
        const auto t0 = std::chrono::steady_clock::now();
        ggml_graph_compute(gf, &plan);
        const auto t1 = std::chrono::steady_clock::now();
        if (i > 0) {
            ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
    }
    ggml_free(ctx);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// n_seq sequences of len cells each, laid one after the other in one stream of at least pool
// cells (the rest other sequences' cells, masked); n_rows query rows per sequence at its last
// positions, causal (or each row seeing all its sequence's cells).
static double time_case(const shape & s, int n_seq, int len, int n_rows, int n_threads, int repeats,
                        int pool = 0, bool causal = true) {
    const int n_kv = std::max((n_seq * len + 255) / 256 * 256, pool);
    const int n_q = n_seq * n_rows;
    ggml_init_params p = { (size_t) 64 << 20, nullptr, false };
    p.mem_size += (size_t) n_kv * s.d * s.heads_kv * 4 + (size_t) n_q * n_kv * 2 + (size_t) n_q * s.d * s.heads * 8;
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, s.d, n_q, s.heads, 1);
    ggml_tensor * k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, s.d, n_kv, s.heads_kv, 1);
    ggml_tensor * v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, s.d, n_kv, s.heads_kv, 1);
    ggml_tensor * m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, n_q, 1, 1);
    fill(q, 1);
    fill(k, 2);
    fill(v, 3);
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), minus_inf = ggml_fp32_to_fp16(-INFINITY);
    for (int sq = 0; sq < n_seq; sq++) {
        for (int r = 0; r < n_rows; r++) {
            ggml_fp16_t * row = (ggml_fp16_t *) ((char *) m->data + (size_t) (sq * n_rows + r) * m->nb[1]);
            const int pos = len - n_rows + r;
            for (int c = 0; c < n_kv; c++) {
                const int seq = c / len, cpos = c % len;
                row[c] = seq == sq && (cpos <= pos || !causal) ? zero : minus_inf;
            }
        }
    }
    ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, m, 1.0f / sqrtf((float) s.d), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
    return median_ms(ctx, out, n_threads, repeats);
}

// n tokens through MoE experts of Qwen3-30B-A3B's shape, 8 of 128 each (a fixed spread)
static double time_moe(ggml_type type, int n, int n_threads, int repeats) {
    const int K = 2048, N = 768, n_exp = 128, n_used = 8;
    ggml_init_params p = { (size_t) ggml_row_size(type, K) * N * n_exp + ((size_t) 64 << 20), nullptr, false };
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * w = ggml_new_tensor_3d(ctx, type, K, N, n_exp);
    {
        std::mt19937 rng(5);
        std::normal_distribution<float> dist(0.0f, 0.05f);
        std::vector<float> f((size_t) K * N);
        for (int e = 0; e < n_exp; e++) {
            for (auto & x : f) {
                x = dist(rng);
            }
            ggml_quantize_chunk(type, f.data(), (char *) w->data + e * w->nb[2], 0, N, K, nullptr);
        }
    }
    ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, 1, n);
    fill(x, 6);
    ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used, n);
    for (int t = 0; t < n; t++) {
        for (int e = 0; e < n_used; e++) {
            ((int32_t *) ids->data)[t * n_used + e] = (t * 37 + e * 16 + e * e) % n_exp;
        }
    }
    ggml_tensor * out = ggml_mul_mat_id(ctx, w, x, ids);
    return median_ms(ctx, out, n_threads, repeats);
}

// The median milliseconds of a matmul of `rows` x `k` `type` weights by n columns through the CPU
// backend, its weights placed in `buft`
static double time_placed(ggml_backend_buffer_type_t buft, ggml_type type, int k, int rows, int n, int n_threads,
                          int repeats) {
    ggml_init_params p = { 8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * wctx = ggml_init(p);
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * w = ggml_new_tensor_2d(wctx, type, k, rows);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, n_threads);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> f((size_t) k * std::max(rows, n));
    for (auto & e : f) {
        e = dist(rng);
    }
    std::vector<uint8_t> q(ggml_nbytes(w));
    ggml_quantize_chunk(type, f.data(), q.data(), 0, rows, k, nullptr);
    ggml_backend_tensor_set(w, q.data(), 0, q.size());
    ggml_backend_tensor_set(x, f.data(), 0, ggml_nbytes(x));
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    std::vector<double> ms;
    for (int i = 0; i <= repeats; i++) {
        const auto t0 = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(backend, gf);
        const auto t1 = std::chrono::steady_clock::now();
        if (i > 0) {
            ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
    }
    ggml_backend_buffer_free(buf);
    ggml_backend_buffer_free(wbuf);
    ggml_backend_free(backend);
    ggml_free(ctx);
    ggml_free(wctx);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// The CPU backend's extra buffer type called `name`, or nullptr
static ggml_backend_buffer_type_t extra_buffer_type(const char * name) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get ? get(dev) : nullptr; b && *b; b++) {
        if (strcmp(ggml_backend_buft_name(*b), name) == 0) {
            return *b;
        }
    }
    return nullptr;
}

static const char * filter = nullptr;

static void run(const shape & s, const char * what, int n_seq, int len, int n_rows, int n_threads, int repeats,
                int pool = 0, bool causal = true) {
    char line[256];
    snprintf(line, sizeof(line), "%-36s %s, kv %5d", s.name, what, len);
    if (filter && !strstr(line, filter)) {
        return;
    }
    printf("%s: %9.3f ms\n", line, time_case(s, n_seq, len, n_rows, n_threads, repeats, pool, causal));
    fflush(stdout);
}

int main(int argc, char ** argv) {
    const int n_threads = argc > 1 ? atoi(argv[1]) : 2;
    const int repeats = argc > 2 ? atoi(argv[2]) : 5;
    filter = argc > 3 ? argv[3] : nullptr;
    const shape shapes[] = {
        { "gemma3-270m (d 256, 4 heads, 1 kv)", 256, 4, 1 },
        { "llama-1b (d 64, 32 heads, 8 kv)", 64, 32, 8 },
    };
    for (const shape & s : shapes) {
        for (int len : { 512, 2048, 8192 }) {
            run(s, "prompt chunk of 512 rows", 1, len, 512, n_threads, repeats);
        }
        run(s, "prompt chunk of 512 rows in a 32k-cell pool", 1, 2048, 512, n_threads, repeats, 32768);
        for (int len : { 512, 2048, 8192 }) {
            run(s, "decode, 1 row           ", 1, len, 1, n_threads, repeats * 4);
        }
        run(s, "decode, 16 rows of 16 sequences (kv each)", 16, 1024, 1, n_threads, repeats * 4);
    }
    const shape encoder = { "bge-small (d 32, 12 heads, 12 kv)", 32, 12, 12 };
    run(encoder, "non-causal input of 512 rows", 1, 512, 512, n_threads, repeats, 0, false);
    run(encoder, "16 non-causal inputs of 32 rows (kv each)", 16, 32, 32, n_threads, repeats, 0, false);
    for (ggml_type type : { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K }) {
        for (int n : { 1, 4, 16 }) {
            char line[256];
            snprintf(line, sizeof(line), "mul_mat_id qwen3-30b-a3b experts %-5s %2d tokens", ggml_type_name(type), n);
            if (!filter || strstr(line, filter)) {
                printf("%s: %9.3f ms\n", line, time_moe(type, n, n_threads, repeats * 4));
                fflush(stdout);
            }
        }
    }
    ggml_backend_buffer_type_t repack = extra_buffer_type("CPU_REPACK");
    // k x rows: square, and a 1B Llama's feed-forward up (or gate) and down weights
    const int placed_shapes[3][2] = { { 2048, 2048 }, { 2048, 8192 }, { 8192, 2048 } };
#if defined(__aarch64__)
    const bool arm = true;
#else
    const bool arm = false;
#endif
    for (ggml_type type : { GGML_TYPE_Q4_0, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4, GGML_TYPE_Q4_K, GGML_TYPE_Q8_0,
                            GGML_TYPE_Q6_K }) {
        // llama.cpp repacks Q8_0 and Q6_K on ARM (with dotprod or i8mm) only
        const bool repacked = arm || (type != GGML_TYPE_Q8_0 && type != GGML_TYPE_Q6_K);
        for (const auto & kr : placed_shapes) {
            if (kr[0] != kr[1] && type != GGML_TYPE_Q4_K && type != GGML_TYPE_Q6_K) {
                continue;
            }
            for (int n : { 1, 16, 512 }) {
                for (ggml_backend_buffer_type_t buft : { ggml_backend_cpu_buffer_type(), repack }) {
                    char line[256];
                    snprintf(line, sizeof(line), "mul_mat %dx%d %-6s %-10s %3d columns", kr[0], kr[1],
                             ggml_type_name(type), buft ? ggml_backend_buft_name(buft) : "CPU_REPACK", n);
                    if ((!filter || strstr(line, filter)) && buft && (repacked || buft != repack)) {
                        printf("%s: %9.3f ms\n", line, time_placed(buft, type, kr[0], kr[1], n, n_threads,
                                                                  n == 512 ? repeats : repeats * 4));
                        fflush(stdout);
                    }
                }
            }
        }
    }
    return 0;
}
