"""Per-link NVLink counters through NVML field values, where the GPU offers them.

For each GPU and each active link, one ``nvmlDeviceGetFieldValues`` call
asks for the data throughput sent and received (``THROUGHPUT_DATA_TX/RX``,
in KiB, the link named by ``scopeId``) and the link's CRC, replay and
recovery error counters (``*_ERROR_COUNT_L<n>``: NVML numbers those fields
per link, for links 0-11 only, so links above 11 report throughput alone).
Every counter counts since the driver loaded.

A field the GPU does not offer answers ``NVML_ERROR_NOT_SUPPORTED`` in its
own slot and is left out; a GPU without field values at all, or without
NVLink, contributes nothing. Nothing here raises: telemetry is a reading
sent beside the heartbeat, and a node whose counters cannot be read is still
alive and its snapshot still true.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml  # type: ignore[import-untyped]

from agent.nvml_api import Nvml
from agent.nvml_calls import NO_SUCH_LINK

log = logging.getLogger("topoplace.agent")
KIB = 1024
COUNTER_MAX = 2**64 - 1  # the heartbeat's counters are unsigned 64-bit integers
# The per-link error fields, by the name the service reports them under.
ERROR_FIELDS = {
    "crc_flit_errors": "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L",
    "crc_data_errors": "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L",
    "replay_errors": "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L",
    "recovery_errors": "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L",
}
Fields = list[tuple[str, int, int]]  # (name, field id, scope id)


def link_fields(link: int) -> Fields:
    """The fields asked for one link."""
    fields: Fields = [
        ("tx_bytes", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link),
        ("rx_bytes", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link),
    ]
    for name, prefix in ERROR_FIELDS.items():
        field_id = getattr(pynvml, f"{prefix}{link}", None)
        if field_id is not None:
            fields.append((name, field_id, 0))
    return fields


def _value(entry: Any) -> int | None:
    """An unsigned field value; None when the field is not offered or not an integer."""
    if entry.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    kinds = {
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    }
    attribute = kinds.get(entry.valueType)
    return None if attribute is None else int(getattr(entry.value, attribute))


def read_link(nvml: Nvml, handle: Any, link: int) -> dict[str, int] | None:
    """One link's counters (bytes, counts); None when the GPU offers none of them."""
    fields = link_fields(link)
    try:
        values = nvml.nvmlDeviceGetFieldValues(handle, [(f, scope) for _, f, scope in fields])
    except pynvml.NVMLError:
        return None
    out: dict[str, int] = {}
    for (name, _, _), entry in zip(fields, values, strict=True):
        value = _value(entry)
        if value is not None and name in ("tx_bytes", "rx_bytes"):
            value *= KIB
        # A KiB count past 2^54 (wrapped, or an all-ones "not available") is no byte
        # count a 64-bit counter holds, and the service refuses the whole heartbeat for it.
        if value is not None and value <= COUNTER_MAX:
            out[name] = value
    return out or None


def read_nvlink(nvml: Nvml) -> list[dict[str, int]]:
    """Every active link's counters, as the heartbeat's ``nvlink`` entries."""
    entries: list[dict[str, int]] = []
    try:
        count = nvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        log.warning("NVLink counters not read: %s", exc)
        return entries
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError:
            continue  # discovery reports the GPU's trouble; telemetry just skips it
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
            except NO_SUCH_LINK:
                break  # past the GPU's last link, or no NVLink at all
            except pynvml.NVMLError:
                continue
            counters = read_link(nvml, handle, link)
            if counters is not None:
                entries.append({"gpu": index, "link": link, **counters})
    return entries
