"""The Cython engine against the tiny generated model."""

import sys
import threading

import numpy as np
import pytest

from dgr import _codes, _engine
from dgr._step import step
from dgr.detok import IncrementalDetokenizer
from dgr.errors import ContextError, DecodeError, InvalidBatch, ModelLoadError


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = _engine.Engine(tiny_model, n_ctx=2048, n_seq_max=4, n_batch=256, n_ubatch=256)
    yield eng
    eng.close()


def prefill_rows(tokens, slot, start=0):
    n = len(tokens)
    want = np.zeros(n, dtype=np.int8)
    want[-1] = _codes.WANT_SAMPLE
    return list(tokens), list(range(start, start + n)), [slot] * n, list(want)


def run_alone(engine, prompt_ids, n_new, slot=0):
    engine.release(slot)
    sampled, *_ = step(engine, *prefill_rows(prompt_ids, slot))
    out = [int(sampled[-1])]
    pos = len(prompt_ids)
    while len(out) < n_new:
        sampled, *_ = step(engine, [out[-1]], [pos], [slot], [1])
        out.append(int(sampled[0]))
        pos += 1
    engine.release(slot)
    return out


def test_figures_for_admission_are_positive_and_consistent(engine):
    info = engine.info
    for key in ("model_bytes", "n_vocab", "n_ctx", "n_ctx_seq", "kv_bytes", "kv_bytes_per_cell",
                "compute_bytes", "output_bytes", "n_batch", "n_ubatch"):
        assert info[key] > 0, key
    assert info["architecture"] == "llama"
    assert info["n_seq_max"] == 4
    # split KV: every slot owns an equal share of the cells
    assert info["n_ctx_seq"] * info["n_seq_max"] == info["n_ctx"]
    assert info["n_ubatch"] <= info["n_batch"] == 256
    assert info["kv_bytes_per_cell"] * info["n_ctx"] <= info["kv_bytes"]
    assert engine.n_vocab == info["n_vocab"] == 370


@pytest.mark.parametrize("text", ["plain ASCII text, with punctuation!", "accents: éàüñ ç Ø",
                                  "emoji: 🎉🚀 and CJK 漢字", ""])
def test_tokenize_detokenize_round_trip(engine, text):
    ids = engine.tokenize(text)
    assert ids.dtype == np.int32
    assert engine.detokenize(ids) == text
    assert b"".join(engine.token_to_piece(int(t)) for t in ids).decode() == text


def test_close_waits_for_tokenize_calls_on_other_threads(tiny_model):
    """tokenize runs without the GIL, so the node tokenizes long prompts on worker
    threads beside its loop; closing the engine must not free the vocabulary under
    a call in flight, and calls after it get an error, not a crash."""
    engine = _engine.Engine(tiny_model, n_ctx=256, n_seq_max=1)
    text = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 2000
    expected = engine.tokenize(text)
    matches, errors = [], []
    tokenized_once = threading.Barrier(3)

    def tokenize_until_closed():
        matches.append(np.array_equal(engine.tokenize(text), expected))
        tokenized_once.wait()
        while True:
            try:
                ids = engine.tokenize(text)
            except DecodeError as exc:
                errors.append(str(exc))
                return
            matches.append(np.array_equal(ids, expected))

    workers = [threading.Thread(target=tokenize_until_closed) for _ in range(2)]
    for worker in workers:
        worker.start()
    tokenized_once.wait()
    engine.close()
    for worker in workers:
        worker.join()
    assert len(matches) >= 2 and all(matches)
    assert errors == ["engine is closed"] * 2


def test_incremental_detokenization_never_splits_a_character(engine):
    ids = engine.tokenize("a🎉b", add_special=False)
    pieces = [engine.token_to_piece(int(t)) for t in ids]
    assert len(pieces) == 6  # 'a', four byte tokens of the emoji, 'b'
    detok = IncrementalDetokenizer(engine.token_to_piece)
    emitted = [detok.push(int(t)) for t in ids]
    assert emitted == ["a", "", "", "", "🎉", "b"]
    assert detok.flush() == ""


def test_incremental_detokenization_flushes_an_incomplete_tail(engine):
    detok = IncrementalDetokenizer(engine.token_to_piece)
    ids = engine.tokenize("🎉", add_special=False)
    assert detok.push(int(ids[0])) == ""
    assert detok.flush() == "\ufffd"


def test_batched_sequences_match_solo_runs(engine):
    prompts = ["The quick brown fox", "a", "Lorem ipsum dolor sit amet, consectetur adipiscing",
               "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich"]
    ids = [list(engine.tokenize(p)) for p in prompts]
    n_new = 12
    solo = [run_alone(engine, p, n_new) for p in ids]

    for slot in range(4):
        engine.release(slot)
    rows = ([], [], [], [])
    for slot, p in enumerate(ids):
        for acc, part in zip(rows, prefill_rows(p, slot)):
            acc.extend(part)
    sampled, *_ = step(engine, *rows)
    ends = np.cumsum([len(p) for p in ids]) - 1
    outs = [[int(sampled[e])] for e in ends]
    pos = [len(p) for p in ids]
    for _ in range(n_new - 1):
        sampled, *_ = step(engine, [o[-1] for o in outs], pos, list(range(4)), [1] * 4)
        for slot in range(4):
            outs[slot].append(int(sampled[slot]))
            pos[slot] += 1
    assert outs == solo
    for slot in range(4):
        engine.release(slot)


def test_release_frees_cells_and_slot_reuse_is_clean(engine):
    prompt = list(engine.tokenize("reuse this slot"))
    fresh = run_alone(engine, prompt, 8, slot=1)
    step(engine, *prefill_rows(list(engine.tokenize("something else entirely, and longer")), 1))
    assert engine.pos_max(1) >= 0
    engine.release(1)
    assert engine.pos_max(1) == -1
    assert engine.cells_used() == 0
    assert run_alone(engine, prompt, 8, slot=1) == fresh


def test_logprobs_are_a_sorted_normalized_top_k(engine):
    prompt = list(engine.tokenize("log probabilities"))
    engine.release(0)
    toks, pos, seq, want = prefill_rows(prompt, 0)
    want[-1] = _codes.WANT_SAMPLE | _codes.WANT_LOGPROBS
    sampled, top_ids, top_lp, chosen_lp = step(engine, toks, pos, seq, want, n_logprobs=5)
    engine.release(0)
    row = len(prompt) - 1
    assert top_ids[row, 0] == sampled[row]  # greedy picks the best
    assert np.all(np.diff(top_lp[row]) <= 0)
    assert np.all(top_lp[row] <= 0)
    assert chosen_lp[row] == pytest.approx(top_lp[row, 0])
    assert len(set(top_ids[row].tolist())) == 5


def test_gil_is_released_during_step(wide_model):
    eng = _engine.Engine(wide_model, n_ctx=2048, n_seq_max=1, n_batch=2048, n_ubatch=512, n_threads=1)
    prompt = (list(eng.tokenize("x" * 50)) * 40)[:2000]
    started = threading.Event()

    def long_step():
        started.set()
        step(eng, *prefill_rows(prompt, 0))

    worker = threading.Thread(target=long_step)
    loops = 0
    # With a long switch interval the interpreter does not take the GIL away from
    # the worker: this thread can only run while the worker has released it.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.5)
    try:
        worker.start()
        started.wait()
        while worker.is_alive():
            loops += 1
    finally:
        worker.join()
        sys.setswitchinterval(interval)
        eng.close()
    assert loops > 10_000


def test_missing_model_path_names_the_path(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        _engine.Engine(missing)


def test_truncated_gguf_is_a_clear_error(tiny_model, tmp_path):
    data = open(tiny_model, "rb").read()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="truncated.gguf"):
        _engine.Engine(bad)


def test_non_gguf_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"this is not a model" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        _engine.Engine(bad)


def test_bad_context_parameters(tiny_model):
    with pytest.raises(ContextError):
        _engine.Engine(tiny_model, n_seq_max=0)


def test_weight_repack_is_refused_where_amx_would_crash_and_works_elsewhere(tiny_model):
    """On CPUs with AMX the pinned llama.cpp's repacked AMX matmul dies with
    SIGSEGV: the engine refuses weight_repack there with a clear error."""
    if "AMX_INT8 = 1" in _engine.system_info():
        with pytest.raises(ContextError, match="weight_repack is not supported on this CPU"):
            _engine.Engine(tiny_model, n_ctx=256, n_seq_max=1, weight_repack=True)
    else:
        eng = _engine.Engine(tiny_model, n_ctx=256, n_seq_max=1, weight_repack=True)
        sampled, *_ = step(eng, [1, 2, 3], [0, 1, 2], [0, 0, 0], [0, 0, 1])
        assert sampled[-1] >= 0
        eng.close()


def test_decreasing_positions_are_rejected(engine):
    engine.release(2)
    with pytest.raises(InvalidBatch, match="does not continue"):
        step(engine, [5, 6, 7], [0, 2, 1], [2, 2, 2], [0, 0, 1])
    assert engine.pos_max(2) == -1


def test_positions_must_continue_the_kv(engine):
    engine.release(2)
    step(engine, [5, 6], [0, 1], [2, 2], [0, 1])
    with pytest.raises(InvalidBatch, match="expected 2"):
        step(engine, [7], [5], [2], [1])
    assert engine.pos_max(2) == 1
    engine.release(2)


def test_token_out_of_vocabulary(engine):
    with pytest.raises(InvalidBatch, match="out of vocabulary"):
        step(engine, [engine.n_vocab], [0], [0], [1])
    with pytest.raises(InvalidBatch, match="out of vocabulary"):
        step(engine, [-3], [0], [0], [1])


def test_more_rows_than_n_batch(engine):
    n = engine.n_batch + 1
    with pytest.raises(InvalidBatch, match="exceed n_batch"):
        step(engine, [5] * n, list(range(n)), [0] * n, [0] * n)


def test_bad_sequence_id_and_mismatched_lengths(engine):
    with pytest.raises(InvalidBatch, match="sequence id"):
        step(engine, [5], [0], [9], [1])
    with pytest.raises(InvalidBatch, match="same length"):
        step(engine, [5, 6], [0], [0], [1])
    with pytest.raises(InvalidBatch, match="empty"):
        step(engine, [], [], [], [])


def test_row_probes_time_each_count_that_fits_and_free_their_cells(engine):
    from dgr.engine import ROW_PROBES, measure_row_times
    probes = measure_row_times(engine, max_rows=48, max_cells=2048)
    assert [rows for rows, _ in probes] == [r for r in ROW_PROBES if r <= 48]
    assert all(seconds > 0 for _, seconds in probes)
    assert engine.pos_max(0) == -1
    # the probes continue one sequence: those its cells cannot hold are not run
    assert [rows for rows, _ in measure_row_times(engine, 48, 20)] == [1, 2, 4, 8]
    assert engine.pos_max(0) == -1
