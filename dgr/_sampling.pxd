# Per-slot sampling (dgr/_sampling.pyx): sampler chains, grammars, bans, greedy
# argmax and log-probabilities. The engine owns one Sampling; the batch loop
# reaches it only through these methods.

from libc.stdint cimport int8_t, int32_t

from dgr._llama cimport llama_logit_bias, llama_sampler, llama_token_data, llama_vocab


cdef class Sampling:
    cdef const llama_vocab * vocab
    cdef int n_slots
    cdef int vocab_size
    cdef int n_threads                  # rows sampled at once (llama.cpp's OpenMP threads)
    cdef llama_sampler ** chains        # per slot: its llama.cpp sampler chain
    cdef llama_sampler ** grammars      # per slot: the grammar sampler, outside the chain (or NULL)
    cdef char * greedy                  # per slot: pure greedy, sampled by argmax in C
    cdef char * repick                  # per slot: how a pick its grammar rejects is redone
    cdef llama_token_data * best        # per thread: a greedy row's best candidates
    cdef llama_token_data * candidates  # per thread: one row's vocabulary (chain rows)
    cdef llama_logit_bias * eog_bias    # end-of-generation tokens, bias -inf
    cdef int n_eog
    cdef float * saved                  # per thread: banned logits while a greedy row is searched
    # per slot, ban_stride entries apart: its end-of-generation tokens, then its stop
    # token ids (bias -inf); all n_bans of them are banned until it has sampled
    # ban_until (min_tokens) tokens, the first n_bans_always (ignore_eos) ever after
    cdef int ban_stride
    cdef llama_logit_bias * bans
    cdef int * n_bans
    cdef int * n_bans_always
    cdef int * ban_until
    cdef int * sampled_n                # per slot: tokens sampled since configure

    cdef int setup(self, const llama_vocab * vocab, int n_slots, int n_threads) except -1
    cdef void release(self) noexcept
    cdef void reset(self, int slot) noexcept nogil
    cdef void sample_rows(self, int n, const float ** row_logits, const int32_t * seq,
                          const int8_t * want, const int32_t * next_tok, int k,
                          int32_t * out_ids, float * out_lp, int32_t * out_top,
                          float * out_top_lp, int * bad_row) noexcept nogil
    cdef void _sample_rows_from(self, int i, int n, const float ** row_logits,
                                const int32_t * seq, const int8_t * want,
                                const int32_t * next_tok, int k, int32_t * out_ids,
                                float * out_lp, int32_t * out_top, float * out_top_lp,
                                int tid) noexcept nogil
    cdef void _sample_row(self, int row, const float * logits, int slot, int8_t want,
                          int next_token, int k, int32_t * out_ids, float * out_lp,
                          int32_t * out_top, float * out_top_lp, int tid) noexcept nogil
    cdef int _n_banned(self, int slot) noexcept nogil
    cdef void _fill(self, int slot, const float * logits,
                    llama_token_data * candidates) noexcept nogil
    cdef int _sample_chain(self, int slot, const float * logits, int tid) noexcept nogil
    cdef int _pick(self, int slot, const float * logits, llama_token_data * candidates,
                   llama_sampler * grammar) noexcept nogil
