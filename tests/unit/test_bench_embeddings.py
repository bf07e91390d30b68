"""The embeddings case's inputs and its table."""

from benchmarks import embeddings


def test_texts_are_distinct_and_span_the_lengths():
    texts = embeddings.texts()
    assert len(texts) == len(set(texts)) == embeddings.INPUTS
    lengths = [len(t) for t in texts[:len(embeddings.LENGTHS)]]
    assert lengths == [n - 2 for n in embeddings.LENGTHS]


def test_table_reads_each_models_rounds():
    shape = embeddings.SHAPES["bge-small"]
    rounds = [{1: {"dgr": 12.0, "llama-server": 10.0}, 8: {"dgr": 9.0, "llama-server": 10.0}},
              {"1": {"dgr": 10.0, "llama-server": 10.0}, "8": {"dgr": 11.0, "llama-server": 10.0}}]
    result = {"levels": [1, 8], "inputs": 96, "lengths": [16, 512], "threads": 2,
              "models": [{"name": "bge-small", "shape": shape, "rounds": rounds[:1]},
                         {"name": "bge-small", "shape": shape, "rounds": rounds[1:]}]}
    table = "\n".join(embeddings.markdown(result))
    assert "| bge-small shape (384 wide, heads of 32), 1 rounds | 1 | 12.0 | 10.0 | " \
           "1.200 / 1.200 / 1.200 |" in table
    assert "| 8 | 11.0 | 10.0 | 1.100 / 1.100 / 1.100 |" in table
