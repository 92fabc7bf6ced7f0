// lanebus — MIT License.
// The lanebus tool's subcommands: one function per command, dispatched by tools/lanebus.cpp.
// Each gets argv starting at the command name and returns the process exit code
// (0 success, 1 failure, 2 usage error).
#pragma once

namespace lanebus::tool {

/// `lanebus bridge DIR --nats URL --out TOPIC=SUBJECT[@STREAM]... --in STREAM:CONSUMER=TOPIC...`:
/// mirror durable topics to and from NATS JetStream (built when libnats is found).
int cmd_bridge(int argc, char** argv);

/// `lanebus dlq list|show|replay|archive|purge|audit|stats DIR ...`: review the dead-letter queue.
int cmd_dlq(int argc, char** argv);

/// `lanebus leases PATH`: list the leases of a lease table segment.
int cmd_leases(int argc, char** argv);

/// `lanebus namespace move SRC_DIR DST_DIR NAMESPACE`: move a namespace to
/// another store, offline and resumable (doc/tenancy.md "Moving a namespace").
int cmd_namespace(int argc, char** argv);

/// `lanebus resume DIR TOPIC [GROUP]`: end a durable group's outage pause (doc/retries.md).
int cmd_resume(int argc, char** argv);

/// `lanebus schema list|show|diff|check|register|deprecate|usage|remove|audit DIR ...`:
/// the schema registry of a store (issue 12, doc/schemas.md).
int cmd_schema(int argc, char** argv);

/// `lanebus serve DIR [--listen HOST:PORT] [--sla SECONDS]`: serve a store's metrics over HTTP.
int cmd_serve(int argc, char** argv);

/// `lanebus stat DIR`: topics, lanes, offsets, groups and lag of a durable store.
int cmd_stat(int argc, char** argv);

/// `lanebus stats DIR [--json|--prom] [--watch SECONDS] [--sla SECONDS]`: lag, oldest
/// unprocessed age, rates and drain time of a live durable store.
int cmd_stats(int argc, char** argv);

/// `lanebus tail DIR TOPIC [--from ...] [--lane N] [--count N]`: print stored messages.
int cmd_tail(int argc, char** argv);

/// `lanebus usage DIR [--since T] [--until T] [--json]`: per-namespace usage by minute.
int cmd_usage(int argc, char** argv);

/// `lanebus verify DIR [--quiet] [--progress N]`: walk every page and record; exit 1 on damage.
int cmd_verify(int argc, char** argv);

}  // namespace lanebus::tool
