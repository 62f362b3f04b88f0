# ruff: noqa
# fmt: off
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Gid(_message.Message):
    __slots__ = ("index", "gid", "type", "netdev")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    index: int
    gid: str
    type: str
    netdev: str
    def __init__(self, index: _Optional[int] = ..., gid: _Optional[str] = ..., type: _Optional[str] = ..., netdev: _Optional[str] = ...) -> None: ...

class RdmaPort(_message.Message):
    __slots__ = ("number", "state", "link_layer", "gids")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    GIDS_FIELD_NUMBER: _ClassVar[int]
    number: int
    state: str
    link_layer: str
    gids: _containers.RepeatedCompositeFieldContainer[Gid]
    def __init__(self, number: _Optional[int] = ..., state: _Optional[str] = ..., link_layer: _Optional[str] = ..., gids: _Optional[_Iterable[_Union[Gid, _Mapping]]] = ...) -> None: ...

class RdmaDevice(_message.Message):
    __slots__ = ("name", "driver", "ports", "rail", "gpu", "gpu_address", "gpu_link")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPU_LINK_FIELD_NUMBER: _ClassVar[int]
    name: str
    driver: str
    ports: _containers.RepeatedCompositeFieldContainer[RdmaPort]
    rail: int
    gpu: str
    gpu_address: str
    gpu_link: str
    def __init__(self, name: _Optional[str] = ..., driver: _Optional[str] = ..., ports: _Optional[_Iterable[_Union[RdmaPort, _Mapping]]] = ..., rail: _Optional[int] = ..., gpu: _Optional[str] = ..., gpu_address: _Optional[str] = ..., gpu_link: _Optional[str] = ...) -> None: ...

class HostInfo(_message.Message):
    __slots__ = ("host", "addresses", "devices", "topology", "probe_port", "probe_kinds", "version", "role")
    HOST_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    PROBE_KINDS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    host: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    devices: _containers.RepeatedCompositeFieldContainer[RdmaDevice]
    topology: str
    probe_port: int
    probe_kinds: _containers.RepeatedScalarFieldContainer[str]
    version: str
    role: str
    def __init__(self, host: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ..., devices: _Optional[_Iterable[_Union[RdmaDevice, _Mapping]]] = ..., topology: _Optional[str] = ..., probe_port: _Optional[int] = ..., probe_kinds: _Optional[_Iterable[str]] = ..., version: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("host",)
    HOST_FIELD_NUMBER: _ClassVar[int]
    host: HostInfo
    def __init__(self, host: _Optional[_Union[HostInfo, _Mapping]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("report_interval_ms", "assignments")
    REPORT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    report_interval_ms: int
    assignments: Assignments
    def __init__(self, report_interval_ms: _Optional[int] = ..., assignments: _Optional[_Union[Assignments, _Mapping]] = ...) -> None: ...

class ProbeTarget(_message.Message):
    __slots__ = ("dst", "address", "port", "kind", "size", "interval_ms", "count", "device", "gid", "ecmp_classes", "rail", "src_device")
    DST_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    ECMP_CLASSES_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    SRC_DEVICE_FIELD_NUMBER: _ClassVar[int]
    dst: str
    address: str
    port: int
    kind: str
    size: int
    interval_ms: int
    count: int
    device: str
    gid: str
    ecmp_classes: int
    rail: int
    src_device: str
    def __init__(self, dst: _Optional[str] = ..., address: _Optional[str] = ..., port: _Optional[int] = ..., kind: _Optional[str] = ..., size: _Optional[int] = ..., interval_ms: _Optional[int] = ..., count: _Optional[int] = ..., device: _Optional[str] = ..., gid: _Optional[str] = ..., ecmp_classes: _Optional[int] = ..., rail: _Optional[int] = ..., src_device: _Optional[str] = ...) -> None: ...

class AssignmentsRequest(_message.Message):
    __slots__ = ("host", "known_generation")
    HOST_FIELD_NUMBER: _ClassVar[int]
    KNOWN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    host: str
    known_generation: int
    def __init__(self, host: _Optional[str] = ..., known_generation: _Optional[int] = ...) -> None: ...

class Assignments(_message.Message):
    __slots__ = ("host", "generation", "targets", "probe_budget", "list_qps")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    PROBE_BUDGET_FIELD_NUMBER: _ClassVar[int]
    LIST_QPS_FIELD_NUMBER: _ClassVar[int]
    host: str
    generation: int
    targets: _containers.RepeatedCompositeFieldContainer[ProbeTarget]
    probe_budget: int
    list_qps: bool
    def __init__(self, host: _Optional[str] = ..., generation: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[ProbeTarget, _Mapping]]] = ..., probe_budget: _Optional[int] = ..., list_qps: _Optional[bool] = ...) -> None: ...

class Sketch(_message.Message):
    __slots__ = ("kind", "count", "lost", "min_ns", "max_ns", "sum_ns", "slots", "counts")
    KIND_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    MIN_NS_FIELD_NUMBER: _ClassVar[int]
    MAX_NS_FIELD_NUMBER: _ClassVar[int]
    SUM_NS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    count: int
    lost: int
    min_ns: int
    max_ns: int
    sum_ns: int
    slots: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, kind: _Optional[str] = ..., count: _Optional[int] = ..., lost: _Optional[int] = ..., min_ns: _Optional[int] = ..., max_ns: _Optional[int] = ..., sum_ns: _Optional[int] = ..., slots: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class ProbeWindow(_message.Message):
    __slots__ = ("dst", "transport", "op", "size", "rtt", "bytes_moved", "busy_seconds", "failures", "prober_delay", "sport", "return_sport", "rail")
    DST_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    RTT_FIELD_NUMBER: _ClassVar[int]
    BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    PROBER_DELAY_FIELD_NUMBER: _ClassVar[int]
    SPORT_FIELD_NUMBER: _ClassVar[int]
    RETURN_SPORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    dst: str
    transport: str
    op: str
    size: int
    rtt: Sketch
    bytes_moved: int
    busy_seconds: float
    failures: int
    prober_delay: Sketch
    sport: int
    return_sport: int
    rail: int
    def __init__(self, dst: _Optional[str] = ..., transport: _Optional[str] = ..., op: _Optional[str] = ..., size: _Optional[int] = ..., rtt: _Optional[_Union[Sketch, _Mapping]] = ..., bytes_moved: _Optional[int] = ..., busy_seconds: _Optional[float] = ..., failures: _Optional[int] = ..., prober_delay: _Optional[_Union[Sketch, _Mapping]] = ..., sport: _Optional[int] = ..., return_sport: _Optional[int] = ..., rail: _Optional[int] = ...) -> None: ...

class ClassPath(_message.Message):
    __slots__ = ("dst", "sport", "src_ip", "dst_ip", "hops", "complete", "method", "rail")
    DST_FIELD_NUMBER: _ClassVar[int]
    SPORT_FIELD_NUMBER: _ClassVar[int]
    SRC_IP_FIELD_NUMBER: _ClassVar[int]
    DST_IP_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    dst: str
    sport: int
    src_ip: str
    dst_ip: str
    hops: _containers.RepeatedScalarFieldContainer[str]
    complete: bool
    method: str
    rail: int
    def __init__(self, dst: _Optional[str] = ..., sport: _Optional[int] = ..., src_ip: _Optional[str] = ..., dst_ip: _Optional[str] = ..., hops: _Optional[_Iterable[str]] = ..., complete: _Optional[bool] = ..., method: _Optional[str] = ..., rail: _Optional[int] = ...) -> None: ...

class Retrace(_message.Message):
    __slots__ = ("dst", "address", "sport", "rail")
    DST_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SPORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    dst: str
    address: str
    sport: int
    rail: int
    def __init__(self, dst: _Optional[str] = ..., address: _Optional[str] = ..., sport: _Optional[int] = ..., rail: _Optional[int] = ...) -> None: ...

class CounterReading(_message.Message):
    __slots__ = ("kind", "device", "port", "netdev", "priority", "name", "value", "width")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    kind: str
    device: str
    port: int
    netdev: str
    priority: int
    name: str
    value: int
    width: int
    def __init__(self, kind: _Optional[str] = ..., device: _Optional[str] = ..., port: _Optional[int] = ..., netdev: _Optional[str] = ..., priority: _Optional[int] = ..., name: _Optional[str] = ..., value: _Optional[int] = ..., width: _Optional[int] = ...) -> None: ...

class AgentStats(_message.Message):
    __slots__ = ("cpu_seconds", "rss_bytes", "probes", "probe_rate", "spool_depth", "spool_bytes", "spool_dropped", "links", "sessions", "sessions_refused", "spool_write_failures", "spool_quarantined", "spool_memory_windows", "thread_failures", "sessions_refused_by_reason", "self_throttle", "cpu_share", "cpu_pressure")
    class SessionsRefusedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    PROBE_RATE_FIELD_NUMBER: _ClassVar[int]
    SPOOL_DEPTH_FIELD_NUMBER: _ClassVar[int]
    SPOOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPOOL_DROPPED_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    SPOOL_WRITE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    SPOOL_QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    SPOOL_MEMORY_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    THREAD_FAILURES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_REFUSED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    SELF_THROTTLE_FIELD_NUMBER: _ClassVar[int]
    CPU_SHARE_FIELD_NUMBER: _ClassVar[int]
    CPU_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    cpu_seconds: float
    rss_bytes: int
    probes: int
    probe_rate: float
    spool_depth: int
    spool_bytes: int
    spool_dropped: int
    links: int
    sessions: int
    sessions_refused: int
    spool_write_failures: int
    spool_quarantined: int
    spool_memory_windows: int
    thread_failures: int
    sessions_refused_by_reason: _containers.ScalarMap[str, int]
    self_throttle: float
    cpu_share: float
    cpu_pressure: float
    def __init__(self, cpu_seconds: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., probes: _Optional[int] = ..., probe_rate: _Optional[float] = ..., spool_depth: _Optional[int] = ..., spool_bytes: _Optional[int] = ..., spool_dropped: _Optional[int] = ..., links: _Optional[int] = ..., sessions: _Optional[int] = ..., sessions_refused: _Optional[int] = ..., spool_write_failures: _Optional[int] = ..., spool_quarantined: _Optional[int] = ..., spool_memory_windows: _Optional[int] = ..., thread_failures: _Optional[int] = ..., sessions_refused_by_reason: _Optional[_Mapping[str, int]] = ..., self_throttle: _Optional[float] = ..., cpu_share: _Optional[float] = ..., cpu_pressure: _Optional[float] = ...) -> None: ...

class WindowReport(_message.Message):
    __slots__ = ("host", "epoch", "seq", "window_start_unix_ns", "window_end_unix_ns", "probes", "counters", "agent", "assignment_generation", "class_windows", "class_paths", "rail_windows", "qps")
    HOST_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_GENERATION_FIELD_NUMBER: _ClassVar[int]
    CLASS_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    CLASS_PATHS_FIELD_NUMBER: _ClassVar[int]
    RAIL_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    QPS_FIELD_NUMBER: _ClassVar[int]
    host: str
    epoch: int
    seq: int
    window_start_unix_ns: int
    window_end_unix_ns: int
    probes: _containers.RepeatedCompositeFieldContainer[ProbeWindow]
    counters: _containers.RepeatedCompositeFieldContainer[CounterReading]
    agent: AgentStats
    assignment_generation: int
    class_windows: _containers.RepeatedCompositeFieldContainer[ProbeWindow]
    class_paths: _containers.RepeatedCompositeFieldContainer[ClassPath]
    rail_windows: _containers.RepeatedCompositeFieldContainer[ProbeWindow]
    qps: QpList
    def __init__(self, host: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., window_start_unix_ns: _Optional[int] = ..., window_end_unix_ns: _Optional[int] = ..., probes: _Optional[_Iterable[_Union[ProbeWindow, _Mapping]]] = ..., counters: _Optional[_Iterable[_Union[CounterReading, _Mapping]]] = ..., agent: _Optional[_Union[AgentStats, _Mapping]] = ..., assignment_generation: _Optional[int] = ..., class_windows: _Optional[_Iterable[_Union[ProbeWindow, _Mapping]]] = ..., class_paths: _Optional[_Iterable[_Union[ClassPath, _Mapping]]] = ..., rail_windows: _Optional[_Iterable[_Union[ProbeWindow, _Mapping]]] = ..., qps: _Optional[_Union[QpList, _Mapping]] = ...) -> None: ...

class LiveQp(_message.Message):
    __slots__ = ("device", "lqpn", "rqpn", "type", "state", "sq_psn", "rq_psn", "pid", "comm", "sport", "own", "rail")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    LQPN_FIELD_NUMBER: _ClassVar[int]
    RQPN_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SQ_PSN_FIELD_NUMBER: _ClassVar[int]
    RQ_PSN_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    SPORT_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    device: str
    lqpn: int
    rqpn: int
    type: str
    state: str
    sq_psn: int
    rq_psn: int
    pid: int
    comm: str
    sport: int
    own: bool
    rail: int
    def __init__(self, device: _Optional[str] = ..., lqpn: _Optional[int] = ..., rqpn: _Optional[int] = ..., type: _Optional[str] = ..., state: _Optional[str] = ..., sq_psn: _Optional[int] = ..., rq_psn: _Optional[int] = ..., pid: _Optional[int] = ..., comm: _Optional[str] = ..., sport: _Optional[int] = ..., own: _Optional[bool] = ..., rail: _Optional[int] = ...) -> None: ...

class QpList(_message.Message):
    __slots__ = ("qps", "error", "dropped")
    QPS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    qps: _containers.RepeatedCompositeFieldContainer[LiveQp]
    error: str
    dropped: int
    def __init__(self, qps: _Optional[_Iterable[_Union[LiveQp, _Mapping]]] = ..., error: _Optional[str] = ..., dropped: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("epoch", "seq", "duplicate", "assignment_generation", "retrace")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_GENERATION_FIELD_NUMBER: _ClassVar[int]
    RETRACE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    seq: int
    duplicate: bool
    assignment_generation: int
    retrace: _containers.RepeatedCompositeFieldContainer[Retrace]
    def __init__(self, epoch: _Optional[int] = ..., seq: _Optional[int] = ..., duplicate: _Optional[bool] = ..., assignment_generation: _Optional[int] = ..., retrace: _Optional[_Iterable[_Union[Retrace, _Mapping]]] = ...) -> None: ...

class WhyRequest(_message.Message):
    __slots__ = ("slowest", "window_s", "by")
    SLOWEST_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    slowest: int
    window_s: float
    by: str
    def __init__(self, slowest: _Optional[int] = ..., window_s: _Optional[float] = ..., by: _Optional[str] = ...) -> None: ...

class SlowRequest(_message.Message):
    __slots__ = ("request_id", "src", "dst", "transport", "queue_s", "prefill_s", "kv_transfer_s", "decode_s", "detokenize_s", "deliver_s", "ttft_s", "itl_s", "e2e_s", "fabric_share_ttft", "fabric_share_e2e", "rtt_min_s", "rtt_p50_s", "rtt_p99_s", "loss_ratio", "output_tokens", "kv_bytes", "fabric_windows", "counter_rates", "path_reason", "engine", "kv_source", "host_delay_s", "host_bound", "kv_wait_s", "fabric_s", "transfer_stack_s", "engine_wait_s", "over_explained_s", "kv_share_ttft", "kv_share_e2e", "fabric_source", "transfer_stack_source", "kv_bytes_source", "start_unix_ns", "end_unix_ns")
    class CounterRatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    DETOKENIZE_S_FIELD_NUMBER: _ClassVar[int]
    DELIVER_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    ITL_S_FIELD_NUMBER: _ClassVar[int]
    E2E_S_FIELD_NUMBER: _ClassVar[int]
    FABRIC_SHARE_TTFT_FIELD_NUMBER: _ClassVar[int]
    FABRIC_SHARE_E2E_FIELD_NUMBER: _ClassVar[int]
    RTT_MIN_S_FIELD_NUMBER: _ClassVar[int]
    RTT_P50_S_FIELD_NUMBER: _ClassVar[int]
    RTT_P99_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_RATIO_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    FABRIC_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    COUNTER_RATES_FIELD_NUMBER: _ClassVar[int]
    PATH_REASON_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    KV_SOURCE_FIELD_NUMBER: _ClassVar[int]
    HOST_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    HOST_BOUND_FIELD_NUMBER: _ClassVar[int]
    KV_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    FABRIC_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_STACK_S_FIELD_NUMBER: _ClassVar[int]
    ENGINE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    OVER_EXPLAINED_S_FIELD_NUMBER: _ClassVar[int]
    KV_SHARE_TTFT_FIELD_NUMBER: _ClassVar[int]
    KV_SHARE_E2E_FIELD_NUMBER: _ClassVar[int]
    FABRIC_SOURCE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_STACK_SOURCE_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_SOURCE_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    src: str
    dst: str
    transport: str
    queue_s: float
    prefill_s: float
    kv_transfer_s: float
    decode_s: float
    detokenize_s: float
    deliver_s: float
    ttft_s: float
    itl_s: float
    e2e_s: float
    fabric_share_ttft: float
    fabric_share_e2e: float
    rtt_min_s: float
    rtt_p50_s: float
    rtt_p99_s: float
    loss_ratio: float
    output_tokens: int
    kv_bytes: int
    fabric_windows: int
    counter_rates: _containers.ScalarMap[str, float]
    path_reason: str
    engine: str
    kv_source: str
    host_delay_s: float
    host_bound: bool
    kv_wait_s: float
    fabric_s: float
    transfer_stack_s: float
    engine_wait_s: float
    over_explained_s: float
    kv_share_ttft: float
    kv_share_e2e: float
    fabric_source: str
    transfer_stack_source: str
    kv_bytes_source: str
    start_unix_ns: int
    end_unix_ns: int
    def __init__(self, request_id: _Optional[str] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., transport: _Optional[str] = ..., queue_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., kv_transfer_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., detokenize_s: _Optional[float] = ..., deliver_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., itl_s: _Optional[float] = ..., e2e_s: _Optional[float] = ..., fabric_share_ttft: _Optional[float] = ..., fabric_share_e2e: _Optional[float] = ..., rtt_min_s: _Optional[float] = ..., rtt_p50_s: _Optional[float] = ..., rtt_p99_s: _Optional[float] = ..., loss_ratio: _Optional[float] = ..., output_tokens: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., fabric_windows: _Optional[int] = ..., counter_rates: _Optional[_Mapping[str, float]] = ..., path_reason: _Optional[str] = ..., engine: _Optional[str] = ..., kv_source: _Optional[str] = ..., host_delay_s: _Optional[float] = ..., host_bound: _Optional[bool] = ..., kv_wait_s: _Optional[float] = ..., fabric_s: _Optional[float] = ..., transfer_stack_s: _Optional[float] = ..., engine_wait_s: _Optional[float] = ..., over_explained_s: _Optional[float] = ..., kv_share_ttft: _Optional[float] = ..., kv_share_e2e: _Optional[float] = ..., fabric_source: _Optional[str] = ..., transfer_stack_source: _Optional[str] = ..., kv_bytes_source: _Optional[str] = ..., start_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ...) -> None: ...

class PathRank(_message.Message):
    __slots__ = ("rank", "src", "dst", "transport", "transfers", "kv_median_s", "kv_ratio", "rtt_min_s", "rtt_p50_s", "rtt_p99_s", "rtt_ratio", "congestion_per_s", "explained_s", "fabric_bound", "host_bound", "host_delay_s", "fabric_fault")
    RANK_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    KV_MEDIAN_S_FIELD_NUMBER: _ClassVar[int]
    KV_RATIO_FIELD_NUMBER: _ClassVar[int]
    RTT_MIN_S_FIELD_NUMBER: _ClassVar[int]
    RTT_P50_S_FIELD_NUMBER: _ClassVar[int]
    RTT_P99_S_FIELD_NUMBER: _ClassVar[int]
    RTT_RATIO_FIELD_NUMBER: _ClassVar[int]
    CONGESTION_PER_S_FIELD_NUMBER: _ClassVar[int]
    EXPLAINED_S_FIELD_NUMBER: _ClassVar[int]
    FABRIC_BOUND_FIELD_NUMBER: _ClassVar[int]
    HOST_BOUND_FIELD_NUMBER: _ClassVar[int]
    HOST_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    FABRIC_FAULT_FIELD_NUMBER: _ClassVar[int]
    rank: int
    src: str
    dst: str
    transport: str
    transfers: int
    kv_median_s: float
    kv_ratio: float
    rtt_min_s: float
    rtt_p50_s: float
    rtt_p99_s: float
    rtt_ratio: float
    congestion_per_s: float
    explained_s: float
    fabric_bound: bool
    host_bound: bool
    host_delay_s: float
    fabric_fault: bool
    def __init__(self, rank: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., transport: _Optional[str] = ..., transfers: _Optional[int] = ..., kv_median_s: _Optional[float] = ..., kv_ratio: _Optional[float] = ..., rtt_min_s: _Optional[float] = ..., rtt_p50_s: _Optional[float] = ..., rtt_p99_s: _Optional[float] = ..., rtt_ratio: _Optional[float] = ..., congestion_per_s: _Optional[float] = ..., explained_s: _Optional[float] = ..., fabric_bound: _Optional[bool] = ..., host_bound: _Optional[bool] = ..., host_delay_s: _Optional[float] = ..., fabric_fault: _Optional[bool] = ...) -> None: ...

class Goodput(_message.Message):
    __slots__ = ("requests", "met", "tokens", "goodput_tps", "throughput_tps")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_TPS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_TPS_FIELD_NUMBER: _ClassVar[int]
    requests: int
    met: int
    tokens: float
    goodput_tps: float
    throughput_tps: float
    def __init__(self, requests: _Optional[int] = ..., met: _Optional[int] = ..., tokens: _Optional[float] = ..., goodput_tps: _Optional[float] = ..., throughput_tps: _Optional[float] = ...) -> None: ...

class WhyReply(_message.Message):
    __slots__ = ("now_ns", "slowest", "paths", "communication_bound", "goodput", "stages", "empty_reason", "rtt", "rails")
    NOW_NS_FIELD_NUMBER: _ClassVar[int]
    SLOWEST_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATION_BOUND_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    EMPTY_REASON_FIELD_NUMBER: _ClassVar[int]
    RTT_FIELD_NUMBER: _ClassVar[int]
    RAILS_FIELD_NUMBER: _ClassVar[int]
    now_ns: int
    slowest: _containers.RepeatedCompositeFieldContainer[SlowRequest]
    paths: _containers.RepeatedCompositeFieldContainer[PathRank]
    communication_bound: bool
    goodput: Goodput
    stages: int
    empty_reason: str
    rtt: _containers.RepeatedCompositeFieldContainer[PathRtt]
    rails: _containers.RepeatedCompositeFieldContainer[RailPath]
    def __init__(self, now_ns: _Optional[int] = ..., slowest: _Optional[_Iterable[_Union[SlowRequest, _Mapping]]] = ..., paths: _Optional[_Iterable[_Union[PathRank, _Mapping]]] = ..., communication_bound: _Optional[bool] = ..., goodput: _Optional[_Union[Goodput, _Mapping]] = ..., stages: _Optional[int] = ..., empty_reason: _Optional[str] = ..., rtt: _Optional[_Iterable[_Union[PathRtt, _Mapping]]] = ..., rails: _Optional[_Iterable[_Union[RailPath, _Mapping]]] = ...) -> None: ...

class RailPath(_message.Message):
    __slots__ = ("src", "dst", "rail", "transport", "op", "size", "rtt_p50_s", "rtt_p99_s", "loss", "newest_unix_ns", "stands_out")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    RTT_P50_S_FIELD_NUMBER: _ClassVar[int]
    RTT_P99_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    NEWEST_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    STANDS_OUT_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    rail: int
    transport: str
    op: str
    size: int
    rtt_p50_s: float
    rtt_p99_s: float
    loss: float
    newest_unix_ns: int
    stands_out: bool
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., rail: _Optional[int] = ..., transport: _Optional[str] = ..., op: _Optional[str] = ..., size: _Optional[int] = ..., rtt_p50_s: _Optional[float] = ..., rtt_p99_s: _Optional[float] = ..., loss: _Optional[float] = ..., newest_unix_ns: _Optional[int] = ..., stands_out: _Optional[bool] = ...) -> None: ...

class CheckVerdict(_message.Message):
    __slots__ = ("check", "device", "port", "netdev", "status", "value", "message")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    check: str
    device: str
    port: int
    netdev: str
    status: str
    value: str
    message: str
    def __init__(self, check: _Optional[str] = ..., device: _Optional[str] = ..., port: _Optional[int] = ..., netdev: _Optional[str] = ..., status: _Optional[str] = ..., value: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class CheckReport(_message.Message):
    __slots__ = ("host", "taken_unix_ns", "checks", "policy", "took_s")
    HOST_FIELD_NUMBER: _ClassVar[int]
    TAKEN_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TOOK_S_FIELD_NUMBER: _ClassVar[int]
    host: str
    taken_unix_ns: int
    checks: _containers.RepeatedCompositeFieldContainer[CheckVerdict]
    policy: str
    took_s: float
    def __init__(self, host: _Optional[str] = ..., taken_unix_ns: _Optional[int] = ..., checks: _Optional[_Iterable[_Union[CheckVerdict, _Mapping]]] = ..., policy: _Optional[str] = ..., took_s: _Optional[float] = ...) -> None: ...

class CheckAck(_message.Message):
    __slots__ = ("kept",)
    KEPT_FIELD_NUMBER: _ClassVar[int]
    kept: int
    def __init__(self, kept: _Optional[int] = ...) -> None: ...

class DriftRequest(_message.Message):
    __slots__ = ("host", "include_waived")
    HOST_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_WAIVED_FIELD_NUMBER: _ClassVar[int]
    host: str
    include_waived: bool
    def __init__(self, host: _Optional[str] = ..., include_waived: _Optional[bool] = ...) -> None: ...

class DriftRow(_message.Message):
    __slots__ = ("host", "group_by", "group", "check", "value", "peers_value", "peers_agree", "group_size", "ports", "waived", "waiver")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    PEERS_VALUE_FIELD_NUMBER: _ClassVar[int]
    PEERS_AGREE_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    WAIVED_FIELD_NUMBER: _ClassVar[int]
    WAIVER_FIELD_NUMBER: _ClassVar[int]
    host: str
    group_by: str
    group: str
    check: str
    value: str
    peers_value: str
    peers_agree: int
    group_size: int
    ports: str
    waived: bool
    waiver: str
    def __init__(self, host: _Optional[str] = ..., group_by: _Optional[str] = ..., group: _Optional[str] = ..., check: _Optional[str] = ..., value: _Optional[str] = ..., peers_value: _Optional[str] = ..., peers_agree: _Optional[int] = ..., group_size: _Optional[int] = ..., ports: _Optional[str] = ..., waived: _Optional[bool] = ..., waiver: _Optional[str] = ...) -> None: ...

class HostChecks(_message.Message):
    __slots__ = ("host", "topology", "role", "taken_unix_ns", "by_status", "failing")
    class ByStatusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    HOST_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TAKEN_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    BY_STATUS_FIELD_NUMBER: _ClassVar[int]
    FAILING_FIELD_NUMBER: _ClassVar[int]
    host: str
    topology: str
    role: str
    taken_unix_ns: int
    by_status: _containers.ScalarMap[str, int]
    failing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host: _Optional[str] = ..., topology: _Optional[str] = ..., role: _Optional[str] = ..., taken_unix_ns: _Optional[int] = ..., by_status: _Optional[_Mapping[str, int]] = ..., failing: _Optional[_Iterable[str]] = ...) -> None: ...

class DriftReply(_message.Message):
    __slots__ = ("drift", "hosts", "hosts_without_checks")
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_WITHOUT_CHECKS_FIELD_NUMBER: _ClassVar[int]
    drift: _containers.RepeatedCompositeFieldContainer[DriftRow]
    hosts: _containers.RepeatedCompositeFieldContainer[HostChecks]
    hosts_without_checks: int
    def __init__(self, drift: _Optional[_Iterable[_Union[DriftRow, _Mapping]]] = ..., hosts: _Optional[_Iterable[_Union[HostChecks, _Mapping]]] = ..., hosts_without_checks: _Optional[int] = ...) -> None: ...

class KvCostRequest(_message.Message):
    __slots__ = ("src", "dst", "bytes")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    bytes: int
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class KvCostReply(_message.Message):
    __slots__ = ("known", "reason", "p50_s", "p99_s", "rtt_p50_s", "rtt_p99_s", "bandwidth_bytes_per_s", "loss_ratio", "age_s", "transport", "rtts", "src", "dst", "bytes")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    P50_S_FIELD_NUMBER: _ClassVar[int]
    P99_S_FIELD_NUMBER: _ClassVar[int]
    RTT_P50_S_FIELD_NUMBER: _ClassVar[int]
    RTT_P99_S_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_RATIO_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    RTTS_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    known: bool
    reason: str
    p50_s: float
    p99_s: float
    rtt_p50_s: float
    rtt_p99_s: float
    bandwidth_bytes_per_s: float
    loss_ratio: float
    age_s: float
    transport: str
    rtts: int
    src: str
    dst: str
    bytes: int
    def __init__(self, known: _Optional[bool] = ..., reason: _Optional[str] = ..., p50_s: _Optional[float] = ..., p99_s: _Optional[float] = ..., rtt_p50_s: _Optional[float] = ..., rtt_p99_s: _Optional[float] = ..., bandwidth_bytes_per_s: _Optional[float] = ..., loss_ratio: _Optional[float] = ..., age_s: _Optional[float] = ..., transport: _Optional[str] = ..., rtts: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class LinksRequest(_message.Message):
    __slots__ = ("src", "dst", "from_unix_ns", "to_unix_ns", "spans")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    FROM_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    TO_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    from_unix_ns: int
    to_unix_ns: int
    spans: _containers.RepeatedCompositeFieldContainer[LinksSpan]
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., from_unix_ns: _Optional[int] = ..., to_unix_ns: _Optional[int] = ..., spans: _Optional[_Iterable[_Union[LinksSpan, _Mapping]]] = ...) -> None: ...

class LinksSpan(_message.Message):
    __slots__ = ("src", "dst", "from_unix_ns", "to_unix_ns")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    FROM_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    TO_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    from_unix_ns: int
    to_unix_ns: int
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., from_unix_ns: _Optional[int] = ..., to_unix_ns: _Optional[int] = ...) -> None: ...

class LinkVerdict(_message.Message):
    __slots__ = ("link", "rank", "suspect", "classes", "bad_classes", "rtt_rise_s", "loss", "rail")
    LINK_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SUSPECT_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    BAD_CLASSES_FIELD_NUMBER: _ClassVar[int]
    RTT_RISE_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    link: str
    rank: int
    suspect: bool
    classes: int
    bad_classes: int
    rtt_rise_s: float
    loss: float
    rail: int
    def __init__(self, link: _Optional[str] = ..., rank: _Optional[int] = ..., suspect: _Optional[bool] = ..., classes: _Optional[int] = ..., bad_classes: _Optional[int] = ..., rtt_rise_s: _Optional[float] = ..., loss: _Optional[float] = ..., rail: _Optional[int] = ...) -> None: ...

class ClassLinks(_message.Message):
    __slots__ = ("sport", "links", "rail")
    SPORT_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    sport: int
    links: _containers.RepeatedScalarFieldContainer[str]
    rail: int
    def __init__(self, sport: _Optional[int] = ..., links: _Optional[_Iterable[str]] = ..., rail: _Optional[int] = ...) -> None: ...

class LinksReply(_message.Message):
    __slots__ = ("configured", "links", "class_paths", "classes", "flows", "flows_reason", "spans", "links_left_out")
    CONFIGURED_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    CLASS_PATHS_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    FLOWS_FIELD_NUMBER: _ClassVar[int]
    FLOWS_REASON_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    LINKS_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    configured: bool
    links: _containers.RepeatedCompositeFieldContainer[LinkVerdict]
    class_paths: int
    classes: _containers.RepeatedCompositeFieldContainer[ClassLinks]
    flows: _containers.RepeatedCompositeFieldContainer[FlowLinks]
    flows_reason: str
    spans: _containers.RepeatedCompositeFieldContainer[SpanLinks]
    links_left_out: int
    def __init__(self, configured: _Optional[bool] = ..., links: _Optional[_Iterable[_Union[LinkVerdict, _Mapping]]] = ..., class_paths: _Optional[int] = ..., classes: _Optional[_Iterable[_Union[ClassLinks, _Mapping]]] = ..., flows: _Optional[_Iterable[_Union[FlowLinks, _Mapping]]] = ..., flows_reason: _Optional[str] = ..., spans: _Optional[_Iterable[_Union[SpanLinks, _Mapping]]] = ..., links_left_out: _Optional[int] = ...) -> None: ...

class SpanLinks(_message.Message):
    __slots__ = ("classes", "flows", "flows_reason")
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    FLOWS_FIELD_NUMBER: _ClassVar[int]
    FLOWS_REASON_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedCompositeFieldContainer[ClassLinks]
    flows: _containers.RepeatedCompositeFieldContainer[FlowLinks]
    flows_reason: str
    def __init__(self, classes: _Optional[_Iterable[_Union[ClassLinks, _Mapping]]] = ..., flows: _Optional[_Iterable[_Union[FlowLinks, _Mapping]]] = ..., flows_reason: _Optional[str] = ...) -> None: ...

class FlowLinks(_message.Message):
    __slots__ = ("sport", "links", "rail", "src_qpn", "dst_qpn", "src_comm", "dst_comm", "traced", "psn_gap")
    SPORT_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    SRC_QPN_FIELD_NUMBER: _ClassVar[int]
    DST_QPN_FIELD_NUMBER: _ClassVar[int]
    SRC_COMM_FIELD_NUMBER: _ClassVar[int]
    DST_COMM_FIELD_NUMBER: _ClassVar[int]
    TRACED_FIELD_NUMBER: _ClassVar[int]
    PSN_GAP_FIELD_NUMBER: _ClassVar[int]
    sport: int
    links: _containers.RepeatedScalarFieldContainer[str]
    rail: int
    src_qpn: int
    dst_qpn: int
    src_comm: str
    dst_comm: str
    traced: bool
    psn_gap: int
    def __init__(self, sport: _Optional[int] = ..., links: _Optional[_Iterable[str]] = ..., rail: _Optional[int] = ..., src_qpn: _Optional[int] = ..., dst_qpn: _Optional[int] = ..., src_comm: _Optional[str] = ..., dst_comm: _Optional[str] = ..., traced: _Optional[bool] = ..., psn_gap: _Optional[int] = ...) -> None: ...

class RttRequest(_message.Message):
    __slots__ = ("max_paths", "cdf_paths", "max_buckets", "src", "dst")
    MAX_PATHS_FIELD_NUMBER: _ClassVar[int]
    CDF_PATHS_FIELD_NUMBER: _ClassVar[int]
    MAX_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    max_paths: int
    cdf_paths: int
    max_buckets: int
    src: str
    dst: str
    def __init__(self, max_paths: _Optional[int] = ..., cdf_paths: _Optional[int] = ..., max_buckets: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ...) -> None: ...

class PathRtt(_message.Message):
    __slots__ = ("src", "dst", "transport", "op", "size", "host_reference", "count", "lost", "min_s", "p50_s", "p90_s", "p99_s", "p999_s", "max_s", "mean_s", "since_unix_ns", "newest_unix_ns", "schema", "buckets", "counts", "zero_count")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    HOST_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    MIN_S_FIELD_NUMBER: _ClassVar[int]
    P50_S_FIELD_NUMBER: _ClassVar[int]
    P90_S_FIELD_NUMBER: _ClassVar[int]
    P99_S_FIELD_NUMBER: _ClassVar[int]
    P999_S_FIELD_NUMBER: _ClassVar[int]
    MAX_S_FIELD_NUMBER: _ClassVar[int]
    MEAN_S_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NEWEST_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    ZERO_COUNT_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    transport: str
    op: str
    size: int
    host_reference: bool
    count: int
    lost: int
    min_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    p999_s: float
    max_s: float
    mean_s: float
    since_unix_ns: int
    newest_unix_ns: int
    schema: int
    buckets: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    zero_count: int
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., transport: _Optional[str] = ..., op: _Optional[str] = ..., size: _Optional[int] = ..., host_reference: _Optional[bool] = ..., count: _Optional[int] = ..., lost: _Optional[int] = ..., min_s: _Optional[float] = ..., p50_s: _Optional[float] = ..., p90_s: _Optional[float] = ..., p99_s: _Optional[float] = ..., p999_s: _Optional[float] = ..., max_s: _Optional[float] = ..., mean_s: _Optional[float] = ..., since_unix_ns: _Optional[int] = ..., newest_unix_ns: _Optional[int] = ..., schema: _Optional[int] = ..., buckets: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ..., zero_count: _Optional[int] = ...) -> None: ...

class RttReply(_message.Message):
    __slots__ = ("paths", "host_references", "paths_total", "host_references_total", "now_ns")
    PATHS_FIELD_NUMBER: _ClassVar[int]
    HOST_REFERENCES_FIELD_NUMBER: _ClassVar[int]
    PATHS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HOST_REFERENCES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NOW_NS_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedCompositeFieldContainer[PathRtt]
    host_references: _containers.RepeatedCompositeFieldContainer[PathRtt]
    paths_total: int
    host_references_total: int
    now_ns: int
    def __init__(self, paths: _Optional[_Iterable[_Union[PathRtt, _Mapping]]] = ..., host_references: _Optional[_Iterable[_Union[PathRtt, _Mapping]]] = ..., paths_total: _Optional[int] = ..., host_references_total: _Optional[int] = ..., now_ns: _Optional[int] = ...) -> None: ...
