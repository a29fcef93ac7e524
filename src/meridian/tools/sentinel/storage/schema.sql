-- meridian sentinel: the four tables of docs/requirements/sentinel.md (§4.1) and the
-- names of flows and functions they refer to, applied at every start
-- (CREATE ... IF NOT EXISTS, so applying it again changes nothing), and at the end that
-- page's column names where ours differ (ALIAS columns, added where missing).
--
-- One schema for both stores: it is accepted by ClickHouse 18.16 (Debian's
-- clickhouse-server) and by chDB 4.x (ClickHouse 26.x); it uses nothing newer than
-- 18.16 has (no DateTime64, LowCardinality, TTL, CODEC), so it needs no per-version
-- variant. The one exception is added by the store where the server has it (19.6 and
-- later): ms_flow_rollup and ms_raw_samples get `TTL ts + toIntervalDay(N)` from
-- clickhouse.retention_days (14; 0: none), in the CREATE and, for a table made
-- before or with another N, by ALTER TABLE ... MODIFY TTL at start (schema.py).
--
-- Common columns:
--   run_id    the agent run that wrote the row: function, call-stack and data-object
--             ids are interned per run, so a rollup joins its stack on
--             (run_id, callstack_id)
--   host      the agent's host name
--   batch_id  the insert batch: after an insert whose outcome is unknown (the
--             connection broke after the rows were sent), the agent looks for this id
--             before sending again, so every row is stored exactly once
-- Times are wall-clock nanoseconds since the epoch; `ts` (seconds) is derived on insert
-- and is what the sorting and partition keys use: filter on `ts` for a time range.
-- Partitions are days, so the TTL drops whole parts, and on a server without TTL old
-- data is dropped with
--   ALTER TABLE ms_raw_samples DROP PARTITION 20261123

-- Windowed rollups: the aggregation key, samples and
-- norm_cost = samples * sample_scale / gso_segs (summed per sample).
-- Sorted by (5-minute slot, flow, bucket): "top flows by cost from T1 to T2" reads only
-- the slots of the range; "one flow's functions and stacks" reads only that flow's
-- granules within each slot.
CREATE TABLE IF NOT EXISTS ms_flow_rollup
(
    ts DateTime MATERIALIZED toDateTime(intDiv(time_bucket, 1000000000)),
    time_bucket UInt64,
    flow_id UInt64,
    function_id UInt64,
    callstack_id UInt64,
    data_object_id UInt64,
    event UInt16,
    numa_node UInt32,
    direction UInt8,
    interference_class UInt8,
    samples UInt64,
    norm_cost Float64,
    pid UInt32,
    run_id UInt64,
    host String,
    batch_id UInt64
)
ENGINE = MergeTree()
PARTITION BY toYYYYMMDD(ts)
ORDER BY (toStartOfFiveMinute(ts), flow_id, time_bucket, event, function_id, callstack_id);

-- Raw samples with their branch stacks (LBR) and norm_cost, for replay and for
-- symbolizing again offline. time_ns is wall clock, ktime_ns the kernel's monotonic
-- time the sample carried; callstack_id joins ms_callstacks when the agent knew it.
CREATE TABLE IF NOT EXISTS ms_raw_samples
(
    ts DateTime MATERIALIZED toDateTime(intDiv(time_ns, 1000000000)),
    time_ns UInt64,
    ktime_ns UInt64,
    flow_id UInt64,
    flow_source UInt8,
    cpu UInt32,
    pid UInt32,
    tid UInt32,
    cgroup_id UInt64,
    ifindex UInt32,
    ip UInt64,
    data_addr UInt64,
    user_stack_id Int32,
    kernel_stack_id Int32,
    callstack_id UInt64,
    event UInt16,
    raw_code UInt32,
    numa_node UInt32,
    direction UInt8,
    gso_segs UInt16,
    norm_cost Float64,
    lbr_from Array(UInt64),
    lbr_to Array(UInt64),
    run_id UInt64,
    host String,
    batch_id UInt64
)
ENGINE = MergeTree()
PARTITION BY toYYYYMMDD(ts)
ORDER BY (toStartOfFiveMinute(ts), flow_id, time_ns);

-- Call stacks: stack_id -> frames, innermost first (functions[1] is the function the
-- sample was in); one array per frame field.
CREATE TABLE IF NOT EXISTS ms_callstacks
(
    run_id UInt64,
    stack_id UInt64,
    binaries Array(String),
    functions Array(String),
    files Array(String),
    lines Array(UInt32),
    offsets Array(UInt64),
    addrs Array(UInt64),
    seen_ns UInt64,
    host String,
    batch_id UInt64
)
ENGINE = MergeTree()
ORDER BY (run_id, stack_id);

-- Data objects registered through /api/v1/symbols/data: [address, address + size).
CREATE TABLE IF NOT EXISTS ms_data_objects
(
    run_id UInt64, object_id UInt64, pid UInt32, address UInt64, size UInt64,
    name String, type String, seen_ns UInt64, host String, batch_id UInt64
)
ENGINE = MergeTree()
ORDER BY (run_id, object_id);

-- Flow names: flow_id -> the 5-tuple the kernel keyed it by, written once per run the
-- first time a stored rollup names the flow (queries show flows as addresses).
CREATE TABLE IF NOT EXISTS ms_flows
(
    run_id UInt64, flow_id UInt64,
    src String, dst String, sport UInt16, dport UInt16, proto String,
    seen_ns UInt64, host String, batch_id UInt64
)
ENGINE = MergeTree()
ORDER BY (flow_id, run_id);

-- Function names: function_id (interned per run) -> binary and symbol, written once
-- per run the first time a stored rollup names the function.
CREATE TABLE IF NOT EXISTS ms_functions
(
    run_id UInt64, function_id UInt64, binary String, function String,
    seen_ns UInt64, host String, batch_id UInt64
)
ENGINE = MergeTree()
ORDER BY (run_id, function_id);

-- The names of docs/requirements/sentinel.md ("Names kept from the document") beside
-- ours, so that SQL written with them runs as it is: ALIAS columns, computed when read
-- and stored nowhere (SELECT * leaves them out, inserts never name them). A writer adds the ones a table lacks at every start, after the
-- CREATEs: so a store made by an older version gets them too (ClickHouse 18.16 has no
-- ADD COLUMN IF NOT EXISTS: only the missing ones are added). A reader adds nothing,
-- and a store without them still works by our names. No Array(Tuple(...)) alias:
-- 18.16 stores such a column as nested columns and cannot read it back after a
-- restart, so `lbr` is a list of [from, to] pairs.
-- ms_flow_rollup: the document's AggregationKey (docs/requirements/sentinel.md §3.4)
ALTER TABLE ms_flow_rollup ADD COLUMN function_hash UInt64 ALIAS function_id;
ALTER TABLE ms_flow_rollup ADD COLUMN pmu_event UInt16 ALIAS event;
ALTER TABLE ms_flow_rollup ADD COLUMN bucket UInt64 ALIAS time_bucket;
-- ms_raw_samples: the document's ms_sample fields (docs/requirements/sentinel.md
-- §2.1), tsc is the sample's kernel time in ns (ktime_ns), as the document's perf sample time is
ALTER TABLE ms_raw_samples ADD COLUMN pmu_event UInt16 ALIAS event;
ALTER TABLE ms_raw_samples ADD COLUMN tsc UInt64 ALIAS ktime_ns;
ALTER TABLE ms_raw_samples ADD COLUMN lbr Array(Array(UInt64)) ALIAS arrayMap((f, t) -> [f, t], lbr_from, lbr_to);
-- ms_callstacks: the document's frame fields (docs/requirements/sentinel.md §4.1), one
-- array each, innermost first
ALTER TABLE ms_callstacks ADD COLUMN binary Array(String) ALIAS binaries;
ALTER TABLE ms_callstacks ADD COLUMN function Array(String) ALIAS functions;
ALTER TABLE ms_callstacks ADD COLUMN file Array(String) ALIAS files;
ALTER TABLE ms_callstacks ADD COLUMN line Array(UInt32) ALIAS lines;
-- ms_data_objects has the document's names already (pid, address, name, type, size).
