"""The LoRa adapters a node serves: loaded at start (NodeConfig.lora) or at run time,
named by requests, and each session's resolved into its spec.

A request picks its adapters by its `model` (an adapter's name: vLLM's convention)
or by llama-server's `lora` ([{id, scale}]: several, each at its scale); one that
names neither applies the adapters' global scales (llama-server's: `--lora FILE`
applies an adapter to every such request, POST /lora-adapters sets them). The
engine applies each session's adapters to its rows alone (dgr._adapters).

Many adapters may be known and few loaded (vLLM's --max-loras, S-LoRA's pool): those
of --lora-modules and the files of --lora-dir are served by name and loaded when a
request first names one (`held`); when --max-loras are loaded, the one used least
recently that no session holds is evicted, and a request waits, at most --lora-wait
seconds, for one to fall idle (then it is refused, reason "adapters_busy"). Loads run
off the step thread.

An adapter is unloaded when asked but freed only when the last session using it
has left: `acquire` (as a session is submitted) and `release` (as it retires) count
them. The file is checked here before llama.cpp reads it, so that a refusal names
what is wrong: not a LoRa GGUF, another architecture, a tensor the base model lacks
or of another shape.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

import attrs
import trio

from dgr import gguf_file
from dgr.errors import AdapterError, AdmissionRejected, ModelNotFound

_A, _B = ".lora_a", ".lora_b"
# the base architectures whose sessions tests show bitwise with adapters (llama and
# qwen3moe random-weight, gemma3 the default model)
TESTED_ARCHITECTURES = ("llama", "qwen3moe", "gemma3")
# bytes per value of an adapter tensor's type (others counted as f32, a bound)
_TYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
# what an adapter request refused for want of an idle adapter's place is told
ADAPTERS_BUSY = "adapters_busy"


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
    nbytes: int     # its tensors' bytes, and their float copies the per-row products read
    on_demand: bool = False  # loaded for a request from the known ones: evicted when idle


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


class KnownAdapters:
    """The adapters served by name without being loaded at start: --lora-modules'
    NAME=PATH, and each NAME.gguf in --lora-dir (looked up when named, so a file added
    later is served too)."""

    def __init__(self, modules: Sequence[str] = (), folder: Optional[str] = None):
        self.modules: dict[str, str] = {}
        for module in modules:
            if module.lstrip().startswith("{"):
                try:
                    fields = json.loads(module)
                    name, path = fields["name"], fields["path"]
                except (ValueError, KeyError, TypeError):
                    name = path = None
            else:
                name, _, path = module.partition("=")
            if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
                raise ValueError(f"--lora-modules takes NAME=PATH or "
                                 f'{{"name": NAME, "path": PATH}}, got {module!r}')
            self.modules[name] = path
        if folder is not None and not os.path.isdir(folder):
            raise ValueError(f"--lora-dir {folder} is not a folder")
        self.folder = folder

    def path(self, name: str) -> Optional[str]:
        """The file of the adapter `name`, if it is known. A name is a file's stem in the
        folder, never a path (no separator, no leading dot)."""
        if name in self.modules:
            return self.modules[name]
        if self.folder is None or not name or name.startswith(".") or os.sep in name \
                or (os.altsep and os.altsep in name) or "\0" in name:
            return None
        path = os.path.join(self.folder, name + ".gguf")
        return path if os.path.isfile(path) else None

    def names(self) -> list[str]:
        found = set(self.modules)
        if self.folder is not None:
            found.update(entry.name[:-len(".gguf")] for entry in os.scandir(self.folder)
                         if entry.name.endswith(".gguf") and not entry.name.startswith(".")
                         and entry.is_file())
        return sorted(found)

    def __bool__(self) -> bool:
        return bool(self.modules) or self.folder is not None


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
    none, if it cannot; `known`: those loaded when named (KnownAdapters); `wait_s`:
    how long a request waits for an idle adapter's place."""

    def __init__(self, engine, base: str, architecture: str, max_loaded: int,
                 room: Callable[[], int], wait_s: float, base_names: Sequence[str] = (),
                 unavailable: Optional[str] = None, known: Optional[KnownAdapters] = None):
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
        self.known = known or KnownAdapters()
        self.wait_s = wait_s
        self._held: collections.Counter[int] = collections.Counter()  # id -> requests holding it
        self._last_used: dict[int, int] = {}  # id -> the use count when last used
        self._uses = 0
        self._idle = trio.Event()  # set (and replaced) when a session or request lets go
        # by name, across loads: loads, evictions, sessions and tokens generated
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter)

    @classmethod
    def for_node(cls, engine, info: dict, config, room: Callable[[], int]) -> "AdapterTable":
        """The table of a node on the engine's model (`info`: Engine.info) with its
        NodeConfig's bounds and known adapters."""
        return cls(engine, info["path"], info["architecture"], config.max_loras, room,
                   config.lora_wait_s, base_names={info["name"], os.path.basename(info["path"])},
                   unavailable="LoRa adapters are not served with RPC workers (--rpc)"
                   if config.rpc_workers else None,
                   known=KnownAdapters(config.lora_modules, config.lora_dir))

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
        async with self._lock:
            return await self._load(name, path, scale, global_scale)

    async def _load(self, name: str, path: str, scale: float = 1.0, global_scale: float = 0.0,
                    on_demand: bool = False, checked: Optional[tuple] = None) -> Adapter:
        """`load`, the lock held (`checked`: what _check_file found, if it ran)."""
        if not isinstance(name, str) or not name.strip():
            raise AdapterError("an adapter needs a non-empty name")
        if not isinstance(path, str) or not path:
            raise AdapterError("an adapter needs the path of its GGUF file")
        scale = _check_scale(scale, "an adapter's scale")
        global_scale = _check_scale(global_scale, "an adapter's global scale")
        if self._unavailable is not None:
            raise AdapterError(self._unavailable)
        if name in self.by_name or name in self.base_names:
            raise AdapterError(f"the name '{name}' is taken: unload it first, or choose "
                               "another")
        if len(self.by_name) >= self.max_loaded:
            raise AdapterError(f"{self.max_loaded} adapters are loaded, the most this node "
                               "holds (--max-loras)")
        rank, alpha, weights, nbytes = checked or await trio.to_thread.run_sync(
            self._check_file, path)
        if nbytes > self._room():
            raise AdapterError(f"the adapter's {nbytes} bytes do not fit the memory budget "
                               f"({self._room()} bytes left beside the weights, KV, scratch "
                               "and the adapters loaded)")
        index = await trio.to_thread.run_sync(self._engine.load, path)
        adapter = Adapter(self._issued, index, name, path, scale, rank, alpha, weights,
                          nbytes, on_demand)
        self._issued += 1
        self.by_name[name] = adapter
        self.global_scales[adapter.id] = global_scale
        self.counts[name]["loads"] += 1
        return adapter

    # ------------------------------------------------------------ known, loaded when named

    @contextlib.asynccontextmanager
    async def held(self, model: Optional[str], lora: Optional[tuple]):
        """While open, the adapter a request's `model` names is loaded (loaded now if it
        is a known one) and no adapter it names is evicted: open it around a request's
        sessions until they are submitted (`acquire` holds them from then)."""
        ids = [adapter_id for adapter_id, _ in lora or () if self.by_id(adapter_id)]
        for adapter_id in ids:
            self._held[adapter_id] += 1
        try:
            named = await self._loaded_and_held(model) if model is not None else None
            if named is not None:
                ids.append(named.id)
            yield
        finally:
            for adapter_id in ids:
                self._held[adapter_id] -= 1
            if ids:
                self._let_go()

    async def _loaded_and_held(self, name: str) -> Optional[Adapter]:
        """The adapter `name`, loaded if known and not loaded yet, its hold counted
        before anything else can run; None where it is no adapter (resolve says why)."""
        adapter = self.by_name.get(name)
        if adapter is None and self._unavailable is None and name not in self.base_names:
            path = self.known.path(name)
            if path is not None:
                async with self._lock:
                    adapter = self.by_name.get(name)  # loaded while this request waited
                    if adapter is None:
                        # a bad file is refused before any adapter is evicted for it
                        checked = await trio.to_thread.run_sync(self._check_file, path)
                        await self._make_room(name)
                        adapter = await self._load(name, path, on_demand=True, checked=checked)
                    self._held[adapter.id] += 1
                    self._used(adapter.id)
                    return adapter
        if adapter is not None:
            self._held[adapter.id] += 1
            self._used(adapter.id)
        return adapter

    async def _make_room(self, name: str) -> None:
        """Evict idle adapters loaded on demand, least recently used first, until one
        more fits --max-loras; wait at most wait_s for one to fall idle."""
        with trio.move_on_after(self.wait_s):
            while len(self.by_name) >= self.max_loaded:
                idle = [a for a in self.by_name.values()
                        if a.on_demand and not self.users[a.id] and not self._held[a.id]]
                if idle:
                    victim = min(idle, key=lambda a: self._last_used.get(a.id, 0))
                    self.unload(victim.name)
                    self.counts[victim.name]["evictions"] += 1
                    continue
                await self._idle.wait()
            return
        self.counts[name]["busy"] += 1
        raise AdmissionRejected(
            ADAPTERS_BUSY, f"adapter '{name}' must be loaded, and the {self.max_loaded} "
            f"adapters loaded (--max-loras) stayed in use for {self.wait_s:g} s (--lora-wait)",
            retry_after=self.wait_s)

    def _used(self, adapter_id: int) -> None:
        self._uses += 1
        self._last_used[adapter_id] = self._uses

    def _let_go(self) -> None:
        self._idle.set()
        self._idle = trio.Event()

    def serves(self, name: Optional[str]) -> bool:
        """`name` is an adapter's: loaded, or known and loaded when named."""
        return name is not None and (name in self.by_name or (
            self._unavailable is None and self.known.path(name) is not None))

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
        # the tensors, and the float copies of A and B the per-row products read
        nbytes = sum((_TYPE_BYTES.get(kind, 4) + 4) * math.prod(d) for _, kind, d in tensors)
        alpha = float(metadata.get("adapter.lora.alpha", 0.0) or 0.0)
        return max(ranks), alpha, len(pairs), nbytes

    def unload(self, name: str) -> Adapter:
        """No new session applies it; it is freed once the last one using it leaves."""
        adapter = self.by_name.pop(name, None)
        if adapter is None:
            raise AdapterError(f"no adapter named '{name}' is loaded")
        self.global_scales.pop(adapter.id, None)
        self._last_used.pop(adapter.id, None)
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
        """Some adapter is known or has been loaded: a name must be the base model's
        or an adapter's (an unloaded one's is a 404, not the base model)."""
        return self._issued > 0 or bool(self.known)

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
                self._used(adapter.id)
                self.counts[adapter.name]["sessions"] += 1

    def release(self, spec, tokens: int = 0) -> None:
        """A session of `spec` (acquired) has left, having generated `tokens`."""
        for adapter, _ in spec.adapters:
            self.users[adapter.id] -= 1
            self.counts[adapter.name]["tokens"] += tokens
            self._free_if_unused(adapter.id)
        if spec.adapters:
            self._let_go()

    def facts(self) -> dict:
        """For /capabilities: the bound, the bytes, each adapter, and how often the
        engine's per-sequence list changed (each change reserves llama.cpp's graph anew)."""
        return {"max_loaded": self.max_loaded, "bytes": self.nbytes,
                "known": self.known.names(), "lora_dir": self.known.folder,
                "wait_s": self.wait_s,
                "per_session": self._unavailable is None,
                "unavailable": self._unavailable, "adapters": self.report(),
                "list_changes": self._engine.state()["relists"],
                # what tests show bitwise (alone, together, cached): tests/test_adapters.py
                "tested": {"architectures": list(TESTED_ARCHITECTURES),
                           "this_architecture": self._architecture in TESTED_ARCHITECTURES,
                           "base_weight_types": ["F32", "Q4_K_M (the default model)"],
                           "adapter_types": ["F32", "F16 (patches' native test)"],
                           "weights": "2-D layer weights",
                           "cpus": "x86-64 with AVX-512 and VNNI (the invariance report "
                                   "covers others without adapters)"}}

    def report(self) -> list[dict]:
        """Each loaded adapter: name, id, file, rank, alpha, weights, bytes, scales and
        the sessions using it."""
        return [{"name": a.name, "id": a.id, "path": a.path, "rank": a.rank, "alpha": a.alpha,
                 "weights": a.weights, "bytes": a.nbytes, "scale": a.scale,
                 "global_scale": self.global_scales.get(a.id, 0.0),
                 "sessions": self.users[a.id], "on_demand": a.on_demand}
                for a in self.by_name.values()]
