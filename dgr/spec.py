"""SessionSpec: what one session is asked for, built once where it arrives
(dgr.Node, from a door's or a caller's prompt and SamplingParams) and carried
whole: admission sizes it, placement matches its prompt, the batch loop's start
takes it and configures the slot from it, the reply writer reads its stops. A
per-session option is a field here, set where the session is built and read
where it is used."""

from __future__ import annotations

import attrs

from dgr.config import SamplingParams


@attrs.frozen
class SessionSpec:
    prompt: list[int]      # token ids, at least one
    params: SamplingParams
    max_tokens: int        # tokens it may generate (its request's or the node's default,
    # within the KV a session may reserve; 0 when it only scores its prompt)
    speculation: str       # "off", "auto" or "always" (dgr.config.SPECULATION_MODES):
    # the request's mode where the node can draft, else the node's
    reports_progress: bool = False  # its stream reports its prompt's prefill as it goes
    # (dgr.stream.PromptProgress chunks)

    @property
    def scores_prompt(self) -> bool:
        """It reports each prompt token's log-probability (SamplingParams.prompt_logprobs)."""
        return self.params.prompt_logprobs is not None
