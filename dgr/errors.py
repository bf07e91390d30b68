"""Exceptions raised by dgr. Every one derives from DgrError."""

from __future__ import annotations

from dgr._codes import (DECODE_ABORTED, ENGINE_FAULT, KV_MOVE_FAILED, NO_LOGITS,
                        STATE_ROLLBACK_FAILED, WORKER_LOST)


class DgrError(Exception):
    """Base class of every dgr error."""


class ModelLoadError(DgrError):
    """The model file could not be opened or is not a valid GGUF model."""


class ContextError(DgrError):
    """llama.cpp could not create a context with the requested parameters."""


class BudgetError(DgrError):
    """The node cannot start inside its memory budget (weights, KV, scratch)."""


class InvalidBatch(DgrError, ValueError):
    """A step's arrays are malformed: caught before llama_decode, or its return code -1."""

    code = -1


class DecodeError(DgrError):
    """llama_decode failed. `code` is its return value; the KV memory was reconciled
    to its state before the failed step, so the sequences can be resumed or released."""

    code: int = 0

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class KVSlotUnavailable(DecodeError):
    """llama_decode returned 1: no KV slot for the batch."""

    code = 1


class DecodeAborted(DecodeError):
    """llama_decode returned 2: aborted through the abort callback."""

    code = 2


class FatalDecodeError(DecodeError):
    """llama_decode returned a code below -1."""


class WorkerLost(DecodeError):
    """An RPC worker holding some of the model's layers stopped answering (its
    connection closed, reset or timed out): the step's results are not the
    model's, and no later step can succeed until the node is restarted."""

    code = -1001


class AdmissionRejected(DgrError):
    """A session was refused by admission. `reason` is a stable code such as
    "queue_full", "queue_tokens_full", "never_fits", "draining" or a tenant's
    "tenant_queue_full" and "tenant_rate" (dgr.admission.REASONS)."""

    def __init__(self, reason: str, detail: str = "", figures: dict | None = None,
                 retry_after: float | None = None):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.figures = figures or {}  # never_fits: n_prompt_tokens and n_ctx
        # seconds until it is worth asking again, where the refusal knows (a tenant's
        # rate); else the node's drain rate says
        self.retry_after = retry_after


class GenerationFailed(DgrError):
    """A session ended because the model failed (its step's llama_decode did)."""


class InvalidRequest(DgrError, ValueError):
    """Bad sampling parameters or an unusable prompt. `field`: the parameter at
    fault (a SamplingParams field), when one is."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class AdapterError(InvalidRequest):
    """A LoRa adapter the node refuses to load or unload (a bad file, a taken or
    unknown name, no room), saying why."""


class ModelNotFound(DgrError):
    """A request names a model the node does not serve: neither the base model (by
    any of its names) nor a loaded adapter."""

    def __init__(self, name: str):
        super().__init__(f"the model '{name}' does not exist")
        self.name = name


class NotServed(DgrError):
    """A request of a kind this node does not serve (generation on an embedding node,
    embeddings on a generation node, rerank without a reranker), saying how to start
    one that does."""


class NodeClosed(DgrError):
    """The node is not running (not started yet, or shut down)."""


def decode_error(rc: int) -> DecodeError:
    """The DecodeError of a failed call's code (llama_decode's, or dgr/_codes.pxd's)."""
    if rc == 1:
        return KVSlotUnavailable("llama_decode: no KV slot for the batch (code 1)")
    if rc == DECODE_ABORTED:
        return DecodeAborted(f"llama_decode: aborted (code {rc})")
    if rc == -1:
        return InvalidBatch("llama_decode: invalid input batch (code -1)")
    if rc == WORKER_LOST:
        return WorkerLost("an RPC worker was lost (connection closed, reset or timed out); "
                          "restart the node once the worker is back")
    if rc == ENGINE_FAULT:
        return DecodeError(f"the engine raised during a step (code {rc})", rc)
    if rc == STATE_ROLLBACK_FAILED:
        return DecodeError("llama.cpp could not roll the session's recurrent state back past "
                           f"its rejected drafts (code {rc})", rc)
    if rc == KV_MOVE_FAILED:
        return DecodeError("no KV cells in position order for the session, and it could not "
                           f"be moved to some: the pool is too full (code {rc})", rc)
    if rc == NO_LOGITS:
        return DecodeError(f"llama.cpp gave no logits for an output row (code {rc})", rc)
    if rc < -1:
        return FatalDecodeError(f"llama_decode: fatal error (code {rc})", rc)
    return DecodeError(f"llama_decode: unexpected return code {rc}", rc)
