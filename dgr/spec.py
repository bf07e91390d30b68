"""SessionSpec: what one session is asked for, built once where it arrives
(dgr.Node, from a door's or a caller's prompt and SamplingParams) and carried
whole: admission sizes it, placement matches its prompt, the batch loop's start
configures the slot and the scheduler from it, the reply writer reads its stops.
A per-session option is a SamplingParams field, set where the request is read
(a door, or the caller) and read where it is used."""

from __future__ import annotations

import attrs

from dgr.config import SamplingParams


@attrs.frozen
class SessionSpec:
    prompt: list[int]  # token ids, at least one
    # as the node resolved them: max_tokens is the tokens it may generate (its
    # request's or the node's default, within the KV a session may reserve; 0 when
    # it only scores its prompt), speculation its mode where the node can draft
    # (else the node's), seed set where it samples
    params: SamplingParams
    reports_progress: bool = False  # its stream reports its prompt's prefill as it goes
    # (dgr.stream.PromptProgress chunks)

    @property
    def scores_prompt(self) -> bool:
        """It reports each prompt token's log-probability (SamplingParams.prompt_logprobs)."""
        return self.params.prompt_logprobs is not None
