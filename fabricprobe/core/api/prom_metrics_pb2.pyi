# ruff: noqa
# fmt: off
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MetricType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COUNTER: _ClassVar[MetricType]
    GAUGE: _ClassVar[MetricType]
    SUMMARY: _ClassVar[MetricType]
    UNTYPED: _ClassVar[MetricType]
    HISTOGRAM: _ClassVar[MetricType]
    GAUGE_HISTOGRAM: _ClassVar[MetricType]
COUNTER: MetricType
GAUGE: MetricType
SUMMARY: MetricType
UNTYPED: MetricType
HISTOGRAM: MetricType
GAUGE_HISTOGRAM: MetricType

class LabelPair(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Gauge(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: float
    def __init__(self, value: _Optional[float] = ...) -> None: ...

class Counter(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: float
    def __init__(self, value: _Optional[float] = ...) -> None: ...

class Quantile(_message.Message):
    __slots__ = ("quantile", "value")
    QUANTILE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    quantile: float
    value: float
    def __init__(self, quantile: _Optional[float] = ..., value: _Optional[float] = ...) -> None: ...

class Summary(_message.Message):
    __slots__ = ("sample_count", "sample_sum", "quantile")
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_SUM_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_FIELD_NUMBER: _ClassVar[int]
    sample_count: int
    sample_sum: float
    quantile: _containers.RepeatedCompositeFieldContainer[Quantile]
    def __init__(self, sample_count: _Optional[int] = ..., sample_sum: _Optional[float] = ..., quantile: _Optional[_Iterable[_Union[Quantile, _Mapping]]] = ...) -> None: ...

class Untyped(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: float
    def __init__(self, value: _Optional[float] = ...) -> None: ...

class BucketSpan(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class Histogram(_message.Message):
    __slots__ = ("sample_count", "sample_sum", "bucket", "schema", "zero_threshold", "zero_count", "negative_span", "negative_delta", "positive_span", "positive_delta")
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_SUM_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    ZERO_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ZERO_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_SPAN_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_DELTA_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_SPAN_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_DELTA_FIELD_NUMBER: _ClassVar[int]
    sample_count: int
    sample_sum: float
    bucket: _containers.RepeatedCompositeFieldContainer[Bucket]
    schema: int
    zero_threshold: float
    zero_count: int
    negative_span: _containers.RepeatedCompositeFieldContainer[BucketSpan]
    negative_delta: _containers.RepeatedScalarFieldContainer[int]
    positive_span: _containers.RepeatedCompositeFieldContainer[BucketSpan]
    positive_delta: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sample_count: _Optional[int] = ..., sample_sum: _Optional[float] = ..., bucket: _Optional[_Iterable[_Union[Bucket, _Mapping]]] = ..., schema: _Optional[int] = ..., zero_threshold: _Optional[float] = ..., zero_count: _Optional[int] = ..., negative_span: _Optional[_Iterable[_Union[BucketSpan, _Mapping]]] = ..., negative_delta: _Optional[_Iterable[int]] = ..., positive_span: _Optional[_Iterable[_Union[BucketSpan, _Mapping]]] = ..., positive_delta: _Optional[_Iterable[int]] = ...) -> None: ...

class Bucket(_message.Message):
    __slots__ = ("cumulative_count", "upper_bound")
    CUMULATIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    cumulative_count: int
    upper_bound: float
    def __init__(self, cumulative_count: _Optional[int] = ..., upper_bound: _Optional[float] = ...) -> None: ...

class Metric(_message.Message):
    __slots__ = ("label", "gauge", "counter", "summary", "untyped", "timestamp_ms", "histogram")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    GAUGE_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    UNTYPED_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    label: _containers.RepeatedCompositeFieldContainer[LabelPair]
    gauge: Gauge
    counter: Counter
    summary: Summary
    untyped: Untyped
    timestamp_ms: int
    histogram: Histogram
    def __init__(self, label: _Optional[_Iterable[_Union[LabelPair, _Mapping]]] = ..., gauge: _Optional[_Union[Gauge, _Mapping]] = ..., counter: _Optional[_Union[Counter, _Mapping]] = ..., summary: _Optional[_Union[Summary, _Mapping]] = ..., untyped: _Optional[_Union[Untyped, _Mapping]] = ..., timestamp_ms: _Optional[int] = ..., histogram: _Optional[_Union[Histogram, _Mapping]] = ...) -> None: ...

class MetricFamily(_message.Message):
    __slots__ = ("name", "help", "type", "metric")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    name: str
    help: str
    type: MetricType
    metric: _containers.RepeatedCompositeFieldContainer[Metric]
    def __init__(self, name: _Optional[str] = ..., help: _Optional[str] = ..., type: _Optional[_Union[MetricType, str]] = ..., metric: _Optional[_Iterable[_Union[Metric, _Mapping]]] = ...) -> None: ...
