/* lanebus — MIT License.
 * The C API: a small C11 surface over the C++ library for C programs and for
 * other languages' foreign-function interfaces (Python ctypes, Rust, Go).
 * Opaque handles, plain structs the library fills in, and error codes that
 * mirror lanebus::Code one for one (include/lanebus/status.hpp).
 *
 * Errors. Every call that can fail returns a lanebus_code (LANEBUS_OK = 0) and
 * takes, as its last parameter, an optional `lanebus_error*` (NULL: no
 * message wanted). On failure the library writes the code and a
 * NUL-terminated message naming the cause into it (truncated to fit); on
 * success it sets code LANEBUS_OK and an empty message. The error lives in
 * the caller's memory, so it works on any thread and from runtimes that move
 * a call between OS threads (Go's cgo), and nothing needs to be freed. There
 * is no thread-local "last error".
 *
 * Lifetimes. lanebus_open returns a bus; lanebus_close frees it together with
 * every topic and subscription handle it gave out. Topic handles are owned by
 * the bus (never freed by the caller). A subscription handle is freed by
 * lanebus_unsubscribe or by lanebus_close. Memory returned to the caller
 * (stats JSON, DLQ lists) is freed with the matching lanebus_*_free call.
 *
 * Thread safety: every function is thread-safe unless its comment says
 * otherwise; a handler runs on a bus worker thread.
 *
 * Never crashes on bad input: a NULL handle, an empty payload, a bad name or an
 * unknown topic is LANEBUS_INVALID_ARGUMENT, LANEBUS_INVALID_NAME or
 * LANEBUS_NOT_FOUND with a message. (A handle that was already freed cannot be
 * detected: that is the caller's bug, as with free().) */
#ifndef LANEBUS_LANEBUS_H
#define LANEBUS_LANEBUS_H

#include <stddef.h>
#include <stdint.h>

#if defined(LANEBUS_STATIC_BUILD) || !defined(__GNUC__)
#define LANEBUS_C_API
#else
#define LANEBUS_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- errors */

/** The closed list of error codes: the same names, order and values as
 *  lanebus::Code (status.hpp documents each). */
typedef enum lanebus_code {
  LANEBUS_OK = 0,
  LANEBUS_INVALID_ARGUMENT = 1, /**< NULL handle, empty payload, out-of-range option. */
  LANEBUS_INVALID_NAME = 2,     /**< A topic, queue or group name breaks the naming rule. */
  LANEBUS_PAYLOAD_TOO_LARGE = 3,
  LANEBUS_CONFLICT = 4,         /**< The name exists with other settings (queue vs topic, lanes). */
  LANEBUS_WOULD_BLOCK = 5,
  LANEBUS_TIMED_OUT = 6,
  LANEBUS_QUOTA_EXCEEDED = 7,
  LANEBUS_SHUT_DOWN = 8,
  LANEBUS_NOT_FOUND = 9,        /**< No topic, queue or DLQ entry by that name or id. */
  LANEBUS_BUSY = 10,            /**< E.g. unsubscribe or close from inside a handler. */
  LANEBUS_MAP_FULL = 11,
  LANEBUS_DISK_FULL = 12,
  LANEBUS_PERMISSION_DENIED = 13,
  LANEBUS_CORRUPTION = 14,
  LANEBUS_VERSION_TOO_NEW = 15,
  LANEBUS_IO_ERROR = 16,
  LANEBUS_STALE_TOKEN = 17,
  LANEBUS_FENCE_VIOLATION = 18,
  LANEBUS_INCOMPATIBLE = 19,
  LANEBUS_SCHEMA_VIOLATION = 20,
  LANEBUS_INTERNAL = 21         /**< A lanebus bug or out of memory; the message says which. */
} lanebus_code;

/** Where a failing call writes its code and message. Caller-owned; may live on
 *  the stack. */
typedef struct lanebus_error {
  lanebus_code code;
  char message[512]; /**< NUL-terminated; "" on success. */
} lanebus_error;

/** The code's name as in C++ ("OK", "WouldBlock", "NotFound", ...). Never NULL;
 *  unknown values give "Unknown". */
LANEBUS_C_API const char* lanebus_code_name(lanebus_code code);

/** The library's version, e.g. "0.1.0" (LANEBUS_VERSION_STRING of the build).
 *  Compare it with the header you compiled against to detect a mismatch. */
LANEBUS_C_API const char* lanebus_version(void);

/* ---------------------------------------------------------------- bus */

typedef struct lanebus_bus lanebus_bus;
typedef struct lanebus_topic lanebus_topic;
typedef struct lanebus_subscription lanebus_subscription;

/** Open a bus and start its workers.
 *  - name: the bus's name in stats and metrics; NULL or "" gives "bus".
 *  - store_directory: NULL or "" for an in-memory bus (no durable topics, no
 *    DLQ); else the LMDB directory of its durable store (created, mode 0700,
 *    if missing; parents must exist), opened in Sync durability.
 *  - workers: handler threads; 0 = one per hardware thread.
 *  Errors: INVALID_ARGUMENT (bus NULL), BUSY (the directory is already open in
 *  this process), the storage codes (PERMISSION_DENIED, CORRUPTION,
 *  VERSION_TOO_NEW, IO_ERROR, ...) with the path in the message, INTERNAL.
 *  On success *bus is set; free it with lanebus_close. */
LANEBUS_C_API lanebus_code lanebus_open(const char* name, const char* store_directory, uint32_t workers,
                                        lanebus_bus** bus, lanebus_error* error);

/** Severity of a log line (lanebus::LogLevel, include/lanebus/log.hpp). */
typedef enum lanebus_log_level {
  LANEBUS_LOG_DEBUG = 0,
  LANEBUS_LOG_INFO = 1,
  LANEBUS_LOG_WARN = 2,
  LANEBUS_LOG_ERROR = 3
} lanebus_log_level;

/** The log callback: one NUL-terminated line (`length` bytes, no newline),
 *  valid only during the call. Called only on rare events an operator needs
 *  (a store that fails to commit or sync, a stuck handler, a claim of a dead
 *  process taken over, DLQ and quota refusals), never per message, on a bus
 *  thread (the store's writer, the watchdog, ...), possibly on several at
 *  once: it must be thread-safe, return quickly and not call any lanebus_*
 *  function. doc/observability.md "Log hook" lists the events and rates. */
typedef void (*lanebus_log_fn)(lanebus_log_level level, const char* message, size_t length, void* user_data);

/** lanebus_open with a log callback (NULL: silent, the same as lanebus_open).
 *  `log` and `log_user_data` must stay valid until lanebus_close returns.
 *  Errors: as lanebus_open. */
LANEBUS_C_API lanebus_code lanebus_open_logged(const char* name, const char* store_directory, uint32_t workers,
                                               lanebus_log_fn log, void* log_user_data, lanebus_bus** bus,
                                               lanebus_error* error);

/** Shut the bus down (drain: queued messages are handled for up to 5 s, then
 *  abandoned), close every subscription still open, and free the bus with
 *  every topic and subscription handle it gave out. NULL is OK (does nothing).
 *  Blocks until the workers have stopped.
 *  Errors: TIMED_OUT (the drain did not finish; the bus is freed anyway),
 *  BUSY (called from a handler: nothing is freed; call it from another thread). */
LANEBUS_C_API lanebus_code lanebus_close(lanebus_bus* bus, lanebus_error* error);

/* ---------------------------------------------------------------- topics and queues */

/** Flags of lanebus_create_topic / lanebus_create_queue. */
enum {
  /** Store messages in the bus's LMDB store before publish returns
   *  (at-least-once across crashes). REQUIRES: a bus opened with a store. */
  LANEBUS_DURABLE = 1
};

/** Create a topic (fan-out: every group receives every message), or return
 *  the existing one created with the same kind and lane count.
 *  - lanes: ordered sub-streams (lane = hash(key) % lanes); 0 = 8.
 *  - flags: 0 (in memory) or LANEBUS_DURABLE.
 *  *topic is owned by the bus: valid until lanebus_close, never freed by the
 *  caller. Errors: INVALID_ARGUMENT (NULL argument, unknown flag, durable on a
 *  bus without a store, lanes > 4096), INVALID_NAME, CONFLICT (exists as a
 *  queue or with another lane count), BUSY (too many topics), SHUT_DOWN,
 *  storage codes. */
LANEBUS_C_API lanebus_code lanebus_create_topic(lanebus_bus* bus, const char* name, uint32_t lanes, uint32_t flags,
                                                lanebus_topic** topic, lanebus_error* error);

/** Create a queue (competing consumers: each message is handled by one of
 *  them). Same rules and errors as lanebus_create_topic. */
LANEBUS_C_API lanebus_code lanebus_create_queue(lanebus_bus* bus, const char* name, uint32_t lanes, uint32_t flags,
                                                lanebus_topic** queue, lanebus_error* error);

/** Look up a topic or queue created earlier on this bus (a durable one is
 *  known after its lanebus_create_* on this bus, not merely by being in the
 *  store). Returns the same handle as the create call. Errors:
 *  INVALID_ARGUMENT, INVALID_NAME, NOT_FOUND. */
LANEBUS_C_API lanebus_code lanebus_find(lanebus_bus* bus, const char* name, lanebus_topic** topic,
                                        lanebus_error* error);

/** Publish one message: the bytes are copied, so the buffers may be reused
 *  when the call returns. key may be NULL when key_len is 0 (lane 0).
 *  Blocks while the topic is full, up to 1 s (then TIMED_OUT); on a durable
 *  topic until the message is committed and fsynced.
 *  Errors: INVALID_ARGUMENT (NULL topic, NULL or empty payload, NULL key with
 *  key_len > 0), PAYLOAD_TOO_LARGE (over 1 MiB, or a key over 65535 bytes),
 *  TIMED_OUT, SHUT_DOWN, QUOTA_EXCEEDED, storage codes. */
LANEBUS_C_API lanebus_code lanebus_publish(lanebus_topic* topic, const void* key, size_t key_len, const void* payload,
                                           size_t payload_len, lanebus_error* error);

/** One message header (doc/tracing.md): a name and a value, both copied by
 *  publish. Names are 1-64 bytes of visible ASCII without ':'; values hold no
 *  CR, LF or NUL. A `traceparent` header carries W3C trace context. */
typedef struct lanebus_header {
  const char* name;
  size_t name_len;
  const char* value;
  size_t value_len;
} lanebus_header;

/** lanebus_publish with headers (headers may be NULL when header_count is 0).
 *  Called from inside a handler, a message without its own `traceparent`
 *  gets the handler message's trace context.
 *  Errors: as lanebus_publish, plus PAYLOAD_TOO_LARGE (more than 16 headers,
 *  more than 1024 bytes of names and values) and INVALID_ARGUMENT (a bad
 *  name or value, a name twice, a malformed traceparent, NULL headers with
 *  header_count > 0). */
LANEBUS_C_API lanebus_code lanebus_publish_headers(lanebus_topic* topic, const void* key, size_t key_len,
                                                   const void* payload, size_t payload_len,
                                                   const lanebus_header* headers, size_t header_count,
                                                   lanebus_error* error);

/** The times of one message (doc/delays.md). Zero-initialise it
 *  (`lanebus_publish_options o = {0};`) and set what you need; a field left 0
 *  means "none". All times are in nanoseconds. */
typedef struct lanebus_publish_options {
  /** Deliver no earlier than this long after publish (0 = at once). */
  int64_t delay_ns;
  /** Or deliver no earlier than this wall-clock time, ns since the Unix
   *  epoch (0 = none; a time in the past means now). At most one of
   *  delay_ns and deliver_at_ns. */
  int64_t deliver_at_ns;
  /** Expiry: a message whose handler has not started by publish + ttl_ns is
   *  never delivered (counted as "expired" in the stats). 0 = the topic's
   *  default TTL (none unless set from C++). */
  int64_t ttl_ns;
} lanebus_publish_options;

/** lanebus_publish with a due time and/or an expiry (options may be NULL:
 *  exactly lanebus_publish). The rules are lanebus::OutgoingMessage's
 *  (doc/delays.md): a delayed message enters its lane at its due time (its
 *  created_at_ns is the due time), in due-time order within its key, without
 *  holding back undelayed messages of its key. In memory it holds a slot of
 *  the topic while it waits (backpressure applies) and is lost with the bus;
 *  on a durable topic it is stored (fsynced) before the call returns and
 *  survives a crash and a power cut. Blocks as lanebus_publish does.
 *  Errors: those of lanebus_publish, and INVALID_ARGUMENT naming the value
 *  for a negative delay_ns or deliver_at_ns, both set, a due time after
 *  2200-01-01, a negative ttl_ns or one over 100 years, an expiry before the
 *  due time (the message names both), or a delay on a fenced topic. */
LANEBUS_C_API lanebus_code lanebus_publish_ex(lanebus_topic* topic, const void* key, size_t key_len,
                                              const void* payload, size_t payload_len,
                                              const lanebus_publish_options* options, lanebus_error* error);

/* ---------------------------------------------------------------- consuming */

/** What a handler returns. */
typedef enum lanebus_outcome {
  LANEBUS_ACK = 0,    /**< Done: the message is settled. */
  LANEBUS_RETRY = 1,  /**< Transient failure: deliver it again (same lane, at once); after
                           max_attempts calls it goes to the DLQ (class transient). */
  LANEBUS_REJECT = 2  /**< Permanent failure: to the DLQ (class permanent) at once, no retry. */
  /* The DLQ exists on a bus with a store; an in-memory bus counts such a
   * message in its stats ("failed" after the last retry, "rejected") and
   * drops it. */
} lanebus_outcome;

/** The message a handler receives. Every pointer is valid only until the
 *  handler returns: copy out what you keep. payload is never NULL; key is
 *  NULL when key_len is 0. */
typedef struct lanebus_message {
  const void* payload;
  size_t payload_len;
  const void* key;
  size_t key_len;
  uint64_t id;            /**< Unique per bus. */
  int64_t created_at_ns;  /**< Publish time, ns since the Unix epoch. */
  uint32_t attempt;       /**< 1 on the first delivery, 2 on the first retry, ... */
  uint32_t lane;
  uint64_t offset;        /**< Offset in the lane's log (durable); 0 in memory. */
  /** Out: the handler may point this at a NUL-terminated reason for RETRY or
   *  REJECT (kept in the DLQ entry; the first 95 bytes are copied when the
   *  handler returns). NULL: a default reason. */
  const char* reason;
  /** The message's headers in their stored form (doc/storage-format.md);
   *  read them with lanebus_message_header. NULL when it has none. */
  const void* headers;
  size_t headers_len;
} lanebus_message;

/** The number of headers of a message being handled. */
LANEBUS_C_API size_t lanebus_message_header_count(const lanebus_message* message);
/** Header `index` (0-based, in publish order) of a message being handled into
 *  *out (views into the message: valid until the handler returns; not
 *  NUL-terminated). Returns 0, or -1 when index is out of range. */
LANEBUS_C_API int lanebus_message_header(const lanebus_message* message, size_t index, lanebus_header* out);

/** A message handler. Runs on a bus worker thread with no lanebus lock held;
 *  at most one call at a time per lane and group. It may publish and read
 *  stats; it must not call lanebus_close (BUSY) and should not block long.
 *  Any value other than the three outcomes counts as LANEBUS_REJECT. */
typedef lanebus_outcome (*lanebus_handler)(lanebus_message* message, void* user_data);

/** Attach a consumer to consumer group `group` of a topic (the group is
 *  created on first use; several subscriptions to one group compete).
 *  - max_attempts: calls of the handler per message before a RETRY goes to
 *    the DLQ; 0 = 3. Retries are immediate (no backoff).
 *  - user_data: passed to every call; must stay valid until the subscription
 *    is freed.
 *  A durable topic's new group starts at the earliest retained message;
 *  an existing one resumes where it left off.
 *  Errors: INVALID_ARGUMENT (NULL argument, the topic is a queue: use
 *  lanebus_consume), INVALID_NAME (group), BUSY (too many groups or
 *  consumers), SHUT_DOWN. Free *subscription with lanebus_unsubscribe. */
LANEBUS_C_API lanebus_code lanebus_subscribe(lanebus_bus* bus, lanebus_topic* topic, const char* group,
                                             lanebus_handler handler, void* user_data, uint32_t max_attempts,
                                             lanebus_subscription** subscription, lanebus_error* error);

/** Attach a competing consumer to a queue. Same rules as lanebus_subscribe.
 *  Errors: INVALID_ARGUMENT (also: not a queue), BUSY, SHUT_DOWN. */
LANEBUS_C_API lanebus_code lanebus_consume(lanebus_bus* bus, lanebus_topic* queue, lanebus_handler handler,
                                           void* user_data, uint32_t max_attempts,
                                           lanebus_subscription** subscription, lanebus_error* error);

/** Detach the consumer and free the handle. Blocks until a running call of
 *  its handler returns; no call starts afterwards. NULL is OK.
 *  Errors: BUSY when called from inside this subscription's own handler (it is
 *  detached but not freed: call lanebus_unsubscribe again from another
 *  thread, or let lanebus_close free it). */
LANEBUS_C_API lanebus_code lanebus_unsubscribe(lanebus_subscription* subscription, lanebus_error* error);

/* ---------------------------------------------------------------- dead letters */

/** One dead-letter entry (doc/dlq.md). Strings are NUL-terminated; key and
 *  payload are bytes with lengths (payload also has a NUL after its bytes). */
typedef struct lanebus_dlq_entry {
  uint64_t id;
  const char* state;        /**< "pending", "replayed" or "archived". */
  const char* error_class;  /**< "transient", "permanent" or "poison". */
  const char* topic;
  const char* group;
  const char* reason;
  const void* key;
  size_t key_len;
  const void* payload;
  size_t payload_len;
  uint32_t attempts;
  uint32_t lane;
  uint64_t offset;
  int64_t dead_at_ns;
  /** The message's headers in their stored form (doc/storage-format.md);
   *  read them with lanebus_dlq_entry_header. NULL when it had none. A
   *  replay publishes them again (trace context included). */
  const void* headers;
  size_t headers_len;
} lanebus_dlq_entry;

/** The number of headers of a DLQ entry's message (0 for NULL). */
LANEBUS_C_API size_t lanebus_dlq_entry_header_count(const lanebus_dlq_entry* entry);
/** Header `index` (0-based, in publish order) of a DLQ entry's message into
 *  *out (views valid until the list is freed; not NUL-terminated). Returns
 *  0, or -1 when index is out of range. */
LANEBUS_C_API int lanebus_dlq_entry_header(const lanebus_dlq_entry* entry, size_t index, lanebus_header* out);

typedef struct lanebus_dlq_list lanebus_dlq_list;

/** Read the bus's dead-letter queue, oldest first.
 *  - topic: NULL for every topic, else only entries of that topic.
 *  - pending_only: nonzero for entries still waiting (state pending).
 *  *list holds a copy (valid until lanebus_dlq_list_free, independent of the bus).
 *  Errors: INVALID_ARGUMENT (NULL argument, an in-memory bus: no DLQ),
 *  SHUT_DOWN, storage codes. */
LANEBUS_C_API lanebus_code lanebus_dlq_list_entries(lanebus_bus* bus, const char* topic, int pending_only,
                                                    lanebus_dlq_list** list, lanebus_error* error);
/** Entries in the list (0 for NULL). */
LANEBUS_C_API size_t lanebus_dlq_list_size(const lanebus_dlq_list* list);
/** Entry i, or NULL when i is out of range. Valid until the list is freed. */
LANEBUS_C_API const lanebus_dlq_entry* lanebus_dlq_list_at(const lanebus_dlq_list* list, size_t i);
/** Free a list. NULL is OK. */
LANEBUS_C_API void lanebus_dlq_list_free(lanebus_dlq_list* list);

/** Replay entries: append each original message again to its origin topic and
 *  lane (same key) and mark the entry replayed, all or nothing. The copy is
 *  delivered like a new message. *replayed (may be NULL) gets the count.
 *  - operator_name: who did it, kept in the audit log; NULL or "" gives "capi".
 *  Errors: INVALID_ARGUMENT (NULL bus, NULL ids with count > 0, an in-memory
 *  bus), NOT_FOUND (an unknown id), CONFLICT (an entry already replayed or
 *  archived), SHUT_DOWN, storage codes. */
LANEBUS_C_API lanebus_code lanebus_dlq_replay(lanebus_bus* bus, const uint64_t* ids, size_t count,
                                              const char* operator_name, uint64_t* replayed, lanebus_error* error);

/* ---------------------------------------------------------------- stats */

/** A snapshot of the bus's counters as one JSON object (the layout of
 *  lanebus::to_json, doc/observability.md: topics, groups, lanes, DLQ).
 *  *json is a NUL-terminated string to free with lanebus_string_free.
 *  Errors: INVALID_ARGUMENT (NULL argument), INTERNAL (out of memory). */
LANEBUS_C_API lanebus_code lanebus_stats_json(lanebus_bus* bus, char** json, lanebus_error* error);

/** Free a string the library returned. NULL is OK. */
LANEBUS_C_API void lanebus_string_free(char* text);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* LANEBUS_LANEBUS_H */
