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
    # the LoRa adapters it applies, each with its scale (dgr.adapters.Adapter, float),
    # as the node resolved the request's model and lora fields
    adapters: tuple = ()

    @property
    def adapter_scales(self) -> tuple[tuple[int, float], ...]:
        """(engine index, scale) of each adapter, as the batch loop sets them."""
        return tuple((adapter.index, scale) for adapter, scale in self.adapters)

    @property
    def cache_key(self) -> tuple[tuple[int, float], ...]:
        """What its KV depends on besides its tokens: (load id, scale) of each adapter.
        A prefix is shared only between sessions of one key (dgr.prefix_cache)."""
        return tuple((adapter.id, scale) for adapter, scale in self.adapters)

    @property
    def scores_prompt(self) -> bool:
        """It reports each prompt token's log-probability (SamplingParams.prompt_logprobs)."""
        return self.params.prompt_logprobs is not None
