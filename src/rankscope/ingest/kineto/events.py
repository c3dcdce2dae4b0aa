"""The keys of a trace event the reader keeps, as msgspec Structs, and the decoders made from them."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec


# Structs: the keys we keep. Values are `Any` so that a badly typed value never fails a chunk;
# the column extractor checks types and substitutes defaults.
class Args(msgspec.Struct, frozen=True, gc=False):
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_2021: Any = msgspec.field(default=None, name="external id")
    correlation: Any = None
    device: Any = None
    stream: Any = None
    # collectives
    collective_name: Any = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    in_split_size: Any = msgspec.field(default=None, name="In split size")
    out_split_size: Any = msgspec.field(default=None, name="Out split size")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    # device activity
    registers_per_thread: Any = msgspec.field(default=None, name="registers per thread")
    shared_memory: Any = msgspec.field(default=None, name="shared memory")
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")
    warps_per_sm: Any = msgspec.field(default=None, name="warps per SM")
    grid: Any = None
    block: Any = None
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    bytes: Any = None
    bandwidth: Any = msgspec.field(default=None, name="memory bandwidth (GB/s)")
    # operators
    # Raw (the value's JSON text), None when absent: typed `Raw | None`, msgspec would accept only null
    input_dims: msgspec.Raw = msgspec.field(default=None, name="Input Dims")  # type: ignore[assignment]
    input_type: msgspec.Raw = msgspec.field(default=None, name="Input type")  # type: ignore[assignment]
    call_stack: Any = msgspec.field(default=None, name="Call stack")
    sequence_number: Any = msgspec.field(default=None, name="Sequence number")
    fwd_thread_id: Any = msgspec.field(default=None, name="Fwd thread id")
    flops: Any = None
    python_id: Any = msgspec.field(default=None, name="Python id")
    python_parent_id: Any = msgspec.field(default=None, name="Python parent id")
    # [memory] instants
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    mem_device_id: Any = msgspec.field(default=None, name="Device Id")
    mem_device_type: Any = msgspec.field(default=None, name="Device Type")
    addr: Any = msgspec.field(default=None, name="Addr")
    # metadata events
    name: Any = None


class Event(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    cat: Any = None
    pid: Any = None
    tid: Any = None
    ts: Decimal | None = None      # exact: ns = round(µs * 1000), no float rounding
    dur: Decimal | None = None
    id: Any = None
    args: Args | None = None


class Header(msgspec.Struct, gc=False):
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None
    hostname: Any = None


_decode_events = msgspec.json.Decoder(list[Event]).decode
_decode_raw_list = msgspec.json.Decoder(list[msgspec.Raw]).decode
_decode_header = msgspec.json.Decoder(Header).decode
_decode_any = msgspec.json.Decoder(float_hook=Decimal).decode


class _RawTimes(Event):
    """An event whose ts or dur is not a number: both kept as JSON text, judged by `_time`. (A
    Struct subclass may give a field another type; None when absent, as in `Args`.)"""
    ts: msgspec.Raw = None  # type: ignore[assignment]
    dur: msgspec.Raw = None  # type: ignore[assignment]


_decode_raw_times = msgspec.json.Decoder(list[_RawTimes]).decode
_decode_time = msgspec.json.Decoder(Decimal | None).decode
#: ts/dur of an event read leniently that is not a number: the column gets T_NOT_A_NUMBER
_NOT_A_NUMBER = Decimal("NaN")
