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

#include "kv_test.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [unordered]\n", argv[0]);
        return 2;
    }
    const bool ordered = argc < 3 || strcmp(argv[2], "unordered") != 0;
    setenv("LLAMA_KV_CACHE_ORDERED", ordered ? "1" : "0", 1);  // read when a context is created
    llama_log_set(log_errors, nullptr);
    llama_model * model = load_model(argv[1]);
    if (model == nullptr) {
        return 2;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const auto other = test_tokens(vocab, 40, 1);
    const auto prompt = test_tokens(vocab, 40, 2);
    const auto more = test_tokens(vocab, 20, 3);

    llama_context * alone = unified_context(model, 512, 4);
    bool ok = decode_run(alone, 1, prompt, 0, 40, 0, false)
              && decode_run(alone, 1, more, 0, 20, 40, true);
    std::vector<float> expected(llama_get_logits(alone), llama_get_logits(alone) + (size_t) 20 * n_vocab);

    llama_context * shared = unified_context(model, 512, 4);
    ok = ok && decode_run(shared, 0, other, 0, 40, 0, false)
            && decode_run(shared, 1, prompt, 0, 40, 0, false);
    llama_memory_seq_rm(llama_get_memory(shared), 0, -1, -1);
    ok = ok && decode_run(shared, 1, more, 0, 20, 40, true);
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
