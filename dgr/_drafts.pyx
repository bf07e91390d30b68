# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Draft tokens for exact speculative decoding, without a second model.

A decoding session's next tokens are guessed from text it or others wrote
before; the batch loop verifies the guesses as extra rows of the session in
the step's llama_decode and keeps what its own sampler would have picked
(dgr/_scheduler.pyx), so a draft only changes how many tokens a step yields,
never which.

- `context_draft` (prompt lookup, as llama.cpp's ngram-simple): the most
  recent earlier place where the session's last tokens occurred in its own
  prompt and output, the longest match of CONTEXT_MATCH_MIN..MATCH_MAX
  tokens, and what followed there, as far as an older place matching as long
  agrees with it. Work that quotes its input (an edited file, a summary that
  cites, JSON extracted from a table) drafts here.
- `NgramStore` (dgr/_ngram_store.pyx): the node's recent sessions' outputs, so
  sessions that write the same structure draft from each other, by the same rule.
- `structure_draft`: where neither has a match, the session's own context
  again, matched around a value: its last tokens follow a value of its own
  (a name, a number) that no earlier place has, after words an earlier place
  has around another value (`{"name": "` Ana `", "city": "` and `{"name": "`
  Ben `", `: JSON objects of a list, a table's rows, a form's fields). What
  followed the earlier value, by the same rule (the best matched, the most
  recent among equals, as far as the next as well matched agrees), is the
  draft: the words that close this value and open the next. Where the
  session's own last tokens are the value, the matches above find nothing
  until three tokens past it.
- `values_draft`: where the session writes its prompt's values in words of its
  own (a table's cells as a JSON list, a form's fields in a letter). The
  prompt's values are its words, each a space and letters (` Ana`; ` Tur`
  `ku`) or the letters after a lone space (` ` `31`), which the session writes
  without the space (`Ana`, `Tur` `ku`, `31`: a word's twin, learnt from the
  vocabulary, Vocabulary.learn_words). Each value the session wrote, the
  prompt's first after the one it wrote before, is read as "a value"; the
  session's last tokens so read are matched in its earlier ones so read, by
  the context's rule, and what followed is the draft, each value in it the
  prompt's next one: `Ana` `Lisbon` `31` written, `Ben` next, `", "city": "`
  `Leeds` `", "age": ` `45` `},` follow. Asked beside the context, its draft
  goes first where it holds a value and its match is at least as long as the
  context's (a quote of the prompt itself is the context's).
"""

from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from dgr._codes cimport TWIN_TOKENS, WORD_PART, WORD_SPACE, WORD_SPACED

cdef enum:
    CONTEXT_MATCH_MIN = 3
    # structure_draft: the words around a value that a match spans, and a value's most
    # tokens (a name, a number, a short phrase)
    STRUCTURE_MIN = 4
    VALUE_MAX = 4
    # ... and how far back it looks: a structure repeats close by (a list's objects),
    # and the search (a few comparisons a token back) stays a small part of a row
    STRUCTURE_REACH = 4096


cdef void _find(const int32_t * tokens, int n, int least, Places * places) noexcept nogil:
    """The earlier places of tokens[n - L:n], L up to MATCH_MAX, ending at index
    least - 1 or later."""
    cdef int j, length
    cdef int32_t last = tokens[n - 1]
    _no_places(places)
    j = n - 2
    while j >= least - 1:
        if tokens[j] == last:
            length = 1
            while (length < MATCH_MAX and length <= j
                   and tokens[j - length] == tokens[n - 1 - length]):
                length += 1
            if _meet(places, length, j):
                break
        j -= 1


cdef int context_draft(const int32_t * tokens, int n, int max_draft, int32_t * out,
                       int * matched) noexcept nogil:
    """The tokens that followed the longest (then most recent) earlier occurrence of
    tokens[n - L:n], CONTEXT_MATCH_MIN <= L <= MATCH_MAX, up to max_draft of
    them, into out; returns how many (0: no such occurrence), L in `matched`.
    Where an earlier occurrence of that length was followed otherwise, only as
    many as the two agree on: past that point the context does not tell which
    one the session follows (rows of a table, items of a list: the same words,
    then each its own)."""
    cdef Places places
    matched[0] = 0
    if n <= CONTEXT_MATCH_MIN or max_draft <= 0:
        return 0
    _find(tokens, n, CONTEXT_MATCH_MIN, &places)
    if places.length < CONTEXT_MATCH_MIN:
        return 0
    return _follow(tokens, n, &places, max_draft, out, matched)


cdef int _follow(const int32_t * tokens, int n, Places * places, int max_draft,
                 int32_t * out, int * matched) noexcept nogil:
    """Up to max_draft of the context's tokens after its place places.best into out,
    as far as those after places.other (where there is one) agree; returns how
    many, the match's length in `matched`. Where they reach the context's end, the
    draft itself (a repeating run drafts its next period)."""
    cdef int i, p
    cdef int32_t other
    matched[0] = places.length
    for i in range(max_draft):
        p = <int> places.best + 1 + i
        out[i] = tokens[p] if p < n else out[p - n]
        if places.other >= 0:
            p = <int> places.other + 1 + i
            other = tokens[p] if p < n else out[p - n]
            if other != out[i]:
                return i
    return max_draft


cdef inline int _agree_before(const int32_t * tokens, int a, int b, int most) noexcept nogil:
    """How many tokens up to and including tokens[a] and tokens[b], going back, are
    equal (at most `most`)."""
    cdef int length = 0
    while length < most and a - length >= 0 and tokens[a - length] == tokens[b - length]:
        length += 1
    return length


cdef int structure_draft(const int32_t * tokens, int n, int max_draft, int32_t * out,
                         int * matched) noexcept nogil:
    """Where the context repeats a structure around values of its own (a JSON list's
    objects, a table's rows, a form's fields): the session's last tokens are
    [words][value][m tokens], an earlier place [words][value'][the same m
    tokens], the words STRUCTURE_MIN - m or more tokens alike, the values 1 to
    VALUE_MAX tokens that differ (of equal length where m is 0: the session's
    value may have just ended). Drafts what followed the earlier place, the
    best-matched (m + the words' length), most recent among equals, as far as
    the next as well matched agrees, into out; returns how many, the match's length
    (m + the words') in `matched`. Asked where
    context_draft finds no match of its own: after a value, the words that close
    it and open the next (`", "city": "`), which the last tokens, the value
    among them, match nowhere. The session's words end before the earlier
    place begins: words matched against themselves a few tokens on would draft
    a period the text does not have. Places within STRUCTURE_REACH tokens."""
    cdef int at, m, g, g_old, here, there, length
    cdef int32_t last
    cdef Places places
    matched[0] = 0
    if n < STRUCTURE_MIN + 2 or max_draft <= 0:
        return 0
    _no_places(&places)
    last = tokens[n - 1]
    for at in range(n - 2, max(STRUCTURE_MIN, n - STRUCTURE_REACH) - 1, -1):
        # m >= 1: tokens[at - m + 1 .. at] are the session's last m; before them the
        # values, of any lengths 1..VALUE_MAX, then the words
        m = _agree_before(tokens, at, n - 1, MATCH_MAX) if tokens[at] == last else 0
        if m > 0:
            for g in range(1, VALUE_MAX + 1):
                here = n - 1 - m - g
                if here < 0:
                    break
                for g_old in range(1, VALUE_MAX + 1):
                    there = at - m - g_old
                    if there < 0:
                        break
                    length = m + _agree_before(tokens, there, here,
                                               min(MATCH_MAX - m, here - at))
                    if length > m and length >= STRUCTURE_MIN and _meet(&places, length, at):
                        return _follow(tokens, n, &places, max_draft, out, matched)
        else:
            # m = 0: the session's last g tokens a value, as long as the one ending at `at`
            for g in range(1, VALUE_MAX + 1):
                here = n - 1 - g
                there = at - g
                if there < 0:
                    break
                length = _agree_before(tokens, there, here, min(MATCH_MAX, here - at))
                if length >= STRUCTURE_MIN and _meet(&places, length, at):
                    return _follow(tokens, n, &places, max_draft, out, matched)
    if places.length < STRUCTURE_MIN:
        return 0
    return _follow(tokens, n, &places, max_draft, out, matched)


cdef inline uint32_t _cell_key(int32_t first, int32_t second) noexcept nogil:
    return ((<uint32_t> first * 2654435761U) ^ (<uint32_t> (second + 1) * 2246822519U)) >> 7


cdef inline bint _twin_learnt(const int32_t * twins, int32_t t) noexcept nogil:
    """Whether t's twin is learnt: its row's count, then as many tokens (a row that
    learn_words is writing beside this may show its count first)."""
    cdef const int32_t * twin = twins + <size_t> t * (1 + TWIN_TOKENS)
    cdef int i
    if twin[0] <= 0 or twin[0] > TWIN_TOKENS:
        return False
    for i in range(twin[0]):
        if twin[1 + i] < 0:
            return False
    return True


cdef inline int _form(const int32_t * prompt, int start, int length, const uint8_t * kinds,
                      const int32_t * twins, int32_t * form) noexcept nogil:
    """A cell as the session writes it, into form: a WORD_SPACED first token's twin,
    then the rest; returns its tokens."""
    cdef int n = 0, i
    cdef int32_t t = prompt[start]
    cdef const int32_t * twin
    if kinds[t] == WORD_SPACED:
        twin = twins + <size_t> t * (1 + TWIN_TOKENS)
        for i in range(twin[0]):
            form[n] = twin[1 + i]
            n += 1
    else:
        form[n] = t
        n += 1
    for i in range(1, length):
        form[n] = prompt[start + i]
        n += 1
    return n


cdef inline int _value_at(const int32_t * tokens, int n, int q, ValueScratch * v,
                          const uint8_t * kinds, int after) noexcept nogil:
    """The first cell after cell `after` that the session wrote at tokens[q:] whole (the
    next token, if any, not letters of the same word), or -1."""
    cdef int key, c, L, i, walked
    for key in range(2):
        if key == 0 and q + 1 >= n:
            continue
        c = v.bucket[_cell_key(tokens[q], tokens[q + 1] if key == 0 else -1) & (VALUE_BUCKETS - 1)]
        walked = 0
        while c >= 0 and walked < VALUE_CHAIN_MAX:
            L = v.form_length[c]
            if c > after and q + L <= n and (q + L == n or kinds[tokens[q + L]] != WORD_PART):
                i = 0
                while i < L and tokens[q + i] == v.forms[v.form_start[c] + i]:
                    i += 1
                if i == L:
                    return c
            c = v.chain[c]
            walked += 1
    return -1


cdef int values_draft(const int32_t * tokens, int n, int n_prompt, const uint8_t * kinds,
                      const int32_t * twins, ValueScratch * v, int max_draft, int32_t * out,
                      int * matched) noexcept nogil:
    """The prompt's next values in the words the session wrote around its earlier
    ones (the module doc), up to max_draft tokens into out; returns how many (0
    where the draft holds no value), the match's length (tokens, a value one) in
    `matched`. The prompt's cells: the words of its last VALUE_PROMPT_REACH
    tokens, each a WORD_SPACED token whose twin is learnt (Vocabulary.learn_words)
    then WORD_PART ones, or WORD_PART ones after a WORD_SPACE, at most
    VALUE_TOKENS_MAX tokens. The session's tokens read: its last VALUE_REACH."""
    cdef int i, j, L, q, c, m, cur, count, filled, p, lo, n_forms
    cdef const int32_t * prompt
    cdef Places places
    cdef int32_t t, e, e_other
    matched[0] = 0
    if max_draft <= 0 or n_prompt <= 0 or n - n_prompt < CONTEXT_MATCH_MIN:
        return 0
    # the prompt's cells in order, as the session writes them; each chained from its
    # bucket (its form's first two tokens), first cell first
    lo = max(0, n_prompt - VALUE_PROMPT_REACH)
    prompt = tokens + lo
    v.n_cells = n_forms = 0
    i = 0
    while i < n_prompt - lo:
        t = prompt[i]
        j = -1
        if kinds[t] == WORD_SPACED and _twin_learnt(twins, t):
            j = i
        elif kinds[t] == WORD_SPACE and i + 1 < n_prompt - lo and kinds[prompt[i + 1]] == WORD_PART:
            j = i + 1
        if j < 0:
            i += 1
            continue
        L = 1
        while j + L < n_prompt - lo and kinds[prompt[j + L]] == WORD_PART and L <= VALUE_TOKENS_MAX:
            L += 1
        if L <= VALUE_TOKENS_MAX:
            v.form_start[v.n_cells] = n_forms
            v.form_length[v.n_cells] = _form(prompt, j, L, kinds, twins, v.forms + n_forms)
            n_forms += v.form_length[v.n_cells]
            v.n_cells += 1
        i = j + L
    if v.n_cells == 0:
        return 0
    memset(v.bucket, 0xff, sizeof(v.bucket))
    for c in range(v.n_cells - 1, -1, -1):
        i = v.form_start[c]
        i = _cell_key(v.forms[i], v.forms[i + 1] if v.form_length[c] > 1 else -1)
        i &= VALUE_BUCKETS - 1
        v.chain[c] = v.bucket[i]
        v.bucket[i] = c
    # the session's tokens read: each value (the prompt's first cell after the last
    # value's) VALUE, the others as they are
    m = 0
    cur = -1
    q = max(n_prompt, n - VALUE_REACH)
    while q < n:
        c = _value_at(tokens, n, q, v, kinds, cur) if kinds[tokens[q]] == WORD_PART else -1
        if c >= 0:
            v.read[m] = VALUE
            cur = c
            q += v.form_length[c]
        else:
            v.read[m] = tokens[q]
            q += 1
        m += 1
    if cur < 0 or m <= CONTEXT_MATCH_MIN:
        return 0
    _find(v.read, m, CONTEXT_MATCH_MIN, &places)
    if places.length < CONTEXT_MATCH_MIN:
        return 0
    # follow the place read, each value the prompt's next cell; past the tokens read,
    # the draft read (a period drafts its next period)
    count = filled = 0
    i = 0
    while count < max_draft:
        p = <int> places.best + 1 + i
        e = v.read[p] if p < m else v.drafted[p - m]
        if places.other >= 0:
            p = <int> places.other + 1 + i
            e_other = v.read[p] if p < m else v.drafted[p - m]
            if e_other != e:
                break
        if e == VALUE:
            cur += 1
            if cur >= v.n_cells:
                break
            j = 0
            while j < v.form_length[cur] and count < max_draft:
                out[count] = v.forms[v.form_start[cur] + j]
                count += 1
                j += 1
            filled += 1
        else:
            out[count] = e
            count += 1
        v.drafted[i] = e
        i += 1
    if filled == 0:
        return 0
    matched[0] = places.length
    return count


ctypedef int (*DraftFunction)(const int32_t * tokens, int n, int max_draft,
                              int32_t * out, int * matched) noexcept nogil


cdef list _draft_for(DraftFunction draft, tokens, int max_draft):
    cdef int32_t out[MAX_DRAFT]
    cdef int32_t[:] view = _int32(tokens)
    cdef int matched
    if not len(tokens):
        return []
    cdef int n = draft(&view[0], len(tokens), min(max_draft, MAX_DRAFT), out, &matched)
    return [out[i] for i in range(n)]


def context_draft_for(tokens, int max_draft=MAX_DRAFT):
    """context_draft over a list of token ids, for tests."""
    return _draft_for(context_draft, tokens, max_draft)


def values_draft_for(tokens, int n_prompt, kinds, twins, int max_draft=MAX_DRAFT):
    """values_draft over a list of token ids (the first n_prompt the prompt), with
    word forms as Vocabulary.word_forms gives them (kinds: a byte per token; twins:
    a row of 1 + TWIN_TOKENS per token, as a flat sequence); for tests: (the
    draft, the match's length)."""
    cdef int32_t out[MAX_DRAFT]
    cdef int32_t[:] view = _int32(tokens)
    cdef uint8_t[:] kinds_view = bytearray(kinds)
    cdef int32_t[:] twins_view = _int32(twins)
    if len(twins_view) != len(kinds_view) * (1 + TWIN_TOKENS):
        raise ValueError("twins needs a row of 1 + TWIN_TOKENS per token")
    if len(tokens) and (min(tokens) < 0 or max(max(tokens), max(twins)) >= len(kinds_view)):
        raise ValueError("token ids lie in the vocabulary (one kind each)")
    cdef int matched = 0, n = 0
    cdef ValueScratch * scratch = <ValueScratch *> malloc(sizeof(ValueScratch))
    if scratch == NULL:
        raise MemoryError()
    try:
        if len(tokens):
            n = values_draft(&view[0], len(tokens), n_prompt, &kinds_view[0], &twins_view[0],
                             scratch, min(max_draft, MAX_DRAFT), out, &matched)
    finally:
        free(scratch)
    return [out[i] for i in range(n)], matched


def structure_draft_for(tokens, int max_draft=MAX_DRAFT):
    """structure_draft over a list of token ids, for tests."""
    return _draft_for(structure_draft, tokens, max_draft)


def _int32(tokens):
    import array
    return array.array("i", tokens)
