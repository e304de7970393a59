from google.protobuf import any_pb2 as _any_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RuntimeVersion(_message.Message):
    __slots__ = ("version", "revision")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    version: str
    revision: str
    def __init__(self, version: _Optional[str] = ..., revision: _Optional[str] = ...) -> None: ...

class RuntimeInfo(_message.Message):
    __slots__ = ("name", "version", "options", "features", "annotations")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: RuntimeVersion
    options: _any_pb2.Any
    features: _any_pb2.Any
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[_Union[RuntimeVersion, _Mapping]] = ..., options: _Optional[_Union[_any_pb2.Any, _Mapping]] = ..., features: _Optional[_Union[_any_pb2.Any, _Mapping]] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...
