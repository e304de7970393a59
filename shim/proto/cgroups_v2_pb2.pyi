from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Metrics(_message.Message):
    __slots__ = ("pids", "cpu", "memory", "memory_events")
    PIDS_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_EVENTS_FIELD_NUMBER: _ClassVar[int]
    pids: PidsStat
    cpu: CPUStat
    memory: MemoryStat
    memory_events: MemoryEvents
    def __init__(self, pids: _Optional[_Union[PidsStat, _Mapping]] = ..., cpu: _Optional[_Union[CPUStat, _Mapping]] = ..., memory: _Optional[_Union[MemoryStat, _Mapping]] = ..., memory_events: _Optional[_Union[MemoryEvents, _Mapping]] = ...) -> None: ...

class PidsStat(_message.Message):
    __slots__ = ("current", "limit")
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    current: int
    limit: int
    def __init__(self, current: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class CPUStat(_message.Message):
    __slots__ = ("usage_usec", "user_usec", "system_usec", "nr_periods", "nr_throttled", "throttled_usec")
    USAGE_USEC_FIELD_NUMBER: _ClassVar[int]
    USER_USEC_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_USEC_FIELD_NUMBER: _ClassVar[int]
    NR_PERIODS_FIELD_NUMBER: _ClassVar[int]
    NR_THROTTLED_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_USEC_FIELD_NUMBER: _ClassVar[int]
    usage_usec: int
    user_usec: int
    system_usec: int
    nr_periods: int
    nr_throttled: int
    throttled_usec: int
    def __init__(self, usage_usec: _Optional[int] = ..., user_usec: _Optional[int] = ..., system_usec: _Optional[int] = ..., nr_periods: _Optional[int] = ..., nr_throttled: _Optional[int] = ..., throttled_usec: _Optional[int] = ...) -> None: ...

class MemoryStat(_message.Message):
    __slots__ = ("anon", "file", "file_mapped", "inactive_anon", "active_anon", "inactive_file", "active_file", "pgfault", "pgmajfault", "usage", "usage_limit", "swap_usage", "swap_limit", "max_usage")
    ANON_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    FILE_MAPPED_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_ANON_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ANON_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_FILE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FILE_FIELD_NUMBER: _ClassVar[int]
    PGFAULT_FIELD_NUMBER: _ClassVar[int]
    PGMAJFAULT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    USAGE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SWAP_USAGE_FIELD_NUMBER: _ClassVar[int]
    SWAP_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_USAGE_FIELD_NUMBER: _ClassVar[int]
    anon: int
    file: int
    file_mapped: int
    inactive_anon: int
    active_anon: int
    inactive_file: int
    active_file: int
    pgfault: int
    pgmajfault: int
    usage: int
    usage_limit: int
    swap_usage: int
    swap_limit: int
    max_usage: int
    def __init__(self, anon: _Optional[int] = ..., file: _Optional[int] = ..., file_mapped: _Optional[int] = ..., inactive_anon: _Optional[int] = ..., active_anon: _Optional[int] = ..., inactive_file: _Optional[int] = ..., active_file: _Optional[int] = ..., pgfault: _Optional[int] = ..., pgmajfault: _Optional[int] = ..., usage: _Optional[int] = ..., usage_limit: _Optional[int] = ..., swap_usage: _Optional[int] = ..., swap_limit: _Optional[int] = ..., max_usage: _Optional[int] = ...) -> None: ...

class MemoryEvents(_message.Message):
    __slots__ = ("low", "high", "max", "oom", "oom_kill")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    OOM_FIELD_NUMBER: _ClassVar[int]
    OOM_KILL_FIELD_NUMBER: _ClassVar[int]
    low: int
    high: int
    max: int
    oom: int
    oom_kill: int
    def __init__(self, low: _Optional[int] = ..., high: _Optional[int] = ..., max: _Optional[int] = ..., oom: _Optional[int] = ..., oom_kill: _Optional[int] = ...) -> None: ...
