// Native test of patches 0018 and 0023: LoRa adapters applied per sequence in one
// llama_decode, each row computing only its own sequence's adapters. Two random adapters
// (their A and B on every layer's attn_q and ffn_down; X in F32, Y in F16) are listed on
// a context; sequences 0 and 3 take X at scale 1, sequence 1 takes Y at scale 0.5,
// sequence 2 takes none. One batch of a row per sequence (X a group of two rows) must give
// each row the logits it gets decoded alone, with the same settings; sequence 0's must be
// close to those of X applied to the whole context (llama_set_adapters_lora; its own
// arithmetic, so not bitwise), sequence 2's bitwise those of no adapter, and the adapters
// must change the logits. Without patch 0018 the per-sequence calls do not exist.
#include "kv_test.h"

#include "gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

static const int RANK = 4;
static const float ALPHA = 8.0f;
static const char * TARGETS[] = {"attn_q", "ffn_down"};

// A LoRa GGUF for the model at `model_path`: A [n_in, RANK] and B [RANK, n_out] of every
// target weight, of `type` (F32 or F16), deterministic values from `seed`.
static bool write_adapter(const char * model_path, const char * out_path, uint32_t seed, ggml_type type) {
    ggml_context * meta = nullptr;
    gguf_init_params params = {/*.no_alloc =*/ true, /*.ctx =*/ &meta};
    gguf_context * base = gguf_init_from_file(model_path, params);
    if (base == nullptr) {
        return false;
    }
    const int key = gguf_find_key(base, "general.architecture");
    const std::string arch = gguf_get_val_str(base, key);
    ggml_init_params cparams = {/*.mem_size =*/ 256u << 20, /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ false};
    ggml_context * ctx = ggml_init(cparams);
    gguf_context * out = gguf_init_empty();
    gguf_set_val_str(out, "general.architecture", arch.c_str());
    gguf_set_val_str(out, "general.type", "adapter");
    gguf_set_val_str(out, "adapter.type", "lora");
    gguf_set_val_f32(out, "adapter.lora.alpha", ALPHA);
    uint32_t state = seed;
    for (int il = 0; ; il++) {
        bool any = false;
        for (const char * target : TARGETS) {
            const std::string name = "blk." + std::to_string(il) + "." + target + ".weight";
            ggml_tensor * w = ggml_get_tensor(meta, name.c_str());
            if (w == nullptr) {
                continue;
            }
            any = true;
            ggml_tensor * a = ggml_new_tensor_2d(ctx, type, w->ne[0], RANK);
            ggml_tensor * b = ggml_new_tensor_2d(ctx, type, RANK, w->ne[1]);
            ggml_set_name(a, (name + ".lora_a").c_str());
            ggml_set_name(b, (name + ".lora_b").c_str());
            for (ggml_tensor * t : {a, b}) {
                for (int64_t i = 0; i < ggml_nelements(t); i++) {
                    state = state * 1664525u + 1013904223u;
                    const float value = ((float) (state >> 8) / (float) (1u << 24) - 0.5f) * 0.1f;
                    if (type == GGML_TYPE_F16) {
                        ((ggml_fp16_t *) t->data)[i] = ggml_fp32_to_fp16(value);
                    } else {
                        ((float *) t->data)[i] = value;
                    }
                }
                gguf_add_tensor(out, t);
            }
        }
        if (!any) {
            break;
        }
    }
    const bool written = gguf_write_to_file(out, out_path, false);
    gguf_free(out);
    ggml_free(ctx);
    gguf_free(base);
    ggml_free(meta);
    return written;
}

static std::vector<float> row_logits(llama_context * ctx, int row) {
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    const float * logits = llama_get_logits_ith(ctx, row);
    return std::vector<float>(logits, logits + n_vocab);
}

// a context as dgr opens one (flash attention on, one unified cache), with X and Y
// listed per sequence: sequences 0 and 3 take X at 1, sequence 1 Y at 0.5
static llama_context * lora_context(llama_model * model, llama_adapter_lora * x, llama_adapter_lora * y) {
    llama_context * ctx = unified_context(model, 256, 4, LLAMA_FLASH_ATTN_TYPE_ENABLED);
    if (ctx == nullptr) {
        return nullptr;
    }
    llama_adapter_lora * listed[] = {x, y};
    if (x != nullptr && (llama_set_adapters_lora_seq(ctx, listed, 2) != 0
                         || llama_set_adapter_lora_seq_scale(ctx, x, 0, 1.0f) != 0
                         || llama_set_adapter_lora_seq_scale(ctx, x, 3, 1.0f) != 0
                         || llama_set_adapter_lora_seq_scale(ctx, y, 1, 0.5f) != 0)) {
        llama_free(ctx);
        return nullptr;
    }
    return ctx;
}

static int compare(const char * what, const std::vector<float> & got, const std::vector<float> & want,
                   bool equal) {
    const bool same = got.size() == want.size()
                      && memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
    printf("%s: %s\n", what, same ? "bitwise equal" : "differ");
    return same == equal ? 0 : 1;
}

// got within 1 % of the adapter's effect (the largest |effect - base|) of want
static int close_to(const char * what, const std::vector<float> & got, const std::vector<float> & want,
                    const std::vector<float> & base) {
    float diff = 0.0f, effect = 0.0f;
    for (size_t i = 0; i < want.size(); i++) {
        diff = std::max(diff, std::fabs(got[i] - want[i]));
        effect = std::max(effect, std::fabs(want[i] - base[i]));
    }
    const bool close = got.size() == want.size() && effect > 0.0f && diff <= 0.01f * effect;
    printf("%s: max |diff| %g, the adapter's effect %g: %s\n", what, diff, effect, close ? "close" : "FAR");
    return close ? 0 : 1;
}

// the nodes of the graph of a one-row decode on a context as lora_context makes it,
// counted as the scheduler asks the evaluation callback about each
static bool count_node(ggml_tensor *, bool ask, void * user_data) {
    if (ask) {
        ++*(int *) user_data;
    }
    return false;
}

static int graph_nodes(llama_model * model, llama_adapter_lora * x, llama_adapter_lora * y) {
    llama_context_params params = llama_context_default_params();
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    params.n_ctx = 256;
    params.n_seq_max = 4;
    params.kv_unified = true;
    params.swa_full = true;
    params.n_threads = params.n_threads_batch = 2;
    int nodes = 0;
    params.cb_eval = count_node;
    params.cb_eval_user_data = &nodes;
    llama_context * ctx = llama_init_from_model(model, params);
    llama_adapter_lora * listed[] = {x, y};
    if (ctx == nullptr || (x != nullptr && llama_set_adapters_lora_seq(ctx, listed, 2) != 0)
            || !decode_rows(ctx, test_tokens(llama_model_get_vocab(model), 1, 3), {0}, {0}, true)) {
        return -1;
    }
    llama_free(ctx);
    return nodes;
}

// --bench: the seconds of a 64-row decode (rows of 4 sequences, position 0) with no
// adapter listed and with X and Y listed per sequence, median of 9 alternating rounds
static int bench(llama_model * model, llama_adapter_lora * x, llama_adapter_lora * y) {
    const std::vector<llama_token> toks = test_tokens(llama_model_get_vocab(model), 64, 7);
    std::vector<llama_pos> pos(64);
    std::vector<llama_seq_id> seq(64);
    for (int i = 0; i < 64; i++) {
        pos[i] = i / 4;
        seq[i] = i % 4;
    }
    std::vector<double> times[2];
    for (int r = 0; r < 9; r++) {
        for (int k = 0; k < 2; k++) {
            const int with = (r + k) % 2;  // alternating which goes first
            llama_context * ctx = lora_context(model, with ? x : nullptr, with ? y : nullptr);
            if (ctx == nullptr || !decode_rows(ctx, {toks[0]}, {0}, {0}, false)) {  // warm-up
                return 2;
            }
            llama_memory_clear(llama_get_memory(ctx), true);
            const int64_t t0 = ggml_time_us();
            if (!decode_rows(ctx, toks, pos, seq, false)) {
                return 2;
            }
            times[with].push_back((ggml_time_us() - t0) / 1e6);
            llama_free(ctx);
        }
    }
    for (int k = 0; k < 2; k++) {
        std::sort(times[k].begin(), times[k].end());
    }
    printf("64 rows, 4 sequences: no adapter %.4f s, X and Y per sequence %.4f s (medians of 9; "
           "ratio %.3f)\n", times[0][4], times[1][4], times[1][4] / times[0][4]);
    return 0;
}

int main(int argc, char ** argv) {
    llama_model * model = test_model(argc, argv, "MODEL.gguf [--bench]");
    if (model == nullptr) {
        return 2;
    }
    const std::string dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    const std::string x_path = dir + "/dgr-lora-seq-x.gguf", y_path = dir + "/dgr-lora-seq-y.gguf";
    if (!write_adapter(argv[1], x_path.c_str(), 1, GGML_TYPE_F32)
            || !write_adapter(argv[1], y_path.c_str(), 2, GGML_TYPE_F16)) {
        fprintf(stderr, "cannot write the adapters\n");
        return 2;
    }
    llama_adapter_lora * x = llama_adapter_lora_init(model, x_path.c_str());
    llama_adapter_lora * y = llama_adapter_lora_init(model, y_path.c_str());
    if (x == nullptr || y == nullptr) {
        fprintf(stderr, "llama.cpp refused the adapters\n");
        return 2;
    }
    if (argc > 2 && strcmp(argv[2], "--bench") == 0) {
        return bench(model, x, y);
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const std::vector<llama_token> toks = test_tokens(vocab, 4, 5);
    int failures = 0;

    // a row per sequence, at position 0, in one batch
    llama_context * ctx = lora_context(model, x, y);
    if (ctx == nullptr || !decode_rows(ctx, toks, {0, 0, 0, 0}, {0, 1, 2, 3}, true)) {
        return 2;
    }
    std::vector<float> together[4];
    for (int s = 0; s < 4; s++) {
        together[s] = row_logits(ctx, s);
    }
    llama_free(ctx);

    // each alone
    std::vector<float> alone[4];
    for (int s = 0; s < 4; s++) {
        ctx = lora_context(model, x, y);
        if (ctx == nullptr || !decode_rows(ctx, {toks[s]}, {0}, {s}, true)) {
            return 2;
        }
        alone[s] = row_logits(ctx, 0);
        llama_free(ctx);
    }
    // four rows a sequence, the output row each sequence's last: the last layers run the
    // output rows only (their own scales)
    const std::vector<llama_token> long_toks = test_tokens(vocab, 12, 9);
    ctx = lora_context(model, x, y);
    if (ctx == nullptr) {
        return 2;
    }
    {
        llama_batch batch = llama_batch_init(12, 0, 1);
        for (int i = 0; i < 12; i++) {
            batch.token[i] = long_toks[i];
            batch.pos[i] = i / 3;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = i % 3;
            batch.logits[i] = i >= 9;  // rows 9, 10, 11: sequences 0, 1, 2 at position 3
        }
        batch.n_tokens = 12;
        if (llama_decode(ctx, batch) != 0) {
            printf("FAIL: llama_decode of the prompts\n");
            return 2;
        }
        llama_batch_free(batch);
    }
    std::vector<float> prompts_together[3];
    for (int s = 0; s < 3; s++) {
        prompts_together[s] = row_logits(ctx, 9 + s);
    }
    llama_free(ctx);
    for (int s = 0; s < 3; s++) {
        ctx = lora_context(model, x, y);
        std::vector<llama_token> own;
        for (int i = s; i < 12; i += 3) {
            own.push_back(long_toks[i]);
        }
        if (ctx == nullptr || !decode_rows(ctx, own, {0, 1, 2, 3}, {s, s, s, s}, false)) {
            return 2;
        }
        const std::string what = "sequence " + std::to_string(s) + ", 4 rows, output row only: together vs alone";
        failures += compare(what.c_str(), prompts_together[s], row_logits(ctx, -1), true);
        llama_free(ctx);
    }

    failures += compare("sequence 0 (X) together vs alone", together[0], alone[0], true);
    failures += compare("sequence 1 (Y at 0.5) together vs alone", together[1], alone[1], true);
    failures += compare("sequence 2 (none) together vs alone", together[2], alone[2], true);
    failures += compare("sequence 3 (X, beside sequence 0 on X) together vs alone", together[3], alone[3], true);

    // the same tokens with no adapter, and with X on the whole context
    std::vector<float> base[3], whole_x;
    for (int s = 0; s < 3; s++) {
        ctx = lora_context(model, nullptr, nullptr);
        if (ctx == nullptr || !decode_rows(ctx, {toks[s]}, {0}, {s}, true)) {
            return 2;
        }
        base[s] = row_logits(ctx, 0);
        if (s == 0) {
            float one = 1.0f;
            llama_memory_clear(llama_get_memory(ctx), true);
            if (llama_set_adapters_lora(ctx, &x, 1, &one) != 0
                    || !decode_rows(ctx, {toks[0]}, {0}, {0}, true)) {
                return 2;
            }
            whole_x = row_logits(ctx, 0);
        }
        llama_free(ctx);
    }
    failures += close_to("sequence 0 (X) vs X on the whole context", alone[0], whole_x, base[0]);
    failures += compare("sequence 2 (none) vs no adapter", alone[2], base[2], true);

    // two adapters listed add one operation per adapted weight (attn_q and ffn_down of
    // every layer), whatever the number of adapters
    const int plain = graph_nodes(model, nullptr, nullptr), listed = graph_nodes(model, x, y);
    const int adapted = 2 * llama_model_n_layer(model);
    printf("graph nodes: %d with no adapter, %d with X and Y listed (%d adapted weights)\n",
           plain, listed, adapted);
    failures += plain < 0 || listed - plain != adapted;
    failures += compare("sequence 0 (X) vs no adapter", alone[0], base[0], false);
    failures += compare("sequence 1 (Y) vs no adapter", alone[1], base[1], false);

    llama_adapter_lora_free(x);
    llama_adapter_lora_free(y);
    llama_model_free(model);
    printf("lora_seq: %d failure(s)\n", failures);
    return failures == 0 ? 0 : 1;
}
