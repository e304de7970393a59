from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Metrics(_message.Message):
    __slots__ = ("pids", "cpu", "memory", "memory_oom_control")
    PIDS_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_OOM_CONTROL_FIELD_NUMBER: _ClassVar[int]
    pids: PidsStat
    cpu: CPUStat
    memory: MemoryStat
    memory_oom_control: MemoryOomControl
    def __init__(self, pids: _Optional[_Union[PidsStat, _Mapping]] = ..., cpu: _Optional[_Union[CPUStat, _Mapping]] = ..., memory: _Optional[_Union[MemoryStat, _Mapping]] = ..., memory_oom_control: _Optional[_Union[MemoryOomControl, _Mapping]] = ...) -> None: ...

class PidsStat(_message.Message):
    __slots__ = ("current", "limit")
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    current: int
    limit: int
    def __init__(self, current: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class CPUStat(_message.Message):
    __slots__ = ("usage",)
    USAGE_FIELD_NUMBER: _ClassVar[int]
    usage: CPUUsage
    def __init__(self, usage: _Optional[_Union[CPUUsage, _Mapping]] = ...) -> None: ...

class CPUUsage(_message.Message):
    __slots__ = ("total", "kernel", "user")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    total: int
    kernel: int
    user: int
    def __init__(self, total: _Optional[int] = ..., kernel: _Optional[int] = ..., user: _Optional[int] = ...) -> None: ...

class MemoryStat(_message.Message):
    __slots__ = ("cache", "rss", "mapped_file", "pg_fault", "pg_maj_fault", "inactive_anon", "active_anon", "inactive_file", "active_file", "total_cache", "total_rss", "total_inactive_file", "total_active_file", "usage", "swap")
    CACHE_FIELD_NUMBER: _ClassVar[int]
    RSS_FIELD_NUMBER: _ClassVar[int]
    MAPPED_FILE_FIELD_NUMBER: _ClassVar[int]
    PG_FAULT_FIELD_NUMBER: _ClassVar[int]
    PG_MAJ_FAULT_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_ANON_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ANON_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_FILE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FILE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CACHE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RSS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_INACTIVE_FILE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ACTIVE_FILE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SWAP_FIELD_NUMBER: _ClassVar[int]
    cache: int
    rss: int
    mapped_file: int
    pg_fault: int
    pg_maj_fault: int
    inactive_anon: int
    active_anon: int
    inactive_file: int
    active_file: int
    total_cache: int
    total_rss: int
    total_inactive_file: int
    total_active_file: int
    usage: MemoryEntry
    swap: MemoryEntry
    def __init__(self, cache: _Optional[int] = ..., rss: _Optional[int] = ..., mapped_file: _Optional[int] = ..., pg_fault: _Optional[int] = ..., pg_maj_fault: _Optional[int] = ..., inactive_anon: _Optional[int] = ..., active_anon: _Optional[int] = ..., inactive_file: _Optional[int] = ..., active_file: _Optional[int] = ..., total_cache: _Optional[int] = ..., total_rss: _Optional[int] = ..., total_inactive_file: _Optional[int] = ..., total_active_file: _Optional[int] = ..., usage: _Optional[_Union[MemoryEntry, _Mapping]] = ..., swap: _Optional[_Union[MemoryEntry, _Mapping]] = ...) -> None: ...

class MemoryEntry(_message.Message):
    __slots__ = ("limit", "usage", "max", "failcnt")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    FAILCNT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    usage: int
    max: int
    failcnt: int
    def __init__(self, limit: _Optional[int] = ..., usage: _Optional[int] = ..., max: _Optional[int] = ..., failcnt: _Optional[int] = ...) -> None: ...

class MemoryOomControl(_message.Message):
    __slots__ = ("oom_kill_disable", "under_oom", "oom_kill")
    OOM_KILL_DISABLE_FIELD_NUMBER: _ClassVar[int]
    UNDER_OOM_FIELD_NUMBER: _ClassVar[int]
    OOM_KILL_FIELD_NUMBER: _ClassVar[int]
    oom_kill_disable: int
    under_oom: int
    oom_kill: int
    def __init__(self, oom_kill_disable: _Optional[int] = ..., under_oom: _Optional[int] = ..., oom_kill: _Optional[int] = ...) -> None: ...
