"""The capability report's invariance coverage (dgr/kernel_coverage.py): a GGUF's
weight types, read from its header, against those the patch stack covers."""

import gguf
import numpy as np
import pytest

from dgr.gguf_file import tensors
from dgr.kernel_coverage import report
from dgr.testmodel import write_tensors as write


def test_the_header_gives_each_types_tensor_count_and_whether_all_are_covered(tmp_path):
    q4_1 = np.zeros((2, 20), dtype=np.uint8)  # 2 rows of one 32-weight Q4_1 block
    path = write(tmp_path / "m.gguf", {
        "a.weight": (np.ones((4, 32), dtype=np.float32), None),
        "b.weight": (np.ones((4, 32), dtype=np.float16), None),
        "c.weight": (q4_1, gguf.GGMLQuantizationType.Q4_1),
    })
    assert tensors(path) == [("a.weight", "F32", (32, 4)), ("b.weight", "F16", (32, 4)),
                             ("c.weight", "Q4_1", (32, 2))]
    assert report(path) == {"covered": False, "weight_types": {"F32": 1, "F16": 1, "Q4_1": 1},
                            "not_covered": ["Q4_1"]}
    covered = write(tmp_path / "n.gguf", {"a.weight": (np.ones((4, 32), dtype=np.float32), None)})
    assert report(covered)["covered"]
    # a weight placed in the row-invariant repacked kernels is covered whatever its type
    assert report(path, repacked={"c.weight"})["covered"]


def test_a_file_that_is_not_gguf_is_refused_and_a_header_cut_short_reported(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match="not a GGUF file"):
        tensors(str(tmp_path / "x.bin"))
    whole = (tmp_path / "m.gguf")
    write(whole, {"a.weight": (np.ones((4, 32), dtype=np.float32), None)})
    (tmp_path / "cut.gguf").write_bytes(whole.read_bytes()[:200])  # inside the metadata
    got = report(str(tmp_path / "cut.gguf"))
    assert got["covered"] is False and "cannot read" in got["error"]
