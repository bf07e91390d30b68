"""The capability report's sections (`Node.capabilities`, `GET /capabilities`):
model facts, budgets, live load, speculation, the prefix cache, the KV tiers
and the devices holding layers, what an operator or a DGR coordinator routes
on. Each section is built from what the part that owns it gives (the engine's
facts, the budgets, admission's load, telemetry's rates, the RPC links);
nothing here keeps state."""

from __future__ import annotations

from typing import Optional

from dgr._codes import MAX_STEP_DRAFTS
from dgr.admission import Budgets, Load
from dgr.config import NodeConfig
from dgr.rpc_stats import LinkFigures
from dgr.telemetry import Telemetry


def model_facts(info: dict, budgets: Budgets, tool_format: str) -> dict:
    return ({k: info[k] for k in ("name", "architecture", "description", "model_bytes",
                                  "n_params", "n_vocab", "n_ctx_train")}
            | {"context_per_session": budgets.kv_cells_per_session,
               # how tools are rendered and called (dgr.tool_formats)
               "tool_format": tool_format})


def engine_facts(info: dict) -> dict:
    return {k: info[k] for k in ("n_ctx", "n_seq_max", "n_batch", "n_ubatch", "n_threads",
                                 "kv_unified", "weight_repack", "repacked_bytes")}


def budget_facts(info: dict, config: NodeConfig, budgets: Budgets,
                 step_time: Optional[dict]) -> dict:
    b = budgets
    return {
        "weights": {"model_bytes": info["model_bytes"], "memory_budget_bytes": b.memory_bytes},
        "kv": {"cells_total": b.kv_cells_total, "cells_per_session": b.kv_cells_per_session,
               "bytes_per_cell": info["kv_bytes_per_cell"], "bytes_total": info["kv_bytes"]},
        "scratch": {"compute_bytes": info["compute_bytes"], "output_bytes": info["output_bytes"],
                    "step_tokens": b.step_tokens, "step_outputs": b.step_outputs,
                    "prefill_chunk": config.prefill_chunk,
                    "decode_stall": config.decode_stall,
                    # seconds: a + b decode rows + c prefill rows + e cells they attend
                    # (1,024s); None until fitted (dgr.step_time)
                    "step_time_model": step_time},
        "queue": {"max_running": b.slots, "max_waiting": b.max_waiting,
                  "max_waiting_tokens": b.max_waiting_tokens},
    }


def live_load(load: Load, kv_cells_used: int, telemetry: Telemetry) -> dict:
    return {
        "active": load.active,
        "waiting": load.waiting,
        "waiting_tokens": load.waiting_tokens,
        "kv_cells_reserved": load.reserved_cells,
        "kv_cells_free": load.free_cells,
        "kv_cells_used": kv_cells_used,
        "kv_cells_cached": load.cached_cells,
        "slots_free": load.free_slots,
        "draining": load.draining,
        "failure": load.failure,
        **telemetry.recent_rates(),
    }


def speculation_facts(mode: str, info: dict, telemetry: Telemetry) -> dict:
    """Exact speculative decoding (dgr/_drafts.pyx; dgr/_scheduler.pyx, Policy 3):
    the node's default mode (off with split KV, and for a recurrent model that
    cannot roll its state back), its bounds, its totals."""
    facts = {"mode": mode, "max_draft": info["max_draft"], "max_step_drafts": MAX_STEP_DRAFTS}
    if not info["max_draft"]:
        facts["why_off"] = (f"the model's {info['memory']} state cannot drop rejected drafts "
                            "(no rollback in llama.cpp for this architecture, or "
                            "--state-rollback 0)")
    return {**facts, **telemetry.speculation_totals()}


def prefix_cache_facts(why_off: Optional[str], load: Load, telemetry: Telemetry) -> dict:
    """Whether the node keeps prefixes (why not: dgr.prefix_cache.prefix_cache_off), and its use."""
    facts = {"enabled": why_off is None} | ({"why_off": why_off} if why_off else {})
    return {**facts, "cached_cells": load.cached_cells, **telemetry.prefix_totals()}


def kv_tier_facts(kv_tiers: Optional[dict], telemetry: Telemetry) -> dict:
    """Host memory and disk beyond the pool (dgr.kv_tiers): bounds, use, counters."""
    if kv_tiers is None:
        return {"host": {"enabled": False}, "disk": {"enabled": False}}
    return {**kv_tiers, **telemetry.tier_totals()}


def device_list(info_devices: list[dict], links: dict[str, LinkFigures],
                at_start: dict[str, LinkFigures], connected: dict[str, bool],
                steps: int) -> list[dict]:
    """The engine's devices, each RPC worker's with its link: connected, bytes
    each way, bytes per step since the node started (`at_start`: the links once
    loaded, so that the weights sent are not counted as steps'), RTT."""
    devices = []
    for device in info_devices:
        link: Optional[LinkFigures] = links.get(device["endpoint"])
        if link is not None:
            start = at_start.get(device["endpoint"], link)
            moved = (link.bytes_sent - start.bytes_sent) + (link.bytes_received - start.bytes_received)
            device = device | {"link": {
                "connected": connected.get(device["endpoint"], False),
                "connections": link.connections,
                "bytes_sent": link.bytes_sent, "bytes_received": link.bytes_received,
                "bytes_per_step": moved // max(1, steps), "rtt_ms": round(link.rtt_s * 1e3, 3)}}
        devices.append(device)
    return devices


def scheduling_facts(admission, parking_off: Optional[str], telemetry) -> dict:
    """Who runs next (dgr.admission.Scheduling), the tenants listed with their weights
    and bounds, and whether and how often sessions were parked."""
    scheduling = admission.scheduling
    return {"policy": scheduling.policy,
            "parking": {"on": parking_off is None, "why_not": parking_off,
                        "max_parked": scheduling.max_parked, "max_parks": scheduling.max_parks,
                        "parked": len(admission.parked),
                        **telemetry.parking_totals()},
            "fair_drift": scheduling.fair_drift,
            "tenants": {name: bounds.facts()
                        for name, bounds in sorted(admission.tenants.listed.items())}}
