// Native test of patch 0010: with LLAMA_KV_CACHE_ORDERED=1 and a full-size SWA cache, a
// sequence's saved state (llama_state_seq_get_data) holds all its cells, SWA layers
// included, so the sequence it restores is the one saved.
//
//   test-kv-state MODEL.gguf
//
// Sequence 0 decodes 600 tokens (more than the default model's SWA window of 512). Its
// state is restored into sequence 1, which must hold positions 0..599; then sequence 2
// takes the first 40 positions of sequence 1 (llama_memory_seq_cp) and decodes 20 more
// tokens, whose logits must be bitwise those of a fresh context decoding the same 40 +
// 20 tokens. Without the patch the saved SWA part holds only the window's last cells:
// sequence 1 starts at position 88 and sequence 2's copy has no SWA cells at all.

#include "kv_test.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    setenv("LLAMA_KV_CACHE_ORDERED", "1", 1);  // read when a context is created
    // every flash-attention row on the one-row path (patch 0008), as dgr runs it: a row's
    // logits then do not depend on where its cells lie in the pool, only on their bits
    setenv("GGML_CPU_FA_TILED", "0", 1);
    llama_log_set(log_errors, nullptr);
    llama_model * model = load_model(argv[1]);
    if (model == nullptr) {
        return 2;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int n_long = 600, n_prefix = 40, n_more = 20;
    const auto history = test_tokens(vocab, n_long, 1);
    const auto more = test_tokens(vocab, n_more, 2);
    int failures = 0;

    llama_context * fresh = unified_context(model, 2048, 4);
    bool ok = decode_run(fresh, 0, history, 0, n_prefix, 0, false)
              && decode_run(fresh, 0, more, 0, n_more, n_prefix, true);
    std::vector<float> expected;
    if (ok) {
        expected.assign(llama_get_logits(fresh), llama_get_logits(fresh) + (size_t) n_more * n_vocab);
    }

    llama_context * ctx = unified_context(model, 2048, 4);
    llama_memory_t mem = llama_get_memory(ctx);
    ok = ok && decode_run(ctx, 0, history, 0, 512, 0, false)
            && decode_run(ctx, 0, history, 512, n_long, 512, false);
    if (ok) {
        std::vector<uint8_t> state(llama_state_seq_get_size(ctx, 0));
        const size_t written = llama_state_seq_get_data(ctx, state.data(), state.size(), 0);
        if (written == 0 || llama_state_seq_set_data(ctx, state.data(), written, 1) == 0) {
            printf("FAIL: the sequence's state did not save and restore\n");
            ok = false;
        }
    }
    if (ok) {
        const llama_pos lo = llama_memory_seq_pos_min(mem, 1), hi = llama_memory_seq_pos_max(mem, 1);
        if (lo != 0 || hi != n_long - 1) {
            printf("FAIL: the restored sequence holds positions %d..%d, not 0..%d\n", lo, hi, n_long - 1);
            failures++;
        }
        llama_memory_seq_rm(mem, 0, -1, -1);
        llama_memory_seq_cp(mem, 1, 2, 0, n_prefix);
        ok = decode_run(ctx, 2, more, 0, n_more, n_prefix, true);
    }
    if (ok) {
        const float * got = llama_get_logits(ctx);
        int differ = 0;
        for (int row = 0; row < n_more; row++) {
            differ += memcmp(got + (size_t) row * n_vocab, expected.data() + (size_t) row * n_vocab,
                             sizeof(float) * n_vocab) != 0;
        }
        if (differ) {
            printf("FAIL: %d of %d rows after a prefix of the restored sequence differ from a "
                   "fresh context's\n", differ, n_more);
            failures++;
        }
    }
    failures += ok ? 0 : 1;
    llama_free(fresh);
    llama_free(ctx);
    llama_model_free(model);
    printf("kv state: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
