"""dgr.reply: a session's tokens into its reader's chunks, in the pump."""

import trio

from dgr.spec import SamplingParams
from dgr.reply import Reply
from dgr.sequence import FinishReason, Session
from dgr.spec import SessionSpec

PIECES = {1: b"Hel", 2: b"lo", 3: b" wor", 4: b"ld", 5: b"\xe2\x82", 6: b"\xac", 7: b"!"}


def reply_for(whole=False, **params):
    params = SamplingParams(**params | {"max_tokens": 16, "speculation": "off"})
    session = Session(id=1, spec=SessionSpec([0], params))
    send, recv = trio.open_memory_channel(16)
    stops = []
    return (Reply(session, send, PIECES.__getitem__, stops.append, credits=15, whole=whole),
            recv, stops)


def chunks(recv):
    out = []
    while True:
        try:
            out.append(recv.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out


def test_a_stop_string_across_tokens_is_held_back_then_cut():
    reply, recv, stops = reply_for(stop=["o wo"])
    for token in (1, 2, 3, 4):
        reply.token(token, None, None)
    got = chunks(recv)
    assert [c.token_id for c in got] == [1, 2, 3]  # token 4 came after the end
    assert "".join(c.text for c in got) == "Hell"
    assert got[-1].finish_reason is FinishReason.STOP and stops == [FinishReason.STOP]
    assert reply.closed
    reply.finish(FinishReason.LENGTH, None)  # the loop's finish later: nothing more
    assert chunks(recv) == []


def test_a_stop_token_ends_without_being_shown_and_min_tokens_defers_it():
    reply, recv, stops = reply_for(stop_token_ids=[7], min_tokens=2)
    for token in (1, 2, 7):
        reply.token(token, -0.5, None)
    got = chunks(recv)
    assert [(c.token_id, c.text) for c in got] == [(1, "Hel"), (2, "lo"), (None, "")]
    assert got[-1].finish_reason is FinishReason.STOP and stops == [FinishReason.STOP]
    assert got[0].logprob == -0.5


def test_text_never_splits_a_character_and_the_end_flushes_what_is_held():
    reply, recv, _ = reply_for(stop=["€?"])
    for token in (5, 6):
        reply.token(token, None, None)
    reply.finish(FinishReason.LENGTH, None)
    got = chunks(recv)
    assert [c.text for c in got] == ["", "", "€"]  # "€" held: it may start the stop
    assert got[-1].finish_reason is FinishReason.LENGTH and got[-1].token_id is None


def whole_answer(recv):
    """A whole answer's channel holds one list, its chunks with the final one last."""
    (got,) = chunks(recv)
    assert type(got) is list
    return got


def test_a_whole_answer_comes_at_its_end_with_every_chunk_as_streamed():
    streamed, streamed_recv, _ = reply_for(stop=["o wo"])
    whole, whole_recv, stops = reply_for(whole=True, stop=["o wo"])
    whole.token(1, -0.25, None)
    whole.token(2, None, None)
    assert chunks(whole_recv) == []  # nothing before the end: its reader sleeps
    for reply in (streamed, whole):
        for token in ((1, 2, 3, 4) if reply is streamed else (3, 4)):
            reply.token(token, -0.25 if token == 1 else None, None)
    got = whole_answer(whole_recv)
    assert got == chunks(streamed_recv)
    assert [c.token_id for c in got] == [1, 2, 3] and got[0].logprob == -0.25
    assert got[-1].finish_reason is FinishReason.STOP and stops == [FinishReason.STOP]


def test_a_whole_answer_without_stop_strings_reads_as_streamed_at_its_end():
    """Its tokens wait as sampled and get their text at the end: the same chunks,
    a character split over two tokens included, and a stop id still ends it."""
    for ending in ("finish", "stop id"):
        streamed, streamed_recv, _ = reply_for(stop_token_ids=[7])
        whole, whole_recv, stops = reply_for(whole=True, stop_token_ids=[7])
        for reply in (streamed, whole):
            for token in (1, 5, 6, 3, 5):
                reply.token(token, -0.5, [(token, -0.5)])
            if ending == "finish":
                reply.finish(FinishReason.LENGTH, None)
            else:
                reply.token(7, None, None)
        got = whole_answer(whole_recv)
        assert got == chunks(streamed_recv)
        assert [c.text for c in got] == ["Hel", "", "€", " wor", "", "\ufffd"]
        assert got[-1].finish_reason is (FinishReason.LENGTH if ending == "finish"
                                         else FinishReason.STOP)
        assert stops == ([] if ending == "finish" else [FinishReason.STOP])
        assert got[0].top_logprobs == [(1, -0.5)] and whole.closed


def test_a_whole_answer_ended_by_the_node_holds_nothing_back():
    reply, recv, _ = reply_for(whole=True)
    for token in (1, 2):
        reply.token(token, None, None)
    reply.finish(FinishReason.LENGTH, None)
    got = whole_answer(recv)
    assert [(c.token_id, c.text) for c in got] == [(1, "Hel"), (2, "lo"), (None, "")]
    assert got[-1].finish_reason is FinishReason.LENGTH and reply.closed


def test_a_reader_that_left_costs_nothing():
    reply, recv, stops = reply_for()
    recv.close()
    reply.token(1, None, None)
    assert reply.closed and stops == []
    reply.finish(FinishReason.CANCELLED, None)


async def test_a_reader_takes_every_chunk_there_is_at_once_and_hands_a_credit_per_token():
    from dgr.stream import SessionStream

    reply, recv, _ = reply_for()
    session = Session(id=1, spec=SessionSpec([0], SamplingParams(max_tokens=16,
                                                                 speculation="off")))
    credits = []
    stream = SessionStream(session, recv, lambda: credits.append(1))
    for token in (1, 2):
        reply.token(token, None, None)
    assert [c.text for c in await stream.next_chunks()] == ["Hel", "lo"]
    assert len(credits) == 2 and stream.finish_reason is None
    reply.token(3, None, None)
    reply.finish(FinishReason.LENGTH, None)
    last = await stream.next_chunks()
    assert [c.token_id for c in last] == [3, None] and last[-1].finish_reason == "length"
    assert len(credits) == 3 and stream.finish_reason == "length"
    assert await stream.next_chunks() == []


async def test_a_whole_answer_is_taken_in_one_piece_or_chunk_by_chunk():
    from dgr.stream import SessionStream

    session = Session(id=1, spec=SessionSpec([0], SamplingParams(max_tokens=16,
                                                                 speculation="off")))
    for read in ("next_chunks", "async for"):
        reply, recv, _ = reply_for(whole=True)
        stream = SessionStream(session, recv, lambda: None)
        for token in (1, 2):
            reply.token(token, None, None)
        reply.finish(FinishReason.LENGTH, None)
        if read == "next_chunks":
            got = await stream.next_chunks()
            assert await stream.next_chunks() == []
        else:
            got = [chunk async for chunk in stream]
        assert [c.token_id for c in got] == [1, 2, None]
        assert stream.finish_reason == "length"
