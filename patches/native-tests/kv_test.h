// What the KV cache tests (test_kv_*.cpp) share: the model loaded and a unified cache
// opened as dgr opens them, test tokens, and one llama_decode of given rows.
#pragma once

#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

// llama.cpp's errors only: the model loader's info lines would bury the result
static void log_errors(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

// The model at `path` without weight repacking (one matmul path, as dgr), or nullptr
// after saying why.
static llama_model * load_model(const char * path) {
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(path, mparams);
    if (model == nullptr) {
        fprintf(stderr, "cannot load %s\n", path);
    }
    return model;
}

// The model a test is given (argv[1]), loaded for contexts with ordered KV cells (as
// dgr's), or nullptr after the usage or why.
static llama_model * test_model(int argc, char ** argv, const char * usage = "MODEL.gguf") {
    if (argc < 2) {
        fprintf(stderr, "usage: %s %s\n", argv[0], usage);
        return nullptr;
    }
    setenv("LLAMA_KV_CACHE_ORDERED", "1", 1);  // read when a context is created
    llama_log_set(log_errors, nullptr);
    return load_model(argv[1]);
}

// One cache stream for all n_seq_max sequences, SWA layers full size (as dgr).
static llama_context * unified_context(llama_model * model, int n_ctx, int n_seq_max,
                                       llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO) {
    llama_context_params params = llama_context_default_params();
    params.flash_attn_type = flash_attn;
    params.n_ctx = n_ctx;
    params.n_batch = 512;
    params.n_ubatch = 512;
    params.n_seq_max = n_seq_max;
    params.kv_unified = true;
    params.swa_full = true;
    params.n_threads = 2;
    params.n_threads_batch = 2;
    return llama_init_from_model(model, params);
}

// n tokens from the first half of the vocabulary, another sequence for each salt
static std::vector<llama_token> test_tokens(const llama_vocab * vocab, int n, int salt) {
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> out(n);
    for (int i = 0; i < n; i++) {
        out[i] = 1000 + (i * 37 + salt * 101) % (n_vocab / 2);
    }
    return out;
}

// One llama_decode of the rows (token, position, sequence): every row's logits with
// all_logits, else the last row's. Says FAIL when the call fails.
static bool decode_rows(llama_context * ctx, const std::vector<llama_token> & toks,
                        const std::vector<llama_pos> & pos, const std::vector<llama_seq_id> & seq,
                        bool all_logits) {
    llama_batch batch = llama_batch_init((int) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        batch.token[i] = toks[i];
        batch.pos[i] = pos[i];
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = seq[i];
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

// toks[from, to) for `seq`, at positions from pos0 on (decode_rows)
static bool decode_run(llama_context * ctx, llama_seq_id seq, const std::vector<llama_token> & toks,
                       int from, int to, int pos0, bool all_logits) {
    std::vector<llama_pos> pos;
    for (int i = 0; i < to - from; i++) {
        pos.push_back(pos0 + i);
    }
    return decode_rows(ctx, std::vector<llama_token>(toks.begin() + from, toks.begin() + to), pos,
                       std::vector<llama_seq_id>(to - from, seq), all_logits);
}
