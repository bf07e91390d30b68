// One encoder step, timed: a GGUF embedding model, a context with embeddings on, pooling
// none and flash attention (as dgr's embedding context makes it), one input of N tokens
// decoded R times; prints the median milliseconds. Built against each llama.cpp tree
// (encoder_step.sh) to compare their kernels on the same file.
//
//   encoder_step MODEL N R THREADS
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL N R THREADS\n", argv[0]);
        return 2;
    }
    const int n = atoi(argv[2]), repeats = atoi(argv[3]), threads = atoi(argv[4]);
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (model == nullptr) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 1024;
    cp.n_seq_max = 1;
    cp.embeddings = true;
    cp.pooling_type = LLAMA_POOLING_TYPE_NONE;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.n_threads = cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        batch.token[i] = 5 + i % 300;
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    std::vector<double> ms;
    for (int r = 0; r <= repeats; ++r) {  // the first, a warm-up, is not counted
        const auto t0 = std::chrono::steady_clock::now();
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama_decode failed\n");
            return 1;
        }
        const auto t1 = std::chrono::steady_clock::now();
        if (r > 0) {
            ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
    }
    std::sort(ms.begin(), ms.end());
    printf("%d tokens: median %.1f ms (min %.1f, max %.1f) over %d steps\n", n, ms[ms.size() / 2],
           ms.front(), ms.back(), repeats);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
