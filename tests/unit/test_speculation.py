"""Speculative decoding without a model: the draft sources (dgr._drafts) and the
scheduler's drafts, their verification and what a step with them reports."""

import pytest

from dgr import _drafts, _ngram_store, _scheduler
from dgr._codes import (MAX_DRAFT, MAX_STEP_DRAFTS, ROW_GROUPS, DraftSource,
                        WordKind)
from dgr.spec import SamplingParams
from dgr.events import Decoded, Finished, Sampled
from dgr.spec import SessionSpec

EOG = 99


def timed(points):
    """Decode steps' (rows, seconds) as the node timed them at these tests' contexts:
    a few dozen KV cells, within CONTEXT_FLOOR (512) of none."""
    return [(rows, seconds, 0.0) for rows, seconds in points]


def linear(a, b):
    """Row times of a step taking a + b rows."""
    return timed([(rows, a + b * rows) for rows in (1, 2, 4, 8, 16)])


# decode steps' seconds by output rows as a CPU's: a second row costs about a first,
# rows past it little (evidence/DGR-026/rows-cost-wide.txt)
CHEAP_ROWS = timed([(1, 0.020), (2, 0.030), (4, 0.032), (8, 0.036), (16, 0.044)])
ALWAYS, AUTO, OFF = "always", "auto", "off"  # SamplingParams.speculation


def spec(prompt, max_tokens, speculation) -> SessionSpec:
    return SessionSpec(list(prompt), SamplingParams(max_tokens=max_tokens, speculation=speculation))


def test_context_draft_continues_the_longest_latest_match():
    # "1 2 3" occurred twice; after the later one came 9 8 7, after the earlier 9 8 5:
    # the draft is what the two agree on, as the context does not tell them apart
    tokens = [1, 2, 3, 9, 8, 5, 6, 1, 2, 3, 9, 8, 7, 0, 1, 2, 3]
    assert _drafts.context_draft_for(tokens, 3) == [9, 8]
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 9, 8, 0, 1, 2, 3]
    assert _drafts.context_draft_for(tokens, 2) == []
    # rows of a table written as JSON: `}, {"city": "` before each row's own value; the
    # keys are drafted, the value is not
    key = [45, 40, 41, 42, 47]
    assert _drafts.context_draft_for([*key, 70, *key, 72, *key[:3]], 4) == [42, 47]
    assert _drafts.context_draft_for([*key, 70, *key, 72, *key], 4) == []
    # a longer match wins over a more recent one: "0 1 2 3" only before the 9
    tokens = [0, 1, 2, 3, 4, 5, 1, 2, 3, 9, 0, 1, 2, 3]
    assert _drafts.context_draft_for(tokens, 3) == [4, 5, 1]
    # fewer than 3 matching tokens draft nothing; past the context's end the draft
    # goes on as the run it found repeats
    assert _drafts.context_draft_for([5, 2, 3, 6, 2, 3]) == []
    assert _drafts.context_draft_for([1, 2, 3, 7, 1, 2, 3], 6) == [7, 1, 2, 3, 7, 1]
    assert _drafts.context_draft_for(list(range(4)) * 10) == [0, 1, 2, 3] * (MAX_DRAFT // 4)
    # text that repeats its phrases: the last 8 tokens occur in two sentences, the last
    # 12 only in the one the session is quoting, which goes on as it did there
    phrase = list(range(100, 108))
    tokens = [1, 2, 3, 4, *phrase, 50, 51, 5, 6, 7, 8, *phrase, 60, 61, 1, 2, 3, 4, *phrase]
    assert _drafts.context_draft_for(tokens, 2) == [50, 51]


def test_structure_draft_follows_the_words_around_a_value_of_the_sessions_own():
    # JSON objects of a list, `{"name": "` value `", "city": "` value `"},`: the words
    # as tokens 1-6, each object's values its own
    def obj(name, city, end=6):
        return [1, 2, 2, 3, *name, 4, 5, 5, 3, *city, end]
    first = [90, 91, *obj([100], [101, 102])]
    # after the session's value and the `", ` that closes it: the next key, up to the
    # earlier object's value, where its own begins (the context's last three tokens,
    # the value among them, occur nowhere before, so context_draft has nothing)
    tokens = [*first, 1, 2, 2, 3, 110, 4]
    assert _drafts.context_draft_for(tokens) == []
    assert _drafts.structure_draft_for(tokens, 5) == [5, 5, 3, 101, 102]
    # the value just sampled, as long as the earlier one: what followed that one
    assert _drafts.structure_draft_for([*first, 1, 2, 2, 3, 110], 4) == [4, 5, 5, 3]
    # values of other lengths on the two sides, the words after them alike
    tokens = [*first, *obj([110], [111]), 1, 2, 2, 3, 120, 121, 4]
    assert _drafts.structure_draft_for(tokens, 4) == [5, 5, 3, 111]
    # two earlier objects as well matched: the later one's words, as far as the
    # earlier one's agree
    first = [90, 91, *obj([100], [101])]
    tokens = [*first, *obj([110], [111]), 1, 2, 2, 3, 120, 4, 5, 5, 3, 121]
    assert _drafts.structure_draft_for(tokens, 4) == [6, 1, 2, 2]
    tokens = [*first, *obj([110], [111], end=8), 1, 2, 2, 3, 120, 4, 5, 5, 3, 121]
    assert _drafts.structure_draft_for(tokens, 4) == []
    # an earlier object more than 4,096 tokens back is out of reach
    filler = list(range(1000, 1000 + 4096))
    assert _drafts.structure_draft_for([*first, *filler[:4000], 1, 2, 2, 3, 110], 4) == [4, 5, 5, 3]
    assert _drafts.structure_draft_for([*first, *filler, 1, 2, 2, 3, 110], 4) == []
    # the words of a run matched against themselves a token on are no earlier place
    assert _drafts.structure_draft_for([9, 4, 4, 4, 4, 4, 7]) == []
    # words around the value that match fewer than 4 tokens draft nothing
    assert _drafts.structure_draft_for([*first, 9, 2, 3, 110, 4]) == []
    assert _drafts.structure_draft_for([*first, 9, 2, 2, 3, 110]) == []


def _word_forms():
    """A vocabulary of 300 tokens: 1-9 punctuation, 50 a lone space, 60-79 letters
    (digits 60-69), 100-119 a space and letters, whose twins (their text without
    the space) are 200-219; ` Xian` (110) is two, `X` `ian` (210, 211)."""
    kinds = bytearray(300)
    twins = [[-1, -1, -1, -1] for _ in range(300)]
    kinds[50] = WordKind.WORD_SPACE
    for t in [*range(60, 80), *range(200, 220)]:
        kinds[t] = WordKind.WORD_PART
    for t in range(100, 120):
        kinds[t] = WordKind.WORD_SPACED
        twins[t] = [1, t + 100, -1, -1]
    twins[110] = [2, 210, 211, -1]
    return kinds, twins


def test_values_draft_writes_the_prompts_next_values_in_the_sessions_words():
    kinds, twins = _word_forms()
    flat = lambda: [t for row in twins for t in row]  # noqa: E731
    # a table: `| Ana | Tur ku | 31 |` / `| Ben | Leeds | 45 |` / `| Xian | Cork | 31 |`
    # / `| Dara | ...`, as 5 (`|`), 6 (newline), the words and the numbers (50, digits)
    prompt = [9, 5, 100, 5, 101, 70, 5, 50, 63, 61, 5, 6, 5, 102, 5, 103, 5, 50, 64, 65, 5, 6,
              5, 110, 5, 104, 5, 50, 63, 61, 5, 6, 5, 105, 5, 6]
    # the answer: `[` 7, then objects `{"name": "` 1 2, value, `", "city": "` 3, value,
    # `", "age":` 8, ` ` 50, number, `},` 4; the first written from the first row
    first = [7, 1, 2, 200, 3, 201, 70, 8, 50, 63, 61, 4]
    # the second object's name written: what followed the first's name, each value
    # the prompt's next (Leeds, 45, then Xian, in its two tokens)
    tokens = [*prompt, *first, 1, 2, 202]
    assert _drafts.context_draft_for(tokens) == []
    assert _drafts.values_draft_for(tokens, len(prompt), kinds, flat(), 10) == (
        [3, 203, 8, 50, 64, 65, 4, 1, 2, 210], 3)
    # a value written twice in the prompt (31) is the cell after the last one: then
    # Dara; a draft that reaches no value is none (the other sources' to give)
    second = [1, 2, 202, 3, 203, 8, 50, 64, 65, 4]
    tokens = [*prompt, *first, *second, 1, 2, 210, 211, 3, 204, 8, 50, 63, 61]
    assert _drafts.values_draft_for(tokens, len(prompt), kinds, flat(), 4) == ([4, 1, 2, 205], 17)
    assert _drafts.values_draft_for(tokens, len(prompt), kinds, flat(), 3) == ([], 0)
    # no value written yet, or the only match holds none: nothing
    assert _drafts.values_draft_for([*prompt, 7, 1, 2], len(prompt), kinds, flat()) == ([], 0)
    assert _drafts.values_draft_for([*prompt, *first, 9, 9, 8, 50], len(prompt), kinds,
                                    flat(), 3) == ([], 0)
    # a spaced word whose twin is not learnt is no cell: Ben's row then starts at Leeds
    twins[102] = [-1, -1, -1, -1]
    assert _drafts.values_draft_for([*prompt, *first, 1, 2, 203], len(prompt), kinds,
                                    flat(), 3)[0] == [3, 64, 65]
    twins[102] = [1, 202, -1, -1]
    # the prompt's cells more than 8,192 tokens back, the session's words more than
    # 1,024, are out of reach
    filler = [9] * 8192
    assert _drafts.values_draft_for([*prompt, *filler, *first, 1, 2, 202], len(prompt) + 8192,
                                    kinds, flat()) == ([], 0)
    assert _drafts.values_draft_for([*prompt, *first, *filler[:1000], 1, 2, 202], len(prompt),
                                    kinds, flat(), 2) == ([3, 203], 3)
    assert _drafts.values_draft_for([*prompt, *first, *filler[:1024], 1, 2, 202], len(prompt),
                                    kinds, flat()) == ([], 0)


def test_node_store_drafts_from_other_sessions_outputs():
    store = _ngram_store.NgramStore()
    prompt = [10, 11, 12, 13, 14]
    store.add_output(prompt + [20, 21, 22, 23, 24], n_prompt=len(prompt))
    # another prompt ending with the same 4 tokens: the first one's output
    assert store.draft_for([1, 11, 12, 13, 14]) == [20, 21, 22, 23, 24]
    assert store.draft_for([12, 13, 14, 20, 21], 2) == [22, 23]
    assert store.draft_for([11, 12, 13, 15]) == []  # never seen
    # a draft never runs into the next session's tokens
    store.add_output([1, 2, 3, 4, 5, 6], n_prompt=4)
    assert store.draft_for([21, 22, 23, 24]) == []


def test_node_store_drafts_from_the_longest_match_as_far_as_answers_agree():
    store = _ngram_store.NgramStore()
    store.add_output([0, 7, 1, 2, 3, 4, 50, 51, 52], n_prompt=1)
    store.add_output([0, 8, 1, 2, 3, 4, 60, 61], n_prompt=1)
    # the older answer matches 5 tokens, the newer 4: the older one's continuation
    assert store.draft_for([7, 1, 2, 3, 4]) == [50, 51, 52]
    assert store.draft_for([8, 1, 2, 3, 4]) == [60, 61]
    # both match 4 and go on differently: nothing to tell which this session follows
    assert store.draft_for([9, 1, 2, 3, 4]) == []
    store.add_output([0, 9, 1, 2, 3, 4, 60, 70], n_prompt=1)
    # the two most recent as long (9's answer and 8's) agree on one token
    assert store.draft_for([5, 1, 2, 3, 4]) == [60]


def test_node_store_forgets_what_its_ring_overwrote():
    store = _ngram_store.NgramStore()
    store.add_output([1, 2, 3, 4, 5, 6, 7], n_prompt=4)
    filler = list(range(1000, 1000 + 4096))
    for _ in range(store.ring_size // len(filler) + 1):
        store.add_output([0] + filler, n_prompt=1)
    assert store.draft_for([1, 2, 3, 4]) == []


def scheduler(n_slots=4, token_budget=128, one_call=True):
    return _scheduler.Scheduler(n_slots, token_budget, 32, n_slots, n_vocab=100,
                                eog_tokens=[EOG], one_call=one_call)


def decoding(sched, slots, prompt, max_tokens=100, credits=100, speculate=ALWAYS, first=7):
    """Sessions on `slots` prefill `prompt` in one step and sample `first`."""
    slots = [slots] if isinstance(slots, int) else list(slots)
    for slot in slots:
        sched.start(slot, spec(prompt, max_tokens, speculation=speculate), credits=credits)
    _, decode, chunks = sched.plan_step()
    assert decode == [] and chunks == [(slot, 0, len(prompt)) for slot in slots]
    sched.apply(([-1] * (len(prompt) - 1) + [first]) * len(slots))


def test_a_verified_draft_yields_tokens_up_to_the_first_the_sampler_did_not_pick():
    sched = scheduler()
    prompt = [1, 2, 3, 4, 5, 6, 1, 2]
    decoding(sched, 0, prompt, first=3)  # context 1 2 3 4 5 6 1 2 3: drafts 4 5 6 1 2 3 ...
    _, decode, chunks = sched.plan_step()
    draft = sched.planned_draft(0)
    assert decode == [0] and draft == ([4, 5, 6, 1, 2, 3] * MAX_DRAFT)[:MAX_DRAFT] and chunks == []
    # the row fed 3 sampled 4, the row fed 4 sampled 5, the one fed 5 sampled 8 (not 6)
    events = sched.apply([4, 5, 8] + [-2] * (MAX_DRAFT - 2))
    assert events[0] == Decoded(0, drafted=MAX_DRAFT, accepted=2, source=DraftSource.DRAFT_CONTEXT)
    assert [e.token for e in events if isinstance(e, Sampled)] == [4, 5, 8]
    # phase, prefilled, generated, credits: three tokens reported
    assert sched.slot_state(0) == (2, len(prompt), 4, 96)
    assert sched.speculation.acceptance()[DraftSource.DRAFT_CONTEXT] == (2.0, float(MAX_DRAFT))


def test_drafts_stop_at_an_end_and_never_pass_max_tokens_or_credits():
    sched = scheduler()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    decoding(sched, 0, prompt, max_tokens=4, first=3)
    sched.plan_step()
    assert sched.planned_draft(0) == [4, 5]  # 4 tokens at most: 1 generated, 1 + 2 to go
    events = sched.apply([4, 5, 6])
    assert [e.token for e in events if isinstance(e, Sampled)] == [4, 5, 6]
    assert [e.reason for e in events if isinstance(e, Finished)] == [2]  # FINISH_LENGTH
    assert [e.kept for e in events if isinstance(e, Finished)] == [0]  # keep_kv off

    sched = scheduler()
    decoding(sched, 1, prompt, credits=3, first=3)
    sched.plan_step()
    assert sched.planned_draft(1) == [4]  # 2 credits left: one token and one draft
    # an end-of-generation token accepted as a draft ends the session there
    sched = scheduler()
    decoding(sched, 2, [1, 2, 3, EOG, 1, 2], first=3)
    sched.plan_step()
    assert sched.planned_draft(2)[:2] == [EOG, 1]
    events = sched.apply([EOG] + [-2] * len(sched.planned_draft(2)))
    assert [type(e) for e in events] == [Decoded, Finished]


def test_sessions_off_and_split_kv_draft_nothing_and_a_step_bounds_its_drafts():
    prompt = list(range(1, 9)) * 2 + [1, 2]
    sched = scheduler(n_slots=8, token_budget=256)
    decoding(sched, 0, prompt, speculate=OFF, first=3)
    sched.plan_step()
    assert sched.planned_draft(0) == []
    sched = scheduler(n_slots=8, token_budget=256)
    decoding(sched, [0, 1], prompt, speculate=AUTO, first=3)  # no step-time model yet
    sched.plan_step()
    assert sched.planned_draft(0) == [] and sched.planned_draft(1) == []
    split = scheduler(one_call=False)
    decoding(split, 0, prompt, first=3)
    split.plan_step()
    assert split.planned_draft(0) == []

    sched = scheduler(n_slots=8, token_budget=256)
    decoding(sched, range(8), prompt, first=3)
    _, decode, _ = sched.plan_step()
    assert sum(len(sched.planned_draft(s)) for s in decode) == MAX_STEP_DRAFTS


def test_auto_drafts_only_where_the_step_time_model_says_they_pay():
    prompt = list(range(1, 9)) * 2 + [1, 2]
    sched = scheduler(n_slots=8, token_budget=256)
    decoding(sched, 0, prompt, speculate=AUTO, first=3)
    # a step's fixed cost dominates its rows: drafts at the prior share accepted pay
    sched.set_step_time(0.020, 0.002, 0.001, 0.0)
    sched.set_row_times(linear(0.020, 0.002))
    sched.plan_step()
    assert len(sched.planned_draft(0)) > 1
    # rows dominate (compute-bound steps): no draft beside 8 decoders
    sched = scheduler(n_slots=8, token_budget=256)
    decoding(sched, range(8), prompt, speculate=AUTO, first=3)
    sched.set_step_time(0.001, 0.010, 0.001, 0.0)
    sched.set_row_times(linear(0.001, 0.010))
    _, decode, _ = sched.plan_step()
    assert decode == list(range(8)) and all(sched.planned_draft(s) == [] for s in decode)


def test_auto_sizes_a_draft_by_how_much_of_the_sessions_drafts_was_taken():
    """The j-th draft row gives a token only if the ones before it were accepted: a
    session at its source's prior tries a short draft; once its drafts are taken
    whole, longer ones; once they fail, none."""
    prompt = [1, 2, 3, 4, 5, 6, 1, 2]  # context lookup: 4 5 6 1 2 3 ... (a cycle of 6)
    sched = scheduler(n_slots=2, token_budget=256)
    decoding(sched, 0, prompt, speculate=AUTO, first=3)
    sched.set_step_time(0.010, 0.010, 0.001, 0.0)  # a row costs half a one-row step
    sched.set_row_times(linear(0.010, 0.010))
    lengths = []
    for _ in range(4):  # every draft taken
        sched.plan_step()
        draft = sched.planned_draft(0)
        lengths.append(len(draft))
        sched.apply(draft + [(draft[-1] % 6) + 1 if draft else 4])
    assert 0 < lengths[0] < MAX_DRAFT and lengths == sorted(lengths) and lengths[-1] > lengths[0]
    for i in range(6):  # every draft rejected at its first token
        sched.plan_step()
        draft = sched.planned_draft(0)
        if not draft:
            break
        sched.apply([50 + i] + [-2] * len(draft))  # the decode row sampled a new token
    assert sched.planned_draft(0) == []


def test_auto_drafts_long_or_not_at_all_where_a_second_row_costs_a_whole_step():
    """With the step times this machine measures (evidence/DGR-026/rows-cost-wide.txt:
    2 rows cost two one-row steps, 17 rows nine), a short draft costs more than it gives: a session
    at its source's prior drafts nothing, learns its chance from the drafts found
    but not verified (its tokens were their first), then drafts, longer and
    longer while its drafts are taken whole, shorter after one is rejected."""
    prompt = [1, 2, 3, 4, 5, 6, 1, 2]  # context lookup: 4 5 6 1 2 3 ... (a cycle of 6)
    sched = scheduler(n_slots=2, token_budget=256)
    decoding(sched, 0, prompt, speculate=AUTO, first=3)
    sched.set_step_time(0.010, 0.010, 0.001, 0.0)  # linear: a 2-token draft at the prior
    sched.set_row_times(timed([(1, 0.016), (2, 0.031), (5, 0.059), (9, 0.089), (17, 0.140),
                               (33, 0.240)]))
    token, waited, lengths = 4, 0, []
    while len(lengths) < 3:
        sched.plan_step()
        draft = sched.planned_draft(0)
        if lengths or draft:  # every draft taken
            assert draft
            lengths.append(len(draft))
            sched.apply(draft + [(draft[-1] % 6) + 1])
        else:  # none yet: the draft found would have been taken
            assert waited < 4
            sched.apply([token])
            token, waited = token % 6 + 1, waited + 1
    assert waited >= 1
    assert 0 < lengths[0] < lengths[1] < lengths[2] and lengths[2] >= 16
    sched.plan_step()
    sched.apply([0] + [-2] * len(sched.planned_draft(0)))  # rejected at its first token
    sched.plan_step()
    assert len(sched.planned_draft(0)) < lengths[2]


def test_auto_drafts_beside_other_sessions_only_what_their_tokens_repay():
    """A draft lengthens the step every other session waits for; its accepted tokens
    repay that later, as its session's decode rows leave the steps to come. Where
    each row costs the same (5 ms beside a fixed 40), drafts never repay it: a
    session drafts alone, and nothing beside 7 others, though its draft would raise
    the step's tokens per second. Beside another session that drafts as well, each
    draft gives its session more tokens than the steps without drafts in the same
    time: both draft. Where rows past 8 cost little, 8 such sessions draft the
    step's bound of draft rows but for fewer than one draft takes (the last rows of
    room would raise the step's rate by less than the margin)."""
    quoting = [1, 2, 3, 4, 5, 6, 1, 2]  # context lookup: 4 5 6 1 2 3 ... (a cycle of 6)
    others = [[40 + 10 * k + j for j in range(8)] for k in range(7)]  # nothing to draft
    even = timed([(rows, 0.040 + 0.005 * rows) for rows in (1, 2, 8, 16, 24, 32, 72)])
    concave = timed([(1, 0.045), (8, 0.080), (16, 0.084), (24, 0.088), (32, 0.092),
                     (72, 0.130)])

    def planned(sessions, row_times):
        sched = scheduler(n_slots=8, token_budget=256)
        for slot, prompt in enumerate(sessions):
            sched.start(slot, spec(prompt, 100, AUTO), credits=100)
        sched.plan_step()  # every prompt prefilled, each session samples 3
        sched.apply([t for prompt in sessions for t in [-1] * (len(prompt) - 1) + [3]])
        sched.set_step_time(0.040, 0.005, 0.001, 0.0)
        sched.set_row_times(row_times)
        _, decode, _ = sched.plan_step()
        assert decode == list(range(len(sessions)))
        return [len(sched.planned_draft(slot)) for slot in decode]

    assert planned([quoting], even)[0] > 0
    assert planned([quoting] + others, even) == [0] * 8
    assert all(planned([quoting] * 2, even))
    drafts = planned([quoting] * 8, concave)
    assert MAX_STEP_DRAFTS - sum(drafts) < min(n for n in drafts if n)


def test_auto_drafts_only_where_the_draft_raises_the_step_rate_by_the_margin():
    """An estimate of a draft's tokens errs by more than a hair, so a draft that
    would raise its step's expected tokens per second by less than GAIN_MARGIN (5 %)
    is not given. One quoting session (a draft token's chance 0.8 before any
    record, counted at the trust's prior 0.9), a step of r rows taking 10 ms +
    b r: a one-token draft gives 1.72 tokens in 10 + 2b ms against 1 in 10 + b,
    +3 % at b = 20.3 ms (longer drafts give less), +7.5 % at b = 15 ms."""
    def planned(b):
        sched = scheduler(n_slots=1, token_budget=256)
        sched.start(0, spec([1, 2, 3, 4, 5, 6, 1, 2], 100, AUTO), credits=100)
        sched.plan_step()
        sched.apply([-1] * 7 + [3])
        sched.set_step_time(0.010, b, 0.001, 0.0)
        sched.set_row_times(linear(0.010, b))
        sched.plan_step()
        return len(sched.planned_draft(0))

    assert planned(0.0203) == 0
    assert planned(0.015) == 1


def test_row_times_are_checked():
    sched = scheduler()
    for bad in ([(0.5, 0.01, 0)], [(1, 0.0, 0)], [(4, 0.02, 0), (2, 0.01, 0)],
                [(1, 0.01, 0)] * (ROW_GROUPS + 1)):
        with pytest.raises(ValueError, match="row times"):
            sched.set_row_times(bad)


def test_auto_drafts_only_beside_a_step_of_its_decode_rows_timed_at_their_context():
    """A step's time grows with the KV cells its rows attend, so a decode-only time
    taken beside far longer contexts (or never taken: a probe's, cells < 0, or none
    for this count of rows) would credit drafts with an edge they lack: the step
    goes without drafts, and so times its rows."""
    prompt = list(range(1, 9)) * 2 + [1, 2]  # 18 tokens, drafts pay at these times

    def planned(one_row_cells, counts=(1, 2, 4, 8, 16)):
        sched = scheduler(n_slots=2, token_budget=256)
        decoding(sched, 0, prompt, speculate=AUTO, first=3)
        sched.set_step_time(0.020, 0.002, 0.001, 0.0)
        sched.set_row_times([(rows, 0.020 + 0.002 * rows, one_row_cells if rows == 1 else 0.0)
                             for rows in counts])
        sched.plan_step()
        return len(sched.planned_draft(0))

    assert planned(0.0) > 1 and planned(500.0) > 1  # within CONTEXT_FLOOR of 19 cells
    assert planned(600.0) == 0 and planned(-1.0) == 0
    assert planned(0.0, counts=(2, 4, 8, 16)) == 0

    def drafted(n):  # n decoders whose step times make drafts nearly free
        sched = scheduler(n_slots=n, token_budget=4096)
        decoding(sched, range(n), prompt, speculate=AUTO, first=3)
        sched.set_step_time(0.05, 0.0008, 0.001, 0.0)
        sched.set_row_times([(1, 0.05, 19.0), (n, 0.1, n * 19.0), (n + 48, 0.1001, -1.0)])
        _, decode, _ = sched.plan_step()
        return sum(len(sched.planned_draft(slot)) for slot in decode)

    # past ROW_EXACT (64) rows, steps are timed in groups of several counts: a group's
    # mean is no count's own time
    assert drafted(64) > 0 and drafted(65) == 0


def test_auto_drafts_nothing_while_a_session_waits_to_prefill():
    prompt = list(range(1, 9)) * 2 + [1, 2]
    sched = scheduler(n_slots=4, token_budget=256)
    decoding(sched, 0, prompt, speculate=AUTO, first=3)
    sched.set_step_time(0.020, 0.002, 0.001, 0.0)  # drafts pay (a step's fixed cost dominates)
    sched.set_row_times(CHEAP_ROWS)
    sched.start(1, spec(list(range(30, 90)), 8, AUTO), credits=100)
    token = 4
    _, decode, chunks = sched.plan_step()
    while chunks:  # slot 1 prefills: slot 0 decodes without drafts
        assert decode == [0] and sched.planned_draft(0) == []
        (_, start, end), = chunks
        sched.apply([token] + [-1] * (end - start - 1) + [7])
        token = token % 8 + 1
        _, decode, chunks = sched.plan_step()
    assert decode == [0, 1] and len(sched.planned_draft(0)) > 1


def test_trust_falls_where_auto_drafts_give_less_than_expected_and_comes_back():
    """The share of expected tokens a plan counts is measured: drafts rejected
    lower it; steps without drafts let it return to its prior."""
    prompt = list(range(1, 9)) * 2 + [1, 2]
    sched = scheduler(n_slots=2, token_budget=256)
    sched.start(0, spec(prompt, 12, AUTO), credits=100)
    sched.start(1, spec([60, 61], 400, OFF), credits=400)
    _, _, chunks = sched.plan_step()
    assert chunks == [(0, 0, len(prompt)), (1, 0, 2)]
    sched.apply([-1] * (len(prompt) - 1) + [3] + [-1, 62])
    sched.set_step_time(0.020, 0.002, 0.001, 0.0)  # drafts pay (a step's fixed cost dominates)
    sched.set_row_times(CHEAP_ROWS)
    prior = sched.speculation.trust()
    rejected, off_token = 0, 63
    while sched.slot_state(0)[0] != 0:  # slot 0 decodes until max_tokens
        sched.plan_step()
        draft = sched.planned_draft(0)
        rejected += bool(draft)
        not_drafted = (draft[0] + 1) % 90 if draft else 0
        sched.apply([not_drafted] + [-2] * len(draft) + [off_token])
        off_token = off_token % 90 + 1
    lowered = sched.speculation.trust()
    assert rejected >= 1 and lowered < prior
    for _ in range(300):  # slot 1 alone, never speculating
        sched.plan_step()
        sched.apply([off_token])
        off_token = off_token % 90 + 1
    assert lowered < sched.speculation.trust() <= prior


def test_a_sessions_first_drafts_go_by_the_nodes_record_of_as_long_matches():
    """The node keeps its record of a draft source per class of match length: after
    a session's quotes (matches of 20 tokens and more) were taken whole, a new
    session's draft from as long a match goes in at once, while one from a 3-token
    match (a phrase repeated, as natural text does) waits for its own record."""
    cycle = list(range(1, 31))

    def primed():
        """A scheduler whose node has verified long-match drafts, all taken."""
        sched = scheduler(n_slots=2, token_budget=256)
        decoding(sched, 0, cycle + cycle[:20], max_tokens=100, speculate=ALWAYS, first=21)
        sched.set_step_time(0.010, 0.010, 0.001, 0.0)
        # a CPU's step times (evidence/DGR-026/rows-cost-wide.txt): a draft pays only
        # at a chance well above the prior's 0.8
        sched.set_row_times(timed([(1, 0.016), (2, 0.031), (5, 0.059), (9, 0.089),
                                   (17, 0.140), (33, 0.240)]))
        token = 21
        while sched.slot_state(0)[0] != 0:
            sched.plan_step()
            draft = sched.planned_draft(0)
            token = (token + len(draft)) % 30 + 1
            sched.apply(draft + [token])
        accepted, drafted = sched.speculation.acceptance()[DraftSource.DRAFT_CONTEXT]
        assert drafted > 60 and accepted == drafted
        return sched

    sched = primed()
    decoding(sched, 1, list(range(60, 90)) + list(range(60, 80)), speculate=AUTO, first=80)
    sched.plan_step()
    assert len(sched.planned_draft(1)) >= 16
    sched = primed()
    # the last three tokens, 41 42 43, occurred before, after 40 (not 56)
    decoding(sched, 1, list(range(40, 57)) + [41, 42], speculate=AUTO, first=43)
    sched.plan_step()
    assert sched.planned_draft(1) == []
