// Native test of patch 0015: in a unified KV cache with LLAMA_KV_CACHE_ORDERED=1, a sequence
// with no empty cell after its own finds no slot (rather than a cell below its own), and once
// moved (its state saved, removed and restored) it goes on bitwise as it does alone.
//
//   test-kv-full MODEL.gguf
//
// A 256-cell pool is filled: sequence 2 takes cells 0-63, sequence 0 a 20-token prompt
// (64-83), sequence 1 cells 96-255, sequence 3 cells 84-95. Sequence 2 is removed: the only
// empty cells lie below sequence 0's. Its next token must fail with 1 and leave the cache as
// it was; without the patch it is placed in cell 0 and its logits differ from its run alone.
// Saved, removed and restored, sequence 0 lies in the lowest cells, and that token's logits
// are bitwise those of its run alone.
#include "kv_test.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static const int N_CTX = 256;
static const int N_PROMPT = 20;

static std::vector<float> last_logits(llama_context * ctx) {
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    const float * row = llama_get_logits_ith(ctx, -1);
    return std::vector<float>(row, row + n_vocab);
}

int main(int argc, char ** argv) {
    llama_model * model = test_model(argc, argv);
    if (model == nullptr) {
        return 2;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const std::vector<llama_token> prompt = test_tokens(vocab, N_PROMPT + 1, 0);
    int failures = 0;

    // sequence 0 alone: its prompt, then one more token
    std::vector<float> alone;
    {
        llama_context * ctx = unified_context(model, N_CTX, 4);
        if (ctx == nullptr || !decode_run(ctx, 0, prompt, 0, N_PROMPT, 0, false)
                || !decode_run(ctx, 0, prompt, N_PROMPT, N_PROMPT + 1, N_PROMPT, false)) {
            return 2;
        }
        alone = last_logits(ctx);
        llama_free(ctx);
    }

    llama_context * ctx = unified_context(model, N_CTX, 4);
    if (ctx == nullptr || llama_n_ctx(ctx) != N_CTX) {
        printf("FAIL: no context of %d cells\n", N_CTX);
        return 2;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    bool ok = decode_run(ctx, 2, test_tokens(vocab, 64, 2), 0, 64, 0, false)
           && decode_run(ctx, 0, prompt, 0, N_PROMPT, 0, false)
           && decode_run(ctx, 1, test_tokens(vocab, 160, 1), 0, 160, 0, false)
           && decode_run(ctx, 3, test_tokens(vocab, 12, 3), 0, 12, 0, false);
    if (!ok) {
        return 2;
    }
    llama_memory_seq_rm(mem, 2, -1, -1);

    // its next token: no empty cell after its own
    llama_batch batch = llama_batch_init(1, 0, 1);
    batch.token[0] = prompt[N_PROMPT];
    batch.pos[0] = N_PROMPT;
    batch.n_seq_id[0] = 1;
    batch.seq_id[0][0] = 0;
    batch.logits[0] = 1;
    batch.n_tokens = 1;
    const int rc = llama_decode(ctx, batch);
    if (rc == 0) {
        const bool same = memcmp(last_logits(ctx).data(), alone.data(), alone.size() * sizeof(float)) == 0;
        printf("FAIL: the token was placed below the sequence's cells (llama_decode 0; logits %s "
               "its run alone)\n", same ? "still equal to" : "differ from");
        failures++;
    } else if (rc != 1 || llama_memory_seq_pos_max(mem, 0) != N_PROMPT - 1) {
        printf("FAIL: llama_decode returned %d (want 1) and sequence 0 holds up to %d (want %d)\n",
               rc, llama_memory_seq_pos_max(mem, 0), N_PROMPT - 1);
        failures++;
    } else {
        // moved: saved, removed, restored into the lowest empty cells
        std::vector<uint8_t> state(llama_state_seq_get_size(ctx, 0));
        const size_t saved = llama_state_seq_get_data(ctx, state.data(), state.size(), 0);
        llama_memory_seq_rm(mem, 0, -1, -1);
        if (saved == 0 || llama_state_seq_set_data(ctx, state.data(), saved, 0) == 0) {
            printf("FAIL: sequence 0 could not be saved and restored\n");
            failures++;
        } else if (llama_decode(ctx, batch) != 0) {
            printf("FAIL: the moved sequence's next token found no slot\n");
            failures++;
        } else if (memcmp(last_logits(ctx).data(), alone.data(), alone.size() * sizeof(float)) != 0) {
            printf("FAIL: the moved sequence's logits differ from its run alone\n");
            failures++;
        }
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    printf("kv full: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
