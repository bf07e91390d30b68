// time of y = W x for one and for 8 columns, W 4096x4096 F32 / F16, 2 threads
#include "ggml.h"
#include "ggml-cpu.h"
#include <chrono>
#include <cstdio>
#include <vector>
static double run(ggml_type type, int cols, int reps) {
    ggml_init_params p = { (size_t) 256 << 20, nullptr, false };
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * w = ggml_new_tensor_2d(ctx, type, 4096, 4096);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4096, cols);
    if (type == GGML_TYPE_F32) for (int i = 0; i < 4096*4096; i++) ((float*)w->data)[i] = (i % 97) * 1e-3f;
    else for (int i = 0; i < 4096*4096; i++) ((ggml_fp16_t*)w->data)[i] = ggml_fp32_to_fp16((i % 97) * 1e-3f);
    for (int i = 0; i < 4096*cols; i++) ((float*)x->data)[i] = (i % 13) * 1e-2f;
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, y);
    ggml_graph_compute_with_ctx(ctx, g, 2);
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; r++) ggml_graph_compute_with_ctx(ctx, g, 2);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    ggml_free(ctx);
    return s;
}
int main() {
    for (int round = 0; round < 3; round++)
        for (ggml_type t : {GGML_TYPE_F32, GGML_TYPE_F16})
            for (int cols : {1, 8})
                printf("%s cols=%d: %.3f ms\n", ggml_type_name(t), cols, run(t, cols, 50) * 1e3);
}
