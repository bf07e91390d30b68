# The parts of llama.h (llama.cpp 0c1e57098, vendored by llama-cpp-python 0.3.36)
# that dgr's Cython modules use. Structs list only the fields dgr touches: Cython takes
# the real layout from the header.

from libc.stdint cimport int8_t, int32_t, uint8_t, uint32_t, uint64_t

cdef extern from "ggml.h" nogil:
    enum ggml_log_level:
        GGML_LOG_LEVEL_NONE
        GGML_LOG_LEVEL_DEBUG
        GGML_LOG_LEVEL_INFO
        GGML_LOG_LEVEL_WARN
        GGML_LOG_LEVEL_ERROR
        GGML_LOG_LEVEL_CONT
    ctypedef void (*ggml_log_callback)(ggml_log_level level, const char * text, void * user_data)
    ctypedef bint (*ggml_abort_callback)(void * data)

cdef extern from "ggml-backend.h" nogil:
    cdef struct ggml_backend_reg:
        pass
    ctypedef ggml_backend_reg * ggml_backend_reg_t
    cdef struct ggml_backend_device:
        pass
    ctypedef ggml_backend_device * ggml_backend_dev_t
    enum ggml_backend_dev_type:
        GGML_BACKEND_DEVICE_TYPE_CPU
    ggml_backend_reg_t ggml_backend_reg_by_name(const char * name)
    void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name)
    size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg)
    ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index)
    const char * ggml_backend_dev_name(ggml_backend_dev_t device)
    const char * ggml_backend_dev_description(ggml_backend_dev_t device)
    void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total)
    ggml_backend_dev_t ggml_backend_dev_by_type(ggml_backend_dev_type type)
    cdef struct ggml_backend_buffer_type:
        pass
    ctypedef ggml_backend_buffer_type * ggml_backend_buffer_type_t
    ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type()
    const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft)
    ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device)
    # the CPU device's extra buffer types (repacked weights), NULL-terminated
    ctypedef ggml_backend_buffer_type_t * (*ggml_backend_dev_get_extra_bufts_t)(ggml_backend_dev_t device)

cdef extern from "ggml-rpc.h":
    int RPC_PROTO_MAJOR_VERSION
    int RPC_PROTO_MINOR_VERSION

# ggml-rpc.h's entry points, looked up through the RPC backend's registry
# (ggml_backend_reg_get_proc_address) as llama.cpp's rpc-server does
ctypedef ggml_backend_reg_t (*rpc_add_server_fn)(const char * endpoint) noexcept nogil
ctypedef void (*rpc_start_server_fn)(const char * endpoint, const char * cache_dir,
                                     size_t n_threads, size_t n_devices,
                                     ggml_backend_dev_t * devices) noexcept nogil
cdef extern from "<stdbool.h>":
    ctypedef bint c_bool "bool"
# patch 0005: false once a command to that worker failed (closed, reset or timed out)
ctypedef c_bool (*rpc_connected_fn)(const char * endpoint) noexcept nogil

cdef extern from "llama.h" nogil:
    ctypedef int32_t llama_pos
    ctypedef int32_t llama_token
    ctypedef int32_t llama_seq_id

    cdef struct llama_model:
        pass
    cdef struct llama_context:
        pass
    cdef struct llama_vocab:
        pass
    cdef struct llama_sampler:
        pass
    cdef struct llama_memory_i:
        pass
    ctypedef llama_memory_i * llama_memory_t

    ctypedef struct llama_batch:
        int32_t n_tokens
        llama_token * token
        float * embd
        llama_pos * pos
        int32_t * n_seq_id
        llama_seq_id ** seq_id
        int8_t * logits

    cdef struct llama_model_tensor_buft_override:
        const char * pattern
        ggml_backend_buffer_type_t buft

    cdef struct llama_model_params:
        ggml_backend_dev_t * devices
        const llama_model_tensor_buft_override * tensor_buft_overrides
        int32_t n_gpu_layers
        const float * tensor_split
        bint vocab_only
        bint use_extra_bufts

    cdef enum llama_flash_attn_type:
        LLAMA_FLASH_ATTN_TYPE_AUTO
        LLAMA_FLASH_ATTN_TYPE_DISABLED
        LLAMA_FLASH_ATTN_TYPE_ENABLED

    cdef struct llama_context_params:
        uint32_t n_ctx
        uint32_t n_batch
        uint32_t n_ubatch
        uint32_t n_seq_max
        uint32_t n_rs_seq
        llama_flash_attn_type flash_attn_type
        int32_t n_threads
        int32_t n_threads_batch
        ggml_abort_callback abort_callback
        void * abort_callback_data
        bint no_perf
        bint swa_full
        bint kv_unified
        int pooling_type  # enum llama_pooling_type
        bint embeddings

    ctypedef struct llama_sampler_chain_params:
        bint no_perf

    ctypedef struct llama_chat_message:
        const char * role
        const char * content

    llama_model_params llama_model_default_params()
    llama_context_params llama_context_default_params()
    llama_sampler_chain_params llama_sampler_chain_default_params()

    void llama_backend_init()
    void llama_log_set(ggml_log_callback log_callback, void * user_data)
    const char * llama_print_system_info()

    llama_model * llama_model_load_from_file(const char * path_model, llama_model_params params)
    void llama_model_free(llama_model * model)
    size_t llama_max_devices()
    llama_context * llama_init_from_model(llama_model * model, llama_context_params params)
    void llama_free(llama_context * ctx)

    uint32_t llama_n_ctx(const llama_context * ctx)
    uint32_t llama_n_ctx_seq(const llama_context * ctx)
    uint32_t llama_n_batch(const llama_context * ctx)
    uint32_t llama_n_ubatch(const llama_context * ctx)
    uint32_t llama_n_seq_max(const llama_context * ctx)
    uint32_t llama_n_rs_seq(const llama_context * ctx)
    bint llama_model_is_recurrent(const llama_model * model)
    bint llama_model_is_hybrid(const llama_model * model)
    llama_memory_t llama_get_memory(const llama_context * ctx)
    void llama_memory_clear(llama_memory_t mem, bint data)
    int32_t llama_model_n_embd_out(const llama_model * model)
    uint32_t llama_model_n_cls_out(const llama_model * model)
    float * llama_get_embeddings_ith(llama_context * ctx, int32_t i)
    float * llama_get_embeddings_seq(llama_context * ctx, llama_seq_id seq_id)

    const llama_vocab * llama_model_get_vocab(const llama_model * model)
    int32_t llama_model_n_ctx_train(const llama_model * model)
    int32_t llama_model_n_embd(const llama_model * model)
    int32_t llama_model_n_layer(const llama_model * model)
    int32_t llama_model_n_swa(const llama_model * model)
    int32_t llama_vocab_n_tokens(const llama_vocab * vocab)
    int32_t llama_model_meta_val_str(const llama_model * model, const char * key, char * buf, size_t buf_size)
    int32_t llama_model_desc(const llama_model * model, char * buf, size_t buf_size)
    uint64_t llama_model_size(const llama_model * model)
    uint64_t llama_model_n_params(const llama_model * model)
    const char * llama_model_chat_template(const llama_model * model, const char * name)

    bint llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1)
    void llama_memory_seq_cp(llama_memory_t mem, llama_seq_id seq_id_src, llama_seq_id seq_id_dst,
                             llama_pos p0, llama_pos p1)
    llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id)
    llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id)

    size_t llama_state_seq_get_size(llama_context * ctx, llama_seq_id seq_id)
    size_t llama_state_seq_get_data(llama_context * ctx, uint8_t * dst, size_t size,
                                    llama_seq_id seq_id)
    size_t llama_state_seq_set_data(llama_context * ctx, const uint8_t * src, size_t size,
                                    llama_seq_id dest_seq_id)

    llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max)
    void llama_batch_free(llama_batch batch)
    int32_t llama_decode(llama_context * ctx, llama_batch batch)

    # LoRa adapters: loaded onto a model (which frees those left at its own free), and
    # applied per sequence in one llama_decode (patch 0018)
    cdef struct llama_adapter_lora:
        pass
    llama_adapter_lora * llama_adapter_lora_init(llama_model * model, const char * path_lora)
    void llama_adapter_lora_free(llama_adapter_lora * adapter)
    uint64_t llama_adapter_get_alora_n_invocation_tokens(const llama_adapter_lora * adapter)
    int32_t llama_set_adapters_lora_seq(llama_context * ctx, llama_adapter_lora ** adapters,
                                        size_t n_adapters)
    int32_t llama_set_adapter_lora_seq_scale(llama_context * ctx, llama_adapter_lora * adapter,
                                             llama_seq_id seq_id, float scale)
    void llama_synchronize(llama_context * ctx)
    void llama_set_abort_callback(llama_context * ctx, ggml_abort_callback abort_callback, void * abort_callback_data)
    float * llama_get_logits(llama_context * ctx)

    bint llama_vocab_is_eog(const llama_vocab * vocab, llama_token token)
    bint llama_vocab_is_control(const llama_vocab * vocab, llama_token token)
    llama_token llama_vocab_bos(const llama_vocab * vocab)
    llama_token llama_vocab_eos(const llama_vocab * vocab)
    llama_token llama_vocab_sep(const llama_vocab * vocab)
    bint llama_vocab_get_add_bos(const llama_vocab * vocab)
    bint llama_vocab_get_add_eos(const llama_vocab * vocab)
    bint llama_vocab_get_add_sep(const llama_vocab * vocab)

    int32_t llama_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len,
                           llama_token * tokens, int32_t n_tokens_max,
                           bint add_special, bint parse_special)
    int32_t llama_token_to_piece(const llama_vocab * vocab, llama_token token, char * buf,
                                 int32_t length, int32_t lstrip, bint special)
    int32_t llama_chat_apply_template(const char * tmpl, const llama_chat_message * chat,
                                      size_t n_msg, bint add_ass, char * buf, int32_t length)

    llama_sampler * llama_sampler_chain_init(llama_sampler_chain_params params)
    void llama_sampler_chain_add(llama_sampler * chain, llama_sampler * smpl)
    llama_sampler * llama_sampler_init_greedy()
    llama_sampler * llama_sampler_init_dist(uint32_t seed)
    llama_sampler * llama_sampler_init_top_k(int32_t k)
    llama_sampler * llama_sampler_init_top_p(float p, size_t min_keep)
    llama_sampler * llama_sampler_init_min_p(float p, size_t min_keep)
    llama_sampler * llama_sampler_init_typical(float p, size_t min_keep)
    llama_sampler * llama_sampler_init_temp(float t)
    llama_token llama_sampler_sample(llama_sampler * smpl, llama_context * ctx, int32_t idx)
    ctypedef struct llama_token_data:
        llama_token id
        float logit
        float p
    ctypedef struct llama_token_data_array:
        llama_token_data * data
        size_t size
        long long selected
        bint sorted
    void llama_sampler_apply(llama_sampler * smpl, llama_token_data_array * cur_p)
    void llama_sampler_accept(llama_sampler * smpl, llama_token token)
    void llama_sampler_reset(llama_sampler * smpl)
    void llama_sampler_free(llama_sampler * smpl)

    ctypedef struct llama_logit_bias:
        llama_token token
        float bias

    llama_sampler * llama_sampler_init_logit_bias(int32_t n_vocab, int32_t n_logit_bias,
                                                  const llama_logit_bias * logit_bias)
    llama_sampler * llama_sampler_init_grammar(const llama_vocab * vocab, const char * grammar_str,
                                               const char * grammar_root)
    llama_sampler * llama_sampler_init_penalties(int32_t n_vocab, int32_t penalty_last_n,
                                                 float penalty_repeat, float penalty_freq,
                                                 float penalty_present)
    int32_t llama_detokenize(const llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens,
                             char * text, int32_t text_len_max, bint remove_special, bint unparse_special)
