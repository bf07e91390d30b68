# The engine (dgr/_engine.pyx): one llama.cpp model and context, its batch, its
# KV operations and its sampling (its vocabulary side: dgr._vocab.Vocabulary).
# The batch loop (dgr/_batch.pyx) reaches the engine only through the cdef
# methods declared here.

from libc.stdint cimport int8_t, int32_t, uint8_t

from dgr._llama cimport llama_batch, llama_context, llama_memory_t, rpc_connected_fn
from dgr._pthread cimport pthread_mutex_t
from dgr._sampling cimport Sampling
from dgr._vocab cimport Vocabulary


cdef class Engine(Vocabulary):
    cdef llama_context * ctx
    # held around llama_decode and by whatever changes the model meanwhile (loading or
    # freeing a LoRa adapter, dgr._adapters): llama.cpp reads the model's adapters when
    # it sizes a graph
    cdef pthread_mutex_t model_lock
    cdef llama_memory_t mem
    cdef llama_batch batch
    cdef readonly Sampling sampling
    cdef const float ** row_logits  # per batch row: its logits, resolved before sampling
    cdef int abort_flag
    cdef int n_slots
    cdef int batch_capacity
    cdef readonly long long steps_done    # run_call calls made
    # RPC workers holding layers: their endpoints (C strings into rpc_names) and
    # patch 0005's check, asked after every llama_decode
    cdef int n_rpc
    cdef const char ** rpc_endpoints
    cdef list rpc_names
    cdef rpc_connected_fn rpc_connected
    cdef long long fault_step
    cdef int fault_code
    cdef int fault_slot
    cdef readonly dict info
    cdef readonly str model_path

    cdef void _free(self) noexcept
    # one llama_decode and the sampling of its output rows
    cdef int run_call(self, int n, const int32_t * tok, const int32_t * pos, const int32_t * seq,
                      const int8_t * want, const int32_t * next_tok, int k,
                      int32_t * out_ids, float * out_lp,
                      int32_t * out_top, float * out_top_lp, int * bad_row,
                      double * times) noexcept nogil
    cdef void _resolve_logits(self, int n, const int8_t * want) noexcept nogil
    cdef bint _worker_lost(self, bint synchronize) noexcept nogil
    # KV operations on one slot's sequence
    cdef bint kv_keep(self, int slot, int keep) noexcept nogil
    cdef void kv_copy(self, int src, int dst, int n) noexcept nogil
    cdef bint kv_holds(self, int slot, int n) noexcept nogil
    cdef int kv_pos_max(self, int slot) noexcept nogil
    cdef int kv_cells(self) noexcept nogil
    cdef void end_slot(self, int slot, int keep) noexcept nogil
    # a slot's KV state as bytes (dgr.kv_tier), out of and into its sequence
    cdef size_t kv_state_size(self, int slot) noexcept nogil
    cdef size_t kv_save(self, int slot, uint8_t * dst, size_t size) noexcept nogil
    cdef bint kv_restore(self, int slot, const uint8_t * src, size_t size) noexcept nogil
