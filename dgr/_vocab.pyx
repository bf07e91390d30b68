# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A model's vocabulary and metadata: tokenize, detokenize, token pieces, the
chat template, GGUF metadata, the word forms the values draft source reads
(dgr/_drafts.pyx). These only read the model, so the node calls
them beside the batch loop (as llama-server's HTTP threads do beside its
decode loop); `tokenize` runs without the GIL, on any thread. The engine
(dgr._engine.Engine) is a Vocabulary that also owns a context; it sets the
fields and frees the model, after tokenize calls in flight have left."""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, uint8_t
from libc.stdlib cimport free, malloc

from dgr._codes cimport TWIN_TOKENS, WORD_OTHER, WORD_PART, WORD_SPACE, WORD_SPACED
from dgr._llama cimport *

from dgr.errors import DecodeError

cnp.import_array()


cdef class Vocabulary:
    """The vocabulary side of an engine (see the module doc)."""

    cdef void check_open(self) except *:
        if self.model == NULL:
            raise DecodeError("engine is closed")

    def _desc(self):
        cdef char buf[256]
        n = llama_model_desc(self.model, buf, sizeof(buf))
        return buf[:max(0, min(n, 255))].decode("utf-8", "replace")

    def meta(self, str key):
        """A GGUF metadata value as a string, or None when the key is absent."""
        cdef bytes bkey = key.encode()
        cdef int n = llama_model_meta_val_str(self.model, bkey, NULL, 0)
        if n < 0:
            return None
        cdef bytes buf = bytes(n + 1)
        llama_model_meta_val_str(self.model, bkey, buf, n + 1)
        return buf[:n].decode("utf-8", "replace")

    @property
    def n_vocab(self):
        return self.vocab_size

    def special_text(self):
        """{"bos_token": ..., "eos_token": ...}: the texts a Jinja chat template
        knows them by ("" where the vocabulary has none)."""
        self.check_open()
        out = {}
        for name, token in (("bos_token", llama_vocab_bos(self.vocab)),
                            ("eos_token", llama_vocab_eos(self.vocab))):
            out[name] = (self.token_to_piece(token, special=True).decode("utf-8", "replace")
                         if 0 <= token < self.vocab_size else "")
        return out

    def chat_template(self):
        """The model's chat template from its GGUF metadata, or None."""
        self.check_open()
        cdef const char * tmpl = llama_model_chat_template(self.model, NULL)
        return None if tmpl == NULL else tmpl.decode("utf-8", "replace")

    def apply_chat_template(self, messages, template=None, bint add_assistant=True):
        """Render [{"role": ..., "content": ...}, ...] with a chat template.

        `template` is a template string or a llama.cpp built-in name ("gemma",
        "chatml", ...); None means the model's own. llama.cpp recognizes the
        family of a template string; an unknown one raises ValueError."""
        self.check_open()
        tmpl = template if template is not None else self.chat_template()
        if tmpl is None:
            raise ValueError("the model has no chat template")
        cdef bytes btmpl = tmpl.encode()
        encoded = [(str(m["role"]).encode(), str(m["content"]).encode()) for m in messages]
        cdef int n_msg = len(encoded)
        cdef llama_chat_message * chat = <llama_chat_message *> malloc(max(1, n_msg) * sizeof(llama_chat_message))
        cdef int cap = 256 + 2 * sum(len(r) + len(c) for r, c in encoded)
        cdef int n
        cdef bytes out
        try:
            for i, (role, content) in enumerate(encoded):
                chat[i].role = role
                chat[i].content = content
            while True:
                out = bytes(cap)
                n = llama_chat_apply_template(btmpl, chat, n_msg, add_assistant, out, cap)
                if n < 0:
                    raise ValueError("llama.cpp does not support this model's chat template")
                if n <= cap:
                    return out[:n].decode("utf-8", "replace")
                cap = n
        finally:
            free(chat)

    # ---------------------------------------------------------------- text

    def tokenize(self, text, bint add_special=True, bint parse_special=False):
        """Token ids of `text` (str or UTF-8 bytes) as an int32 array. The GIL is
        released while llama.cpp tokenizes (a long text takes a while), so a
        caller on a worker thread does not stall the others."""
        cdef bytes data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        cdef const char * chars = data
        cdef int length = len(data)
        cdef int cap = length + 8
        cdef cnp.ndarray[int32_t, ndim=1] out = np.empty(cap, dtype=np.int32)
        cdef llama_token * ids = <llama_token *> out.data
        cdef int n
        self.tokenizing += 1  # counted before the open check: close cannot free in between
        try:
            self.check_open()
            with nogil:
                n = llama_tokenize(self.vocab, chars, length, ids, cap, add_special, parse_special)
            if n < 0:
                if n == -2147483648:
                    raise ValueError("text too long to tokenize")
                cap = -n
                out = np.empty(cap, dtype=np.int32)
                ids = <llama_token *> out.data
                with nogil:
                    n = llama_tokenize(self.vocab, chars, length, ids, cap, add_special,
                                       parse_special)
        finally:
            self.tokenizing -= 1
        return out[:n].copy()

    def token_to_piece(self, int token, bint special=False):
        """The bytes of one token (possibly part of a UTF-8 character)."""
        self.check_open()
        if token < 0 or token >= self.vocab_size:
            raise ValueError(f"token id {token} out of vocabulary (n_vocab={self.vocab_size})")
        cdef char buf[128]
        cdef int n = llama_token_to_piece(self.vocab, token, buf, sizeof(buf), 0, special)
        cdef bytes big
        if n >= 0:
            return buf[:n]
        big = bytes(-n)
        n = llama_token_to_piece(self.vocab, token, big, -n, 0, special)
        return big[:n]

    def word_forms(self):
        """The vocabulary's word forms, for the values draft source (dgr/_drafts.pyx):
        per token its WordKind (dgr._codes), and its twin row (TWIN_TOKENS), -1 until
        learn_words learns it. The same arrays on every call; learn_words fills the
        twins in place. One pass over the vocabulary's pieces, on the first call."""
        self.check_open()
        if self.word_kinds is not None:
            return self.word_kinds, self.word_twins
        cdef cnp.ndarray[uint8_t, ndim=1] kinds = np.zeros(self.vocab_size, dtype=np.uint8)
        cdef char piece[64]
        cdef int t, n, i, first
        cdef unsigned char c
        for t in range(self.vocab_size):
            n = llama_token_to_piece(self.vocab, t, piece, sizeof(piece), 0, False)
            if n <= 0:
                continue
            first = 1 if piece[0] == b' ' else 0
            if first == n:
                kinds[t] = WORD_SPACE if n == 1 else WORD_OTHER
                continue
            for i in range(first, n):
                c = <unsigned char> piece[i]
                if not (c >= 0x80 or b'0' <= c <= b'9' or b'a' <= c <= b'z' or b'A' <= c <= b'Z'):
                    break
            else:
                kinds[t] = WORD_SPACED if first else WORD_PART
        self.word_kinds = kinds
        self.word_twins = np.full((self.vocab_size, 1 + TWIN_TOKENS), -1, dtype=np.int32)
        return self.word_kinds, self.word_twins

    def learn_words(self, tokens):
        """Learn the twins of `tokens`' WORD_SPACED tokens not learnt yet: the tokens
        of its text without the space (a tokenize call each). The drafts
        read the twins beside it, each row only once whole (dgr/_drafts.pyx)."""
        if self.word_kinds is None:
            return
        self.check_open()
        cdef const uint8_t[::1] kinds = self.word_kinds
        cdef int32_t[:, ::1] twins = self.word_twins
        cdef char piece[64]
        cdef llama_token ids[TWIN_TOKENS]
        cdef int i, t, n, m
        for t in tokens:
            if not 0 <= t < self.vocab_size or kinds[t] != WORD_SPACED or twins[t, 0] != -1:
                continue
            n = llama_token_to_piece(self.vocab, t, piece, sizeof(piece), 0, False)
            m = 0
            if n > 1:
                m = llama_tokenize(self.vocab, piece + 1, n - 1, ids, TWIN_TOKENS, False, False)
            if m < 1 or ids[0] == t:
                m = 0
            for i in range(m):
                twins[t, 1 + i] = ids[i]
            twins[t, 0] = m

    def detokenize(self, tokens, bint remove_special=True, bint unparse_special=False):
        """Text of a whole token sequence."""
        self.check_open()
        cdef cnp.ndarray[int32_t, ndim=1] ids = np.ascontiguousarray(tokens, dtype=np.int32)
        if ids.shape[0] and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token id out of vocabulary (n_vocab={self.vocab_size})")
        cdef int cap = 16 * ids.shape[0] + 16
        cdef bytes out = bytes(cap)
        cdef int n = llama_detokenize(self.vocab, <llama_token *> ids.data, ids.shape[0], out, cap,
                                      remove_special, unparse_special)
        if n < 0:
            cap = -n
            out = bytes(cap)
            n = llama_detokenize(self.vocab, <llama_token *> ids.data, ids.shape[0], out, cap,
                                 remove_special, unparse_special)
        return out[:n].decode("utf-8", "replace")
