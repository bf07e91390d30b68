// Native test of patch 0012: in a unified KV cache with LLAMA_KV_CACHE_ORDERED=1, sequences
// decoded together fill blocks of adjacent cells instead of taking every n-th cell.
//
//   test-kv-blocks MODEL.gguf
//
// Four sequences each decode a 5-token prompt, then 40 steps of one token each, the four
// in one batch. The cache's map of which sequence holds which cell (its debug log,
// LLAMA_KV_CACHE_DEBUG=3) is read after the last step: every sequence's 45 cells must lie
// in at most 2 runs of adjacent cells (blocks of 32). Without the patch the four take
// turns cell by cell, each in 41 or more runs.

#include "kv_test.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static const int N_SEQ = 4;
static const int N_PROMPT = 5;
static const int N_STEPS = 40;
static const int MAX_RUNS = 2;

// the last map of the cells' sequences the cache logged: one character per cell ('.' empty,
// the sequence id, 'M' for several); the map of positions that follows it has spaces
static std::string last_map;
static std::string pending;

static void capture(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
    if (level != GGML_LOG_LEVEL_DEBUG && level != GGML_LOG_LEVEL_CONT) {
        return;
    }
    pending += text;
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
        std::string block = pending.substr(0, end);
        pending.erase(0, end + 2);
        std::string cells;
        for (size_t i = 0; i < block.size(); i++) {
            if (block.compare(i, 2, " *") == 0) {
                i++;
            } else if (block[i] != '\n') {
                cells += block[i];
            }
        }
        if (!cells.empty() && cells.find_first_not_of(".0123456789M") == std::string::npos) {
            last_map = cells;
        }
    }
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    setenv("LLAMA_KV_CACHE_ORDERED", "1", 1);  // both read when a context is created
    setenv("LLAMA_KV_CACHE_DEBUG", "3", 1);
    llama_log_set(capture, nullptr);
    llama_model * model = load_model(argv[1]);
    if (model == nullptr) {
        return 2;
    }
    llama_context * ctx = unified_context(model, 512, N_SEQ);

    bool ok = ctx != nullptr;
    for (int s = 0; ok && s < N_SEQ; s++) {
        ok = decode_run(ctx, s, std::vector<llama_token>(N_PROMPT, 1000 + s), 0, N_PROMPT, 0,
                        false);
    }
    // the last of these steps only logs the map the steps before it left
    for (int step = 0; ok && step <= N_STEPS; step++) {
        std::vector<llama_token> toks;
        std::vector<llama_pos> pos;
        std::vector<llama_seq_id> seq;
        for (int s = 0; s < N_SEQ; s++) {
            toks.push_back(2000 + step);
            pos.push_back(N_PROMPT + step);
            seq.push_back(s);
        }
        ok = decode_rows(ctx, toks, pos, seq, false);
    }

    int failures = ok ? 0 : 1;
    if (ok && last_map.empty()) {
        printf("FAIL: the cache logged no map of its cells\n");
        failures++;
    }
    for (int s = 0; ok && !last_map.empty() && s < N_SEQ; s++) {
        const char id = (char) ('0' + s);
        int cells = 0, runs = 0;
        for (size_t i = 0; i < last_map.size(); i++) {
            if (last_map[i] == id) {
                cells++;
                runs += i == 0 || last_map[i - 1] != id;
            }
        }
        if (cells != N_PROMPT + N_STEPS || runs > MAX_RUNS) {
            printf("FAIL: sequence %d holds %d cells in %d runs (want %d cells in at most %d)\n",
                   s, cells, runs, N_PROMPT + N_STEPS, MAX_RUNS);
            failures++;
        }
    }
    llama_free(ctx);
    llama_model_free(model);
    printf("kv blocks: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
