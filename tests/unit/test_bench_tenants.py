"""The tenants case's figures: a round's comparison of the loaded server with the
idle one and with the batch tenant alone, and its table."""

from benchmarks import tenants


def phase(tokens_per_s=0.0, batch=(), chats=(), ttfts=()):
    answered = [t for t in ttfts if t is not None]
    return {"batch_tokens_per_s": tokens_per_s, "batch_texts": list(batch),
            "chats": len(ttfts), "answered": len(answered),
            "chat_texts": list(chats), "step_ms": 250.0,
            "ttft_p50_ms": 1000 * sorted(answered)[len(answered) // 2] if answered else None,
            "ttft_p99_ms": 1000 * max(answered) if answered else None}


def test_a_round_compares_the_loaded_server_with_each_tenant_alone():
    idle = phase(chats=[(0, "Paris")], ttfts=[0.1])
    alone = phase(100.0, batch=[(0, "a"), (1, "b")])
    loaded = phase(95.0, batch=[(0, "a"), (1, "b"), (0, "a")], chats=[(0, "Paris")],
                   ttfts=[0.3, None])
    got = tenants.figures(idle, alone, loaded)
    assert got["batch_ratio"] == 0.95 and got["bitwise"] is True
    assert (got["answered"], got["chats"]) == (1, 2)
    changed = phase(95.0, batch=[(1, "c")])
    assert tenants.figures(idle, alone, changed)["bitwise"] is False
    unknown = phase(95.0, batch=[(2, "a")])  # a prompt never answered alone is no match
    assert tenants.figures(idle, alone, unknown)["bitwise"] is False
    unsteady = phase(100.0, batch=[(0, "a"), (0, "x")])  # alone, one prompt gave two texts
    assert tenants.figures(idle, unsteady, loaded)["bitwise"] is False
    table = "\n".join(tenants.markdown({"batch_c": 32, "batch_tokens": 160, "chat_tokens": 16,
                                        "phase_s": 20.0, "chat_every_s": 1.0,
                                        "rounds": [{"dgr": got}]}))
    assert ("| 1 | dgr | 1/2 | 100 / 100 | 300 / 300 | 250 | 100.0 / 95.0 (0.95) | True |"
            in table)
