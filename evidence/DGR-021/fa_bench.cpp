// times flash attention for a prompt chunk of n_rows at the end of a sequence of len cells
#include "ggml.h"
#include "ggml-cpu.h"
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
static const int D = 256, H = 4, HKV = 1;
int main(int argc, char ** argv) {
    int len = atoi(argv[1]), n_rows = atoi(argv[2]), iters = atoi(argv[3]);
    int window = argc > 4 ? atoi(argv[4]) : 0;
    int n_kv = (len + 255) / 256 * 256;
    ggml_init_params p = { (size_t) 512 << 20, nullptr, false };
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, n_rows, H, 1);
    ggml_tensor * k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, n_kv, HKV, 1);
    ggml_tensor * v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, n_kv, HKV, 1);
    ggml_tensor * m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, n_rows, 1, 1);
    std::mt19937 rng(1); std::normal_distribution<float> dist(0, 1);
    float * qd = (float *) q->data; for (int64_t i = 0; i < ggml_nelements(q); i++) qd[i] = dist(rng);
    std::vector<float> tmp(ggml_nelements(k));
    for (auto & x : tmp) x = dist(rng); ggml_fp32_to_fp16_row(tmp.data(), (ggml_fp16_t *) k->data, tmp.size());
    for (auto & x : tmp) x = dist(rng); ggml_fp32_to_fp16_row(tmp.data(), (ggml_fp16_t *) v->data, tmp.size());
    for (int r = 0; r < n_rows; r++) {
        int qpos = len - n_rows + r;
        ggml_fp16_t * mk = (ggml_fp16_t *) ((char *) m->data + r * m->nb[1]);
        for (int c = 0; c < n_kv; c++) mk[c] = ggml_fp32_to_fp16((c <= qpos && (window == 0 || c > qpos - window)) ? 0.0f : -INFINITY);
    }
    ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, m, 1.0f / 16.0f, 0.0f, 0.0f);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) ggml_graph_compute_with_ctx(ctx, gf, 2);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
    double sum = 0; for (int64_t i = 0; i < ggml_nelements(out); i++) sum += ((float *) out->data)[i];
    printf("len=%d rows=%d window=%d tiled=%s: %.3f ms per call (checksum %.6f)\n", len, n_rows, window, getenv("GGML_CPU_FA_TILED") ? getenv("GGML_CPU_FA_TILED") : "unset", ms, sum);
    return 0;
}
