// One sequence: a 300-token prompt, then steps of R rows, every row an output (a decode row
// and its drafts); the median of 7 steps per R. Built against the pristine pin (vendor/build-peers)
// and against the patched libllama dgr runs (llama_cpp/lib), as the header of
// rows-cost-wide-pristine.txt shows.
#include "llama.h"
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstring>
int main(int argc, char ** argv) {
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.use_extra_bufts = false;  // no weight repacking, as dgr and the bench's llama-server (--no-repack)
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    auto cp = llama_context_default_params();
    cp.n_ctx = 8192; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED; cp.n_seq_max = 4; cp.kv_unified = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    int pos = 0;
    llama_batch b = llama_batch_init(512, 0, 1);
    auto fill = [&](int n, bool all) {
        b.n_tokens = n;
        for (int i = 0; i < n; i++) { b.token[i] = 1000 + (pos + i) % 500; b.pos[i] = pos + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = all || i == n - 1; }
        pos += n;
    };
    fill(300, false); llama_decode(ctx, b);
    int rs[] = {1, 2, 4, 5, 8, 9, 16, 17, 24, 32, 48, 49, 64};
    for (int r : rs) {
        std::vector<double> ts;
        for (int k = 0; k < 7; k++) {
            fill(r, true);
            auto t0 = std::chrono::steady_clock::now();
            llama_decode(ctx, b);
            llama_synchronize(ctx);
            ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ts.begin(), ts.end());
        printf("%d rows %.1f ms %.2f ms/row\n", r, ts[3], ts[3] / r);
    }
    return 0;
}
