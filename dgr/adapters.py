"""The LoRa adapters a node serves: loaded at start (NodeConfig.lora) or at run time,
named by requests, and each session's resolved into its spec.

A request picks its adapters by its `model` (an adapter's name: vLLM's convention)
or by llama-server's `lora` ([{id, scale}]: several, each at its scale); one that
names neither applies the adapters' global scales (llama-server's: `--lora FILE`
applies an adapter to every such request, POST /lora-adapters sets them). The
engine applies each session's adapters to its rows alone (dgr._adapters).

An adapter is unloaded when asked but freed only when the last session using it
has left: `acquire` (as a session is submitted) and `release` (as it retires) count
them. The file is checked here before llama.cpp reads it, so that a refusal names
what is wrong: not a LoRa GGUF, another architecture, a tensor the base model lacks
or of another shape.
"""

from __future__ import annotations

import collections
import math
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

import attrs
import trio

from dgr import gguf_file
from dgr.errors import AdapterError, ModelNotFound

_A, _B = ".lora_a", ".lora_b"
# the base architectures whose sessions tests show bitwise with adapters (llama and
# qwen3moe random-weight, gemma3 the default model)
TESTED_ARCHITECTURES = ("llama", "qwen3moe", "gemma3")
# bytes per value of an adapter tensor's type (others counted as f32, a bound)
_TYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@attrs.frozen(eq=False)
class Adapter:
    id: int         # llama-server's id: load order, never reused
    index: int      # the engine's table entry (dgr._adapters)
    name: str       # what a request's `model` names it by
    path: str
    scale: float    # the scale a request naming it by `model` applies it at
    rank: int
    alpha: float
    weights: int    # weight matrices it adapts
    nbytes: int     # its tensors' bytes


@attrs.frozen
class AdapterFile:
    """What the node serves at start: a file under a name, at a scale when named,
    and at a global scale (llama-server's) when a request names none."""

    name: str
    path: str
    scale: float = 1.0
    global_scale: float = 0.0


def parse_lora_flag(value: str) -> AdapterFile:
    """`--lora NAME=FILE[:SCALE]` (served as model NAME), or llama-server's `--lora
    FILE` (every request without an adapter applies it at scale 1; named by the
    file's stem)."""
    if "=" not in value or os.path.isfile(value):
        return AdapterFile(Path(value).stem, value, 1.0, 1.0)
    name, _, rest = value.partition("=")
    path, _, scale = rest.rpartition(":")
    try:
        return AdapterFile(name, path, float(scale)) if path and scale else AdapterFile(name, rest)
    except ValueError:
        return AdapterFile(name, rest)


def parse_lora_scaled(path: str, scale) -> AdapterFile:
    """llama-server's `--lora-scaled FILE SCALE`: applied at SCALE to every request
    without an adapter."""
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"--lora-scaled needs FILE SCALE, got scale {scale!r}") from None
    return AdapterFile(Path(path).stem, path, value, value)


def adapter_files(config) -> list[AdapterFile]:
    """The adapters a NodeConfig serves at start (--lora, --lora-scaled), at global
    scale 0 with --lora-init-without-apply."""
    files = ([parse_lora_flag(value) for value in config.lora]
             + [parse_lora_scaled(path, scale) for path, scale in config.lora_scaled])
    if config.lora_init_without_apply:
        files = [attrs.evolve(f, global_scale=0.0) for f in files]
    return files


def _check_scale(scale, what: str) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise AdapterError(f"{what} must be a finite number, got {scale!r}")
    return float(scale)


class AdapterTable:
    """The adapters loaded on one node, by name and by id, and their use.

    `engine`: the batch loop's dgr._adapters.Adapters; `base`: the base model's
    file; `base_names`: the names that name the base model itself; `room()`: bytes
    the memory budget has left for adapters; `unavailable`: why the node loads
    none, if it cannot."""

    def __init__(self, engine, base: str, architecture: str, max_loaded: int,
                 room: Callable[[], int], base_names: Sequence[str] = (),
                 unavailable: Optional[str] = None):
        self._engine = engine
        self._unavailable = unavailable
        self._architecture = architecture
        self._base_tensors = {name: dims for name, _, dims in gguf_file.tensors(base)}
        self.max_loaded = max_loaded
        self._room = room
        self.base_names = set(base_names)
        self.by_name: dict[str, Adapter] = {}
        self.global_scales: dict[int, float] = {}  # adapter id -> llama-server's scale
        self.users: collections.Counter[int] = collections.Counter()  # adapter id -> sessions
        self._unloaded: dict[int, Adapter] = {}  # unloaded, freed when their last user leaves
        self._issued = 0  # adapters loaded so far (the next id)
        self._lock = trio.Lock()  # one load at a time: names and the bound hold

    @property
    def nbytes(self) -> int:
        """Bytes of every adapter held (unloaded ones still in use included)."""
        return sum(a.nbytes for a in [*self.by_name.values(), *self._unloaded.values()])

    def by_id(self, adapter_id: int) -> Optional[Adapter]:
        return next((a for a in self.by_name.values() if a.id == adapter_id), None)

    # ------------------------------------------------------------ loading

    async def load(self, name: str, path: str, scale: float = 1.0,
                   global_scale: float = 0.0) -> Adapter:
        """Load the file as adapter `name`; AdapterError says why not."""
        if not isinstance(name, str) or not name.strip():
            raise AdapterError("an adapter needs a non-empty name")
        if not isinstance(path, str) or not path:
            raise AdapterError("an adapter needs the path of its GGUF file")
        scale = _check_scale(scale, "an adapter's scale")
        global_scale = _check_scale(global_scale, "an adapter's global scale")
        if self._unavailable is not None:
            raise AdapterError(self._unavailable)
        async with self._lock:
            if name in self.by_name or name in self.base_names:
                raise AdapterError(f"the name '{name}' is taken: unload it first, or choose "
                                   "another")
            if len(self.by_name) >= self.max_loaded:
                raise AdapterError(f"{self.max_loaded} adapters are loaded, the most this node "
                                   "holds (--max-loras)")
            rank, alpha, weights, nbytes = await trio.to_thread.run_sync(self._check_file, path)
            if nbytes > self._room():
                raise AdapterError(f"the adapter's {nbytes} bytes do not fit the memory budget "
                                   f"({self._room()} bytes left beside the weights, KV, scratch "
                                   "and the adapters loaded)")
            index = await trio.to_thread.run_sync(self._engine.load, path)
            adapter = Adapter(self._issued, index, name, path, scale, rank, alpha, weights,
                              nbytes)
            self._issued += 1
            self.by_name[name] = adapter
            self.global_scales[adapter.id] = global_scale
            return adapter

    def _check_file(self, path: str) -> tuple[int, float, int, int]:
        """(rank, alpha, weights, bytes) of a LoRa file for the base model; AdapterError
        naming what is wrong."""
        if not os.path.isfile(path):
            raise AdapterError(f"adapter file not found: {path}")
        try:
            metadata, tensors = gguf_file.header(path)
        except (ValueError, OSError) as exc:
            raise AdapterError(f"not a GGUF adapter: {exc}") from None
        if metadata.get("general.type") != "adapter" or metadata.get("adapter.type") != "lora":
            raise AdapterError(f"{path} is not a LoRa adapter (general.type "
                               f"{metadata.get('general.type')!r}, adapter.type "
                               f"{metadata.get('adapter.type')!r})")
        arch = metadata.get("general.architecture")
        if arch != self._architecture:
            raise AdapterError(f"the adapter is for architecture {arch!r}, the model is "
                               f"{self._architecture!r}")
        dims = {name: d for name, _, d in tensors}
        pairs = {name[:-len(_A)] for name in dims if name.endswith(_A)}
        if not pairs or pairs != {name[:-len(_B)] for name in dims if name.endswith(_B)}:
            raise AdapterError("the adapter's tensors are not lora_a/lora_b pairs")
        ranks = set()
        for weight in sorted(pairs):
            base = self._base_tensors.get(weight)
            if base is None:
                raise AdapterError(f"the adapter's {weight} is not a tensor of the model "
                                   "(an adapter for another base model?)")
            if weight.startswith("token_embd."):
                raise AdapterError("adapters of the token embeddings are not applied per "
                                   "session: not supported")
            a, b = dims[weight + _A], dims[weight + _B]
            if len(base) != 2:
                raise AdapterError(f"the adapter's {weight} adapts a weight of {len(base)} "
                                   "dimensions (experts): not supported")
            if len(a) != 2 or len(b) != 2 or (a[0], b[1]) != tuple(base[:2]) or a[1] != b[0]:
                raise AdapterError(f"the adapter's {weight} has shapes {a} and {b}, the "
                                   f"model's weight {tuple(base)} (another base model?)")
            ranks.add(a[1])
        nbytes = sum(_TYPE_BYTES.get(kind, 4) * math.prod(d) for _, kind, d in tensors)
        alpha = float(metadata.get("adapter.lora.alpha", 0.0) or 0.0)
        return max(ranks), alpha, len(pairs), nbytes

    def unload(self, name: str) -> Adapter:
        """No new session applies it; it is freed once the last one using it leaves."""
        adapter = self.by_name.pop(name, None)
        if adapter is None:
            raise AdapterError(f"no adapter named '{name}' is loaded")
        self.global_scales.pop(adapter.id, None)
        self._unloaded[adapter.id] = adapter
        self._free_if_unused(adapter.id)
        return adapter

    def _free_if_unused(self, adapter_id: int) -> None:
        if adapter_id in self._unloaded and not self.users[adapter_id]:
            self._engine.retire(self._unloaded.pop(adapter_id).index)
            del self.users[adapter_id]

    def set_global_scales(self, scales: dict[int, float]) -> None:
        """llama-server's POST /lora-adapters: these ids at these scales, the others 0."""
        for adapter_id, scale in scales.items():
            if adapter_id not in self.global_scales:
                raise AdapterError(f"invalid adapter id {adapter_id}")
            _check_scale(scale, "'scale'")
        self.global_scales = {i: float(scales.get(i, 0.0)) for i in self.global_scales}

    # ------------------------------------------------------------ sessions

    def resolve(self, model: Optional[str], lora: Optional[tuple]) -> tuple:
        """The (Adapter, scale) pairs of a request (by id order): the adapter its
        `model` names, then its `lora` ((id, scale) pairs: llama-server's, the
        others at 0); without either, those with a global scale. ModelNotFound for a
        `model` that is neither the base model's name nor an adapter, where the node
        serves adapters (else any name means the base model, as llama-server takes
        it)."""
        chosen: dict[int, tuple[Adapter, float]] = {}
        named = self.by_name.get(model) if model is not None else None
        if named is not None:
            chosen[named.id] = (named, named.scale)
        elif model is not None and self.serves_adapters and model not in self.base_names:
            raise ModelNotFound(model)
        for adapter_id, scale in lora or ():
            adapter = self.by_id(adapter_id)
            if adapter is None:
                raise AdapterError(f"invalid adapter id {adapter_id} in 'lora'", "lora")
            chosen[adapter_id] = (adapter, _check_scale(scale, "a lora scale"))
        if named is None and lora is None:
            chosen = {i: (self.by_id(i), s) for i, s in self.global_scales.items() if s}
        return tuple(chosen[i] for i in sorted(chosen) if chosen[i][1] != 0.0)

    @property
    def serves_adapters(self) -> bool:
        """Some adapter has been loaded: from then on a name must be the base model's
        or a loaded adapter's (an unloaded one's is a 404, not the base model)."""
        return self._issued > 0

    def acquire(self, specs) -> None:
        """Sessions of these specs are submitted: their adapters stay until they
        release them. ModelNotFound for an adapter unloaded since they were resolved."""
        for spec in specs:
            for adapter, _ in spec.adapters:
                if self.by_name.get(adapter.name) is not adapter:
                    raise ModelNotFound(adapter.name)
        for spec in specs:
            for adapter, _ in spec.adapters:
                self.users[adapter.id] += 1

    def release(self, spec) -> None:
        """A session of `spec` (acquired) has left."""
        for adapter, _ in spec.adapters:
            self.users[adapter.id] -= 1
            self._free_if_unused(adapter.id)

    def facts(self) -> dict:
        """For /capabilities: the bound, the bytes, each adapter, and how often the
        engine's per-sequence list changed (each change reserves llama.cpp's graph anew)."""
        return {"max_loaded": self.max_loaded, "bytes": self.nbytes,
                "per_session": self._unavailable is None,
                "unavailable": self._unavailable, "adapters": self.report(),
                "list_changes": self._engine.state()["relists"],
                # what tests show bitwise (alone, together, cached): tests/test_adapters.py
                "tested": {"architectures": list(TESTED_ARCHITECTURES),
                           "this_architecture": self._architecture in TESTED_ARCHITECTURES,
                           "base_weight_types": ["F32", "Q4_K_M (the default model)"],
                           "adapter_types": ["F32"], "weights": "2-D layer weights",
                           "cpus": "x86-64 with AVX-512 and VNNI (the invariance report "
                                   "covers others without adapters)"}}

    def report(self) -> list[dict]:
        """Each loaded adapter: name, id, file, rank, alpha, weights, bytes, scales and
        the sessions using it."""
        return [{"name": a.name, "id": a.id, "path": a.path, "rank": a.rank, "alpha": a.alpha,
                 "weights": a.weights, "bytes": a.nbytes, "scale": a.scale,
                 "global_scale": self.global_scales.get(a.id, 0.0),
                 "sessions": self.users[a.id]} for a in self.by_name.values()]
