# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Per-slot sampling: each sequence slot's llama.cpp sampler chain, its grammar,
its banned tokens (ignore_eos, min_tokens, stop token ids), greedy rows as an
argmax in C, and log-probabilities from the raw logits.

A row's token depends only on its own logits and its slot's state, so the rows
of one step are sampled side by side on llama.cpp's OpenMP threads (which spin
idle between two llama_decode calls) with the same result as one by one. A
decode row's drafts (WANT_CHAIN rows, speculative decoding) are sampled after
it, in order, on the same thread, each only while the row before sampled the
draft it was fed: the slot's chain then sees, accepts and draws for exactly
the tokens it would decoding one a step.
"""

import hashlib

from libc.math cimport expf, logf, INFINITY
from libc.stdint cimport uint32_t
from libc.stdlib cimport calloc, free, malloc
from cython.parallel cimport prange, threadid

from dgr._codes cimport MAX_STOP_IDS, WANT_CHAIN, WANT_LOGPROBS, WANT_SCORE
from dgr._llama cimport *

from dgr.spec import SamplingParams

cdef extern from "dgr_argmax.h" nogil:
    int dgr_argmax(const float * x, int n)

# What a grammar session does when the grammar rejects its chain's free pick
# (see Sampling._sample_chain), per slot:
cdef enum Repick:
    REPICK_MASKED = 0  # the grammar constrains the whole vocabulary, the chain picks again
    REPICK_BEST = 1    # greedy: the best of the BEST_CANDIDATES highest logits it allows
    REPICK_REDRAW = 2  # sampled, untruncated: the chain draws again, up to REDRAWS times

cdef enum:
    BEST_CANDIDATES = 128
    REDRAWS = 4
    UNSAMPLED = -2     # a draft row after a rejected draft: its logits go unused


cdef class Sampling:
    """The sampling state of every slot of one context (see the module doc). Its
    C fields start NULL (Cython zeroes them) until setup."""

    def __dealloc__(self):
        self.release()

    cdef int setup(self, const llama_vocab * vocab, int n_slots, int n_threads) except -1:
        """Allocate the state of n_slots slots over `vocab` (its model must outlive
        release()), each greedy until configured."""
        self.vocab = vocab
        self.vocab_size = llama_vocab_n_tokens(vocab)
        self.n_threads = n_threads
        eog = [t for t in range(self.vocab_size) if llama_vocab_is_eog(vocab, t)]
        self.n_eog = len(eog)
        self.ban_stride = self.n_eog + MAX_STOP_IDS
        self.chains = <llama_sampler **> calloc(n_slots, sizeof(llama_sampler *))
        self.grammars = <llama_sampler **> calloc(n_slots, sizeof(llama_sampler *))
        self.greedy = <char *> calloc(n_slots, 1)
        self.repick = <char *> calloc(n_slots, 1)
        self.best = <llama_token_data *> malloc(
            <size_t> n_threads * BEST_CANDIDATES * sizeof(llama_token_data))
        self.candidates = <llama_token_data *> malloc(
            <size_t> n_threads * self.vocab_size * sizeof(llama_token_data))
        self.eog_bias = <llama_logit_bias *> malloc(max(1, self.n_eog) * sizeof(llama_logit_bias))
        self.saved = <float *> malloc(n_threads * self.ban_stride * sizeof(float))
        self.bans = <llama_logit_bias *> malloc(n_slots * self.ban_stride * sizeof(llama_logit_bias))
        self.n_bans = <int *> calloc(n_slots, sizeof(int))
        self.n_bans_always = <int *> calloc(n_slots, sizeof(int))
        self.ban_until = <int *> calloc(n_slots, sizeof(int))
        self.sampled_n = <int *> calloc(n_slots, sizeof(int))
        self.n_slots = n_slots
        if (self.chains == NULL or self.grammars == NULL or self.greedy == NULL
                or self.repick == NULL or self.best == NULL
                or self.candidates == NULL or self.eog_bias == NULL or self.saved == NULL
                or self.bans == NULL or self.n_bans == NULL or self.n_bans_always == NULL
                or self.ban_until == NULL or self.sampled_n == NULL):
            raise MemoryError()
        for i, t in enumerate(eog):
            self.eog_bias[i].token = t
            self.eog_bias[i].bias = -INFINITY
        for slot in range(n_slots):
            self.configure(slot, SamplingParams())
        return 0

    cdef void release(self) noexcept:
        """Free every sampler (before the model goes)."""
        if self.chains != NULL:
            for slot in range(self.n_slots):
                if self.chains[slot] != NULL:
                    llama_sampler_free(self.chains[slot])
        if self.grammars != NULL:
            for slot in range(self.n_slots):
                if self.grammars[slot] != NULL:
                    llama_sampler_free(self.grammars[slot])
        free(self.chains); free(self.grammars); free(self.greedy); free(self.candidates)
        free(self.repick); free(self.best)
        free(self.eog_bias); free(self.saved); free(self.bans)
        free(self.n_bans); free(self.n_bans_always); free(self.ban_until); free(self.sampled_n)
        self.chains = self.grammars = NULL
        self.greedy = self.repick = NULL
        self.candidates = self.best = NULL
        self.eog_bias = self.bans = NULL
        self.saved = NULL
        self.n_bans = self.n_bans_always = self.ban_until = self.sampled_n = NULL
        self.n_slots = 0

    @property
    def eog_tokens(self):
        """The vocabulary's end-of-generation tokens."""
        return [self.eog_bias[i].token for i in range(self.n_eog)]

    # ------------------------------------------------------------ configuring (GIL held)

    def configure(self, int slot, params not None):
        """Give `slot` a fresh sampler chain for SamplingParams `params`.

        temperature <= 0 is greedy: without logit_bias, penalties or a grammar
        an argmax in C (no chain). ignore_eos bans the end-of-generation tokens;
        min_tokens bans them and the stop token ids until the slot has sampled
        that many tokens. logit_bias adds to the logits (-100 bans); the
        penalties (llama.cpp's: repeat divides, frequency and presence subtract)
        apply to the last repeat_last_n tokens the slot generated. A grammar
        (GBNF, root rule "root") must stay satisfiable by every sampled token.
        A token id outside the vocabulary is a ValueError."""
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"sequence slot {slot} out of range 0..{self.n_slots - 1}")
        bias = params.sampler_bias()
        # the node refuses such a request first (InvalidRequest); here it guards the
        # bans and biases, which index the vocabulary
        for token in (*params.stop_token_ids, *(t for t, _ in bias)):
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"token id {token} out of vocabulary (n_vocab={self.vocab_size})")
        cdef llama_logit_bias * bans = self.bans + slot * self.ban_stride
        cdef int n = 0, e, i
        if params.ignore_eos or params.min_tokens > 0:
            for e in range(self.n_eog):
                bans[n] = self.eog_bias[e]
                n += 1
        if params.min_tokens > 0:
            for token in params.stop_token_ids:
                bans[n].token = token
                bans[n].bias = -INFINITY
                n += 1
        self.n_bans[slot] = n
        self.n_bans_always[slot] = self.n_eog if params.ignore_eos else 0
        self.ban_until[slot] = params.min_tokens
        self.sampled_n[slot] = 0
        cdef llama_sampler_chain_params sparams = llama_sampler_chain_default_params()
        sparams.no_perf = True
        cdef llama_sampler * chain = llama_sampler_chain_init(sparams)
        cdef int n_bias = len(bias)
        cdef llama_logit_bias * biases
        if n_bias:
            biases = <llama_logit_bias *> malloc(n_bias * sizeof(llama_logit_bias))
            if biases == NULL:
                llama_sampler_free(chain)
                raise MemoryError()
            for i, (token, value) in enumerate(bias):
                biases[i].token = token
                biases[i].bias = value
            llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(self.vocab_size, n_bias,
                                                                         biases))
            free(biases)  # the sampler keeps a copy
        # The grammar stays outside the chain: _sample_chain checks the chain's
        # pick against it and constrains the whole vocabulary only when it is rejected.
        cdef llama_sampler * constrained = NULL
        cdef bytes grammar_text
        if params.grammar is not None:
            grammar_text = params.grammar.encode()
            constrained = llama_sampler_init_grammar(self.vocab, grammar_text, b"root")
            if constrained == NULL:
                llama_sampler_free(chain)
                raise ValueError("invalid grammar")
        cdef bint truncated = (params.top_k > 0 or params.typical_p < 1.0
                               or params.top_p < 1.0 or params.min_p > 0.0)
        cdef bint penalized = params.repeat_last_n != 0 and (
            params.repeat_penalty != 1.0 or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0)
        if penalized:
            llama_sampler_chain_add(chain, llama_sampler_init_penalties(
                self.vocab_size, params.repeat_last_n, params.repeat_penalty,
                params.frequency_penalty, params.presence_penalty))
        if params.temperature <= 0.0:
            llama_sampler_chain_add(chain, llama_sampler_init_greedy())
        else:
            # llama.cpp's common order: top_k, typical, top_p, min_p, temperature
            if params.top_k > 0:
                llama_sampler_chain_add(chain, llama_sampler_init_top_k(params.top_k))
            if params.typical_p < 1.0:
                llama_sampler_chain_add(chain, llama_sampler_init_typical(params.typical_p, 1))
            if params.top_p < 1.0:
                llama_sampler_chain_add(chain, llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                llama_sampler_chain_add(chain, llama_sampler_init_min_p(params.min_p, 1))
            llama_sampler_chain_add(chain, llama_sampler_init_temp(params.temperature))
            llama_sampler_chain_add(chain, llama_sampler_init_dist(
                <uint32_t> seed32(params.seed or 0)))
        if self.chains[slot] != NULL:
            llama_sampler_free(self.chains[slot])
        self.chains[slot] = chain
        if self.grammars[slot] != NULL:
            llama_sampler_free(self.grammars[slot])
        self.grammars[slot] = constrained
        if params.temperature <= 0.0:
            self.repick[slot] = REPICK_BEST
        elif truncated:
            self.repick[slot] = REPICK_MASKED
        else:
            self.repick[slot] = REPICK_REDRAW
        # Greedy needs no chain: an argmax over the logits row picks the same
        # token (the first maximum) without copying the whole vocabulary.
        self.greedy[slot] = (params.temperature <= 0.0 and not n_bias and not penalized
                             and params.grammar is None)

    # ------------------------------------------------------------ sampling (nogil)

    cdef void reset(self, int slot) noexcept nogil:
        """The slot's session ended: its chain forgets what it was fed (a parked
        session's chain has left the slot: dgr._parked)."""
        if self.chains[slot] != NULL:
            llama_sampler_reset(self.chains[slot])

    cdef void sample_rows(self, int n, const float ** row_logits, const int32_t * seq,
                          const int8_t * want, const int32_t * next_tok, int k,
                          int32_t * out_ids, float * out_lp, int32_t * out_top,
                          float * out_top_lp, int * bad_row) noexcept nogil:
        """Sample every row with want != 0 from its logits (row_logits[i], NULL:
        none) with its slot's (seq[i]) state: out_ids[i] (-1 without logits; the
        first such row in bad_row), and with WANT_LOGPROBS the top k
        log-probabilities (k apart in out_top*) and the token's own (out_lp). A
        WANT_SCORE row samples nothing and changes no state: its token is
        next_tok[i], given, and its log-probabilities are reported. A WANT_CHAIN row's
        next row is a draft of its token (next_tok[i]), sampled only if this row
        sampled that token (else its out_ids is UNSAMPLED)."""
        cdef int i, wanted = 0
        for i in range(n):
            if want[i] != 0 and (i == 0 or not want[i - 1] & WANT_CHAIN):
                wanted += 1
        cdef int threads = min(self.n_threads, wanted)
        if threads > 1:
            for i in prange(n, num_threads=threads, schedule="dynamic"):
                if i == 0 or not want[i - 1] & WANT_CHAIN:
                    self._sample_rows_from(i, n, row_logits, seq, want, next_tok, k, out_ids,
                                           out_lp, out_top, out_top_lp, threadid())
        else:
            for i in range(n):
                if i == 0 or not want[i - 1] & WANT_CHAIN:
                    self._sample_rows_from(i, n, row_logits, seq, want, next_tok, k, out_ids,
                                           out_lp, out_top, out_top_lp, 0)
        for i in range(n):
            if want[i] != 0 and out_ids[i] == -1:
                bad_row[0] = i
                break

    cdef void _sample_rows_from(self, int i, int n, const float ** row_logits,
                                const int32_t * seq, const int8_t * want,
                                const int32_t * next_tok, int k, int32_t * out_ids,
                                float * out_lp, int32_t * out_top, float * out_top_lp,
                                int tid) noexcept nogil:
        """Row i, and the rows chained after it while each row sampled the draft
        the next was fed; the rest of the chain UNSAMPLED."""
        cdef bint go_on = True
        while True:
            if go_on:
                self._sample_row(i, row_logits[i], seq[i], want[i],
                                 next_tok[i] if next_tok != NULL else -1, k, out_ids, out_lp,
                                 out_top, out_top_lp, tid)
                go_on = (want[i] & WANT_CHAIN) != 0 and out_ids[i] >= 0 \
                    and out_ids[i] == next_tok[i]
            else:
                out_ids[i] = UNSAMPLED
            if not want[i] & WANT_CHAIN or i + 1 >= n:
                return
            i += 1

    cdef void _sample_row(self, int row, const float * logits, int slot, int8_t want,
                          int next_token, int k, int32_t * out_ids, float * out_lp,
                          int32_t * out_top, float * out_top_lp, int tid) noexcept nogil:
        """One row's token and, if asked, its log-probabilities, with thread tid's scratch."""
        if want == 0:
            return
        cdef int token
        if logits == NULL:
            out_ids[row] = -1
            return
        if want & WANT_SCORE:  # raw log-probabilities, as for sampled rows
            _logprobs(logits, self.vocab_size, k, next_token, out_top + row * k,
                      out_top_lp + row * k, out_lp + row)
            out_ids[row] = next_token
            return
        if self.greedy[slot]:
            token = _argmax(<float *> logits, self.vocab_size, self.bans + slot * self.ban_stride,
                            self._n_banned(slot), self.saved + tid * self.ban_stride)
        else:
            token = self._sample_chain(slot, logits, tid)
        if token >= 0:
            self.sampled_n[slot] += 1
        if token >= 0 and k > 0 and (want & WANT_LOGPROBS):
            _logprobs(logits, self.vocab_size, k, token, out_top + row * k, out_top_lp + row * k,
                      out_lp + row)
        out_ids[row] = token

    cdef inline int _n_banned(self, int slot) noexcept nogil:
        """How many of the slot's bans hold for its next token."""
        if self.sampled_n[slot] < self.ban_until[slot]:
            return self.n_bans[slot]
        return self.n_bans_always[slot]

    cdef void _fill(self, int slot, const float * logits,
                    llama_token_data * candidates) noexcept nogil:
        """The whole vocabulary as the chain's candidates, the slot's bans applied."""
        cdef int j
        cdef llama_logit_bias * bans = self.bans + slot * self.ban_stride
        for j in range(self.vocab_size):
            candidates[j].id = j
            candidates[j].logit = logits[j]
            candidates[j].p = 0.0
        for j in range(self._n_banned(slot)):
            candidates[bans[j].token].logit = -INFINITY

    cdef int _sample_chain(self, int slot, const float * logits, int tid) noexcept nogil:
        """A token from the slot's sampler chain over the whole vocabulary with
        thread tid's scratch, as llama_sampler_sample does (which cannot run on two
        threads at once: it looks the logits up itself).

        With a grammar, as llama.cpp's common sampler does, the chain picks freely
        and the grammar checks only that pick: a grammar's check of the whole
        vocabulary costs many times a step's sampling on a large vocabulary, a
        stall of every other row of the step. A rejected pick is picked again with
        the same result as constraining the whole vocabulary first, at that cost
        only where nothing cheaper gives it (the slot's repick):
        - greedy: the constrained argmax is the first token, by logit and then by
          id, that the grammar allows; the grammar checks the BEST_CANDIDATES
          highest logits of the chain's row (bans, biases and penalties applied);
        - sampled without top_k, top_p or min_p: a draw redrawn while rejected is
          a draw from the constrained distribution (rejection sampling); after
          REDRAWS rejections the grammar constrains the whole vocabulary;
        - otherwise (a truncation depends on which tokens the grammar allows)
          the grammar constrains the whole vocabulary."""
        cdef llama_sampler * grammar = self.grammars[slot]
        cdef llama_token_data * candidates = self.candidates + <size_t> tid * self.vocab_size
        cdef int token = self._pick(slot, logits, candidates, NULL)
        cdef int attempt
        if grammar != NULL and token >= 0 and not _grammar_allows(grammar, token):
            token = -1
            if self.repick[slot] == REPICK_BEST:
                token = _best_allowed(grammar, candidates, self.vocab_size,
                                      self.best + tid * BEST_CANDIDATES)
            elif self.repick[slot] == REPICK_REDRAW:
                for attempt in range(REDRAWS):
                    token = self._pick(slot, logits, candidates, NULL)
                    if token < 0 or _grammar_allows(grammar, token):
                        break
                    token = -1
            if token < 0:
                token = self._pick(slot, logits, candidates, grammar)
        if token < 0:
            return -1
        if grammar != NULL:
            llama_sampler_accept(grammar, token)
        llama_sampler_accept(self.chains[slot], token)
        return token

    cdef int _pick(self, int slot, const float * logits, llama_token_data * candidates,
                   llama_sampler * grammar) noexcept nogil:
        """The chain's pick (-1: none) over the whole vocabulary with the slot's bans,
        constrained first by `grammar` when given; accepts nothing."""
        cdef llama_token_data_array cur
        self._fill(slot, logits, candidates)
        cur.data = candidates
        cur.size = self.vocab_size
        cur.selected = -1
        cur.sorted = False
        if grammar != NULL:
            llama_sampler_apply(grammar, &cur)
        llama_sampler_apply(self.chains[slot], &cur)
        if cur.selected < 0 or cur.selected >= <int> cur.size:
            return -1
        return cur.data[cur.selected].id


cdef int _argmax(float * logits, int n_vocab, const llama_logit_bias * banned, int n_banned,
                 float * saved) noexcept nogil:
    """Index of the first largest logit, skipping the n_banned tokens of `banned`
    (their logits are set aside in `saved` for the search and put back)."""
    cdef int j
    for j in range(n_banned):
        saved[j] = logits[banned[j].token]
        logits[banned[j].token] = -INFINITY
    cdef int best = dgr_argmax(logits, n_vocab)
    for j in range(n_banned):
        logits[banned[j].token] = saved[j]
    return best if best >= 0 else 0


cdef bint _grammar_allows(llama_sampler * grammar, int token) noexcept nogil:
    """Whether the grammar, in its current state, accepts `token` next."""
    cdef llama_token_data one
    cdef llama_token_data_array single
    one.id = token
    one.logit = 1.0
    one.p = 0.0
    single.data = &one
    single.size = 1
    single.selected = -1
    single.sorted = False
    llama_sampler_apply(grammar, &single)
    return single.data[0].logit != -INFINITY


cdef int _best_allowed(llama_sampler * grammar, const llama_token_data * row, int n,
                       llama_token_data * best) noexcept nogil:
    """The first token of `row` (n candidates in id order), by logit and then by id,
    that the grammar allows, looked for among the BEST_CANDIDATES first in that
    order (gathered into `best`); -1 where none of those is allowed with a finite
    logit, and the whole row must be constrained to know."""
    cdef int i, j, filled = 0
    cdef float v
    for i in range(n):
        v = row[i].logit
        if filled == BEST_CANDIDATES and v <= best[BEST_CANDIDATES - 1].logit:
            continue
        j = filled if filled < BEST_CANDIDATES else BEST_CANDIDATES - 1
        while j > 0 and best[j - 1].logit < v:
            best[j] = best[j - 1]
            j -= 1
        best[j] = row[i]
        if filled < BEST_CANDIDATES:
            filled += 1
    cdef llama_token_data_array cur
    cur.data = best
    cur.size = filled
    cur.selected = -1
    cur.sorted = False
    llama_sampler_apply(grammar, &cur)  # a rejected candidate's logit becomes -inf
    for j in range(filled):
        if best[j].logit != -INFINITY:
            return best[j].id
    return -1


cdef void _logprobs(const float * logits, int n_vocab, int k, int chosen,
                    int32_t * top_ids, float * top_lp, float * chosen_lp) noexcept nogil:
    """Top-k log-softmax of one logits row, best first, and the chosen token's."""
    cdef int i, j
    cdef float mx = -INFINITY
    for i in range(n_vocab):
        if logits[i] > mx:
            mx = logits[i]
    cdef double total = 0.0
    for i in range(n_vocab):
        total += expf(logits[i] - mx)
    cdef float log_z = mx + logf(<float> total)
    cdef int filled = 0
    cdef float v
    for i in range(n_vocab):
        v = logits[i]
        if filled == k and v <= top_lp[k - 1]:
            continue
        j = filled if filled < k else k - 1
        while j > 0 and top_lp[j - 1] < v:
            top_lp[j] = top_lp[j - 1]
            top_ids[j] = top_ids[j - 1]
            j -= 1
        top_lp[j] = v
        top_ids[j] = i
        if filled < k:
            filled += 1
    for j in range(filled):
        top_lp[j] -= log_z
    chosen_lp[0] = logits[chosen] - log_z if 0 <= chosen < n_vocab else -INFINITY


def seed32(seed: int) -> int:
    """A session seed (any integer) as llama.cpp's 32-bit sampler seed: hashed, so
    seeds that differ by 2**32 (or in sign) do not collide, and never 0xFFFFFFFF,
    which llama.cpp reads as "pick a random seed"."""
    digest = hashlib.blake2b(str(int(seed)).encode(), digest_size=4).digest()
    value = int.from_bytes(digest, "little")
    return value if value != 0xFFFFFFFF else 0xFFFFFFFE
