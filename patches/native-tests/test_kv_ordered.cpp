// Native test of patch 0004: in a unified KV cache with LLAMA_KV_CACHE_ORDERED=1, a
// sequence's logits do not depend on which cells other sequences took and freed.
//
//   test-kv-ordered MODEL.gguf [unordered]
//
// ("unordered" sets LLAMA_KV_CACHE_ORDERED=0: the patched tree's default placement,
// to show the test fails without the ordering.)
//
// Alone: sequence 1 decodes 40 prompt tokens, then 20 more (logits for all 20).
// Shared: sequence 0 decodes 40 tokens first (cells 0-39), sequence 1 the same 40
// (cells 40-79; 64-103 with patch 0012's blocks), sequence 0 is removed (cells 0-39 free
// again, llama.cpp's search head back at 0), then sequence 1 decodes the same 20 more.
// Without the patch those 20 land in cells 0-19, below the sequence's first 40, attention
// reduces them in another order and the logits differ in rounding; with it they go after
// the sequence's cells, in position order, and the 20 rows' logits are bitwise those of
// the run alone.

#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static std::vector<llama_token> tokens(const llama_vocab * vocab, int n, int salt) {
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> out(n);
    for (int i = 0; i < n; i++) {
        out[i] = 1000 + (i * 37 + salt * 101) % (n_vocab / 2);
    }
    return out;
}

// decode `toks` for `seq` from position `pos0`; every row's logits when all_logits
static bool decode(llama_context * ctx, llama_seq_id seq, const std::vector<llama_token> & toks,
                   int pos0, bool all_logits) {
    llama_batch batch = llama_batch_init((int) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        batch.token[i] = toks[i];
        batch.pos[i] = pos0 + (int) i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = seq;
        batch.logits[i] = all_logits || i + 1 == toks.size();
    }
    batch.n_tokens = (int) toks.size();
    const int rc = llama_decode(ctx, batch);
    llama_batch_free(batch);
    if (rc != 0) {
        printf("FAIL: llama_decode returned %d\n", rc);
    }
    return rc == 0;
}

static llama_context * unified_context(llama_model * model) {
    llama_context_params params = llama_context_default_params();
    params.n_ctx = 512;
    params.n_batch = 512;
    params.n_ubatch = 512;
    params.n_seq_max = 4;
    params.kv_unified = true;
    params.swa_full = true;
    params.n_threads = 2;
    params.n_threads_batch = 2;
    return llama_init_from_model(model, params);
}

// llama.cpp's errors only: the model loader's info lines would bury the result
static void log_errors(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [unordered]\n", argv[0]);
        return 2;
    }
    const bool ordered = argc < 3 || strcmp(argv[2], "unordered") != 0;
    setenv("LLAMA_KV_CACHE_ORDERED", ordered ? "1" : "0", 1);  // read when a context is created
    llama_log_set(log_errors, nullptr);
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.use_extra_bufts = false;  // no weight repacking: one matmul path (as dgr)
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (model == nullptr) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 2;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const auto other = tokens(vocab, 40, 1);
    const auto prompt = tokens(vocab, 40, 2);
    const auto more = tokens(vocab, 20, 3);

    llama_context * alone = unified_context(model);
    bool ok = decode(alone, 1, prompt, 0, false) && decode(alone, 1, more, 40, true);
    std::vector<float> expected(llama_get_logits(alone), llama_get_logits(alone) + (size_t) 20 * n_vocab);

    llama_context * shared = unified_context(model);
    ok = ok && decode(shared, 0, other, 0, false) && decode(shared, 1, prompt, 0, false);
    llama_memory_seq_rm(llama_get_memory(shared), 0, -1, -1);
    ok = ok && decode(shared, 1, more, 40, true);
    int failures = ok ? 0 : 1;
    if (ok) {
        const float * got = llama_get_logits(shared);
        for (int row = 0; row < 20; row++) {
            if (memcmp(got + (size_t) row * n_vocab, expected.data() + (size_t) row * n_vocab,
                       sizeof(float) * n_vocab) != 0) {
                printf("FAIL: row %d (position %d): logits differ from the sequence's run alone\n",
                       row, 40 + row);
                failures++;
            }
        }
    }
    llama_free(alone);
    llama_free(shared);
    llama_model_free(model);
    printf("kv ordered: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
