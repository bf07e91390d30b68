# Every number the node and the batch loop agree on, defined once: Cython cimports
# them from here, Python imports them from dgr._codes (cpdef enums are both).

# Why a slot ended (dgr.sequence.FinishReason maps each to OpenAI's finish_reason).
cpdef enum FinishCode:
    FINISH_NONE = 0
    FINISH_STOP = 1            # an end-of-generation token, a stop token id or a stop string
    FINISH_LENGTH = 2          # max_tokens
    FINISH_CANCELLED = 3       # the caller left, or the node shut down
    FINISH_ERROR = 4           # a llama_decode call failed (the event's code says how)
    FINISH_PARKED = 5          # the node took the slot back: the session resumes on another
                               # (its sampler state held, dgr._sampling.Sampling.park)

# What a batch loop event reports (dgr.events decodes each into a record).
cpdef enum EventKind:
    EV_DECODE = 1              # a slot had a decode row in the step
    EV_PREFILL = 2             # a slot prefilled prompt positions [start, end)
    EV_TOKEN = 3               # a slot sampled a token (with log-probabilities when asked)
    EV_FINISH = 4              # a slot ended; its KV is free but for the positions it keeps
    EV_FAILURE = 5             # a llama_decode call of the step failed
    EV_STEP = 6                # the step ended, with its figures
    EV_SCORE = 7               # a prompt token's log-probability (prompt_logprobs sessions)

# Where a session's draft tokens came from (speculative decoding, dgr/_drafts.pyx).
cpdef enum DraftSource:
    DRAFT_NONE = 0
    DRAFT_CONTEXT = 1          # the session's own prompt and generated tokens
    DRAFT_NODE = 2             # recent sessions' outputs (the node's NgramStore)
    DRAFT_STRUCTURE = 3        # the session's own words around its values (structure_draft)
    DRAFT_VALUES = 4           # the prompt's next values in the session's own words around
                               # its values (values_draft)

cdef enum:
    DRAFT_SOURCES_END = DRAFT_VALUES + 1       # past the last DraftSource: records' size

# What a token's text is, as the values draft source reads it (dgr/_drafts.pyx;
# Vocabulary.word_forms). Letters: ASCII letters and digits, and any byte of a
# multi-byte UTF-8 character.
cpdef enum WordKind:
    WORD_OTHER = 0             # punctuation, whitespace runs, anything else
    WORD_SPACED = 1            # one space, then letters (" Ana")
    WORD_PART = 2              # letters only ("Ana", "ku", "3")
    WORD_SPACE = 3             # one space alone (as before a number: " ", "3", "1")

cdef enum:
    # Vocabulary.word_forms' twins: per token a row of 1 + TWIN_TOKENS: how many tokens
    # its text without the leading space is (-1 not yet learnt, 0 none or too many),
    # then those tokens
    TWIN_TOKENS = 3

# Whether a session's decode rows carry drafts (SamplingParams.speculation).
cpdef enum Speculation:
    SPECULATE_OFF = 0
    SPECULATE_AUTO = 1         # where the step-time model says they pay (dgr/_speculation.pyx)
    SPECULATE_ALWAYS = 2       # whenever a source has a draft, within the step's bounds

# Failure codes of a call beside llama_decode's own (1, 2, -1, below -1): each
# means one thing.
cpdef enum:
    DECODE_ABORTED = 2         # llama_decode's own: its abort callback stopped the call
    ENGINE_FAULT = -1000       # the engine raised during a step (an injected fault)
    WORKER_LOST = -1001        # an RPC worker holding layers was lost (closed, reset, timed out)
    NO_LOGITS = -1002          # llama.cpp gave no logits for an output row
    STATE_ROLLBACK_FAILED = -1003  # llama.cpp could not drop a session's rejected drafts
                                   # (its recurrent state rolls back no further)
    KV_MOVE_FAILED = -1004     # no KV cell in position order for a session, and llama.cpp
                               # could not move it to cells that have one

# Per-row flags of a step: whether a row is sampled, and whether its
# log-probabilities are reported.
cpdef enum:
    WANT_SAMPLE = 1
    WANT_LOGPROBS = 2
    WANT_SCORE = 4             # report the log-probability of the given next token, sample none
    WANT_CHAIN = 8             # the next row is a draft of this row's token: sample it only if
                               # this row's token is that draft (speculative decoding)

# Limits.
cpdef enum:
    MAX_LOGPROBS = 20          # top log-probabilities per token (OpenAI's limit)
    MAX_STOP_IDS = 64          # stop token ids per session
    MAX_RUNNING = 256          # sequences per llama.cpp context (LLAMA_MAX_SEQ): one per session
    SCORE_CHUNK = 16           # prompt rows per chunk of a session scoring its prompt (each an
                               # output row: at most one such chunk per step bounds the logits)
    MIN_PIECE = 16             # prompt rows the oldest prefilling session gets at least per step
    MAX_DRAFT = 48             # draft tokens a session may verify in one step
    MAX_STEP_DRAFTS = 48       # draft rows in one step (output rows beyond one per slot)
    MAX_ADAPTERS = 64          # LoRa adapters loaded on one node at once (dgr._adapters)
    ROW_EXACT = 64             # steps of up to this many output rows are timed by their count
    ROW_GROUPS = 68            # groups of a step's output rows whose times the node keeps
                               # (dgr.step_time.RowTimes): 1, 2, ..., 64, then 65-127,
                               # 128-255, 256-511, the last the rest

# Engine.inject_fault's code for "raise after llama_decode ran" (a test hook).
cpdef enum:
    FAULT_RAISE = 1000
