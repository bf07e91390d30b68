"""dgr: the node runtime of a distributed GGUF runtime.

Serve one GGUF model to many concurrent sessions with continuous batching and
bounded admission:

    async with dgr.open_node(dgr.NodeConfig(model_path=...)) as node:
        result = await node.generate("Hello", dgr.SamplingParams(max_tokens=32))

and embedding models (dgr.embedding):

    async with dgr.open_embedding_node(dgr.NodeConfig(model_path=...)) as node:
        [vector] = await node.embed([node.tokenize("Hello")])
"""

__version__ = "0.1.0"  # first: modules that name the build import it from here

from dgr.config import NodeConfig, load_config
from dgr.spec import Requester, SamplingParams
from dgr.embedding import EmbeddingNode, open_embedding_node
from dgr.errors import (AdmissionRejected, BudgetError, DecodeError, DgrError, GenerationFailed,
                        InvalidRequest, ModelLoadError, NodeClosed)
from dgr.node import Node, open_node
from dgr.sequence import FinishReason
from dgr.stream import Chunk, GenerationResult, SessionStream

__all__ = [
    "AdmissionRejected", "BudgetError", "Chunk", "DecodeError", "DgrError", "EmbeddingNode",
    "FinishReason", "GenerationFailed",
    "GenerationResult", "InvalidRequest", "ModelLoadError", "Node", "NodeClosed", "NodeConfig",
    "Requester", "SamplingParams", "SessionStream", "load_config", "open_embedding_node", "open_node",
]
