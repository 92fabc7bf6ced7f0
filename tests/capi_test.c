/* lanebus — MIT License.
 * The C API (include/lanebus/lanebus.h) driven by a C11 program, as a C user
 * or a foreign-function binding would: delivery to a C handler, retry then
 * ack, reject to the DLQ then list and replay, a durable queue that keeps its
 * messages across close and reopen, stats as JSON, and bad inputs that return
 * a code and a message instead of crashing, a log callback that stays
 * silent for ordinary traffic, and delayed and expiring publishes
 * (lanebus_publish_ex). */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lanebus/lanebus.h"

static int failures = 0;
static lanebus_error err; /* the last call's error (single-threaded test driver) */

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                          \
    }                                                                      \
  } while (0)

/* A call that must succeed; on failure print its message and stop the test. */
#define MUST(call)                                                                          \
  do {                                                                                      \
    lanebus_code must_rc_ = (call);                                                         \
    if (must_rc_ != LANEBUS_OK) {                                                           \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call,             \
              lanebus_code_name(must_rc_), err.message);                                    \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

/* A call that must fail with `code` and a message containing `text`. */
#define EXPECT_ERROR(want, text, call_with_err)                                                      \
  do {                                                                                               \
    memset(&err, 0x5a, sizeof err);                                                                  \
    lanebus_code rc_ = (call_with_err);                                                              \
    if (rc_ != (want) || err.code != (want) || strstr(err.message, (text)) == NULL) {               \
      fprintf(stderr, "%s:%d: %s: expected %s containing \"%s\", got %s / %s: \"%s\"\n", __FILE__, \
              __LINE__, #call_with_err, lanebus_code_name(want), (text), lanebus_code_name(rc_),     \
              lanebus_code_name(err.code), err.message);                                             \
      ++failures;                                                                                    \
    }                                                                                                \
  } while (0)

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Poll until *counter reaches want (10 s at most: only catches hangs). */
static int wait_count(atomic_int* counter, int want) {
  for (int i = 0; i < 10000 && atomic_load(counter) < want; ++i) sleep_ms(1);
  return atomic_load(counter) >= want;
}

static int remove_entry(const char* path, const struct stat* sb, int flag, struct FTW* ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void remove_tree(const char* dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* ---------------------------------------------------------------- handlers */

enum { kMaxSeen = 64 };

typedef struct recorder {
  atomic_int calls;
  atomic_int next;
  atomic_int done;
  char payloads[kMaxSeen][32];
  char keys[kMaxSeen][32];
  uint32_t attempts[kMaxSeen];
  /* retry_first: RETRY on attempt 1, ACK later. reject_bad: REJECT payloads starting "bad". */
  int retry_first;
  atomic_int reject_bad;
} recorder;

static void recorder_init(recorder* r) {
  memset(r, 0, sizeof *r);
  atomic_init(&r->calls, 0);
  atomic_init(&r->next, 0);
  atomic_init(&r->done, 0);
  atomic_init(&r->reject_bad, 0);
}

static void copy_bytes(char* dst, size_t cap, const void* src, size_t len) {
  size_t n = len < cap - 1 ? len : cap - 1;
  if (n > 0) memcpy(dst, src, n);
  dst[n] = '\0';
}

static lanebus_outcome record(lanebus_message* m, void* user) {
  recorder* r = user;
  atomic_fetch_add(&r->calls, 1);
  if (r->retry_first && m->attempt == 1) {
    m->reason = "first attempt always fails";
    return LANEBUS_RETRY;
  }
  if (atomic_load(&r->reject_bad) && m->payload_len >= 3 && memcmp(m->payload, "bad", 3) == 0) {
    m->reason = "bad payload: cannot parse";
    return LANEBUS_REJECT;
  }
  int i = atomic_fetch_add(&r->next, 1);
  if (i < kMaxSeen) {
    copy_bytes(r->payloads[i], sizeof r->payloads[i], m->payload, m->payload_len);
    copy_bytes(r->keys[i], sizeof r->keys[i], m->key, m->key_len);
    r->attempts[i] = m->attempt;
  }
  atomic_fetch_add(&r->done, 1);
  return LANEBUS_ACK;
}

static lanebus_outcome ack_all(lanebus_message* m, void* user) {
  (void)m;
  (void)user;
  return LANEBUS_ACK;
}

/* ---------------------------------------------------------------- cases */

static void publish_reaches_handler(void) {
  lanebus_bus* bus = NULL;
  MUST(lanebus_open("capi", NULL, 2, &bus, &err));
  lanebus_topic* topic = NULL;
  MUST(lanebus_create_topic(bus, "capi.orders", 4, 0, &topic, &err));
  lanebus_topic* again = NULL;
  MUST(lanebus_create_topic(bus, "capi.orders", 4, 0, &again, NULL));
  CHECK(again == topic); /* one handle per name */
  lanebus_topic* found = NULL;
  MUST(lanebus_find(bus, "capi.orders", &found, &err));
  CHECK(found == topic);

  static recorder billing, audit;
  recorder_init(&billing);
  recorder_init(&audit);
  lanebus_subscription* s1 = NULL;
  lanebus_subscription* s2 = NULL;
  MUST(lanebus_subscribe(bus, topic, "billing", record, &billing, 0, &s1, &err));
  MUST(lanebus_subscribe(bus, topic, "audit", record, &audit, 0, &s2, &err));
  for (int i = 0; i < 10; ++i) {
    char payload[32];
    int n = snprintf(payload, sizeof payload, "order-%d", i);
    MUST(lanebus_publish(topic, "customer-1", 10, payload, (size_t)n, &err));
  }
  CHECK(err.code == LANEBUS_OK && err.message[0] == '\0');
  CHECK(wait_count(&billing.done, 10));
  CHECK(wait_count(&audit.done, 10));
  /* One key = one lane: each group sees publish order. */
  for (int i = 0; i < 10; ++i) {
    char want[32];
    snprintf(want, sizeof want, "order-%d", i);
    CHECK(strcmp(billing.payloads[i], want) == 0);
    CHECK(strcmp(audit.payloads[i], want) == 0);
    CHECK(strcmp(billing.keys[i], "customer-1") == 0);
    CHECK(billing.attempts[i] == 1);
  }

  char* json = NULL;
  MUST(lanebus_stats_json(bus, &json, &err));
  CHECK(json != NULL && json[0] == '{');
  CHECK(json != NULL && strstr(json, "\"capi.orders\"") != NULL);
  lanebus_string_free(json);

  MUST(lanebus_unsubscribe(s1, &err));
  /* s2 is left open: lanebus_close frees it. */
  MUST(lanebus_close(bus, &err));
  printf("ok: publish reaches every group's C handler in key order (2 groups x 10)\n");
}

static void retry_then_ack(void) {
  lanebus_bus* bus = NULL;
  MUST(lanebus_open(NULL, NULL, 2, &bus, &err));
  lanebus_topic* queue = NULL;
  MUST(lanebus_create_queue(bus, "capi.jobs", 2, 0, &queue, &err));
  static recorder r;
  recorder_init(&r);
  r.retry_first = 1;
  lanebus_subscription* sub = NULL;
  MUST(lanebus_consume(bus, queue, record, &r, 3, &sub, &err));
  MUST(lanebus_publish(queue, NULL, 0, "job-1", 5, &err));
  CHECK(wait_count(&r.done, 1));
  CHECK(atomic_load(&r.calls) == 2); /* attempt 1 retried, attempt 2 acked */
  CHECK(strcmp(r.payloads[0], "job-1") == 0);
  CHECK(r.attempts[0] == 2);
  CHECK(strcmp(r.keys[0], "") == 0);
  MUST(lanebus_unsubscribe(sub, &err));
  MUST(lanebus_close(bus, &err));
  printf("ok: RETRY then ACK: 2 calls, acked on attempt 2\n");
}

/* A bus on the store root/<sub> with the durable queue `name` (2 lanes). */
static void open_durable_queue(const char* root, const char* sub, const char* name, lanebus_bus** bus,
                               lanebus_topic** queue) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", root, sub);
  MUST(lanebus_open(sub, dir, 2, bus, &err));
  MUST(lanebus_create_queue(*bus, name, 2, LANEBUS_DURABLE, queue, &err));
}

static void reject_to_dlq_then_replay(const char* root) {
  lanebus_bus* bus = NULL;
  lanebus_topic* queue = NULL;
  open_durable_queue(root, "dlq-store", "capi.payments", &bus, &queue);
  static recorder r;
  recorder_init(&r);
  atomic_store(&r.reject_bad, 1);
  lanebus_subscription* sub = NULL;
  MUST(lanebus_consume(bus, queue, record, &r, 0, &sub, &err));
  MUST(lanebus_publish(queue, "p1", 2, "good-1", 6, &err));
  const lanebus_header tenant = {"tenant", 6, "acme", 4};
  MUST(lanebus_publish_headers(queue, "p2", 2, "bad-2", 5, &tenant, 1, &err));
  CHECK(wait_count(&r.done, 1));

  /* The rejected message reaches the DLQ (poll: the entry is written by the store's writer). */
  lanebus_dlq_list* list = NULL;
  for (int i = 0; i < 10000; ++i) {
    MUST(lanebus_dlq_list_entries(bus, "capi.payments", 1, &list, &err));
    if (lanebus_dlq_list_size(list) > 0) break;
    lanebus_dlq_list_free(list);
    list = NULL;
    sleep_ms(1);
  }
  CHECK(list != NULL && lanebus_dlq_list_size(list) == 1);
  uint64_t id = 0;
  if (list != NULL && lanebus_dlq_list_size(list) == 1) {
    const lanebus_dlq_entry* e = lanebus_dlq_list_at(list, 0);
    CHECK(e != NULL);
    CHECK(lanebus_dlq_list_at(list, 1) == NULL);
    id = e->id;
    CHECK(strcmp(e->state, "pending") == 0);
    CHECK(strcmp(e->error_class, "permanent") == 0);
    CHECK(strcmp(e->topic, "capi.payments") == 0);
    CHECK(strstr(e->reason, "bad payload: cannot parse") != NULL);
    CHECK(e->payload_len == 5 && memcmp(e->payload, "bad-2", 5) == 0);
    CHECK(e->key_len == 2 && memcmp(e->key, "p2", 2) == 0);
    CHECK(e->attempts == 1);
    lanebus_header h;
    CHECK(lanebus_dlq_entry_header_count(e) == 1);
    CHECK(lanebus_dlq_entry_header(e, 0, &h) == 0);
    CHECK(h.name_len == 6 && memcmp(h.name, "tenant", 6) == 0 && h.value_len == 4 && memcmp(h.value, "acme", 4) == 0);
    CHECK(lanebus_dlq_entry_header(e, 1, &h) == -1);
    CHECK(lanebus_dlq_entry_header(NULL, 0, &h) == -1 && lanebus_dlq_entry_header_count(NULL) == 0);
  }
  lanebus_dlq_list_free(list);
  /* Every topic, any state: the same single entry. */
  MUST(lanebus_dlq_list_entries(bus, NULL, 0, &list, &err));
  CHECK(lanebus_dlq_list_size(list) == 1);
  lanebus_dlq_list_free(list);

  /* The consumer is fixed; replay delivers the message again and it is acked. */
  atomic_store(&r.reject_bad, 0);
  uint64_t replayed = 0;
  MUST(lanebus_dlq_replay(bus, &id, 1, "capi_test", &replayed, &err));
  CHECK(replayed == 1);
  CHECK(wait_count(&r.done, 2));
  CHECK(strcmp(r.payloads[1], "bad-2") == 0);
  CHECK(strcmp(r.keys[1], "p2") == 0);
  MUST(lanebus_dlq_list_entries(bus, "capi.payments", 1, &list, &err));
  CHECK(lanebus_dlq_list_size(list) == 0); /* nothing pending */
  lanebus_dlq_list_free(list);
  MUST(lanebus_dlq_list_entries(bus, "capi.payments", 0, &list, &err));
  CHECK(lanebus_dlq_list_size(list) == 1 && strcmp(lanebus_dlq_list_at(list, 0)->state, "replayed") == 0);
  lanebus_dlq_list_free(list);
  /* Replaying it again is a Conflict; an unknown id is NotFound. */
  EXPECT_ERROR(LANEBUS_CONFLICT, "", lanebus_dlq_replay(bus, &id, 1, NULL, &replayed, &err));
  uint64_t unknown = 999999;
  EXPECT_ERROR(LANEBUS_NOT_FOUND, "999999", lanebus_dlq_replay(bus, &unknown, 1, NULL, &replayed, &err));

  char* json = NULL;
  MUST(lanebus_stats_json(bus, &json, &err));
  CHECK(json != NULL && strstr(json, "\"dlq\"") != NULL);
  lanebus_string_free(json);
  MUST(lanebus_unsubscribe(sub, &err));
  MUST(lanebus_close(bus, &err));
  printf("ok: REJECT goes to the DLQ (listed with its reason), replay delivers it again\n");
}

static void durable_queue_survives_reopen(const char* root) {
  lanebus_bus* bus = NULL;
  lanebus_topic* queue = NULL;
  open_durable_queue(root, "jobs-store", "capi.durable_jobs", &bus, &queue);
  for (int i = 0; i < 5; ++i) {
    char payload[16];
    int n = snprintf(payload, sizeof payload, "job-%d", i);
    MUST(lanebus_publish(queue, "k", 1, payload, (size_t)n, &err));
  }
  MUST(lanebus_close(bus, &err)); /* nobody consumed them */

  open_durable_queue(root, "jobs-store", "capi.durable_jobs", &bus, &queue);
  static recorder r;
  recorder_init(&r);
  lanebus_subscription* sub = NULL;
  MUST(lanebus_consume(bus, queue, record, &r, 0, &sub, &err));
  CHECK(wait_count(&r.done, 5));
  for (int i = 0; i < 5; ++i) {
    char want[16];
    snprintf(want, sizeof want, "job-%d", i);
    CHECK(strcmp(r.payloads[i], want) == 0);
  }
  MUST(lanebus_unsubscribe(sub, &err));
  MUST(lanebus_close(bus, &err));
  printf("ok: a durable queue reopened after close delivers the 5 messages it kept\n");
}

static void bad_inputs(void) {
  lanebus_bus* bus = NULL;
  lanebus_topic* topic = NULL;
  lanebus_subscription* sub = NULL;
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_open(NULL, NULL, 1, NULL, &err));
  MUST(lanebus_open("capi-bad", NULL, 1, &bus, &err));
  MUST(lanebus_create_topic(bus, "capi.events", 0, 0, &topic, &err));
  lanebus_topic* queue = NULL;
  MUST(lanebus_create_queue(bus, "capi.work", 0, 0, &queue, &err));

  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_create_topic(NULL, "x", 0, 0, &topic, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_create_topic(bus, NULL, 0, 0, &topic, &err));
  CHECK(topic == NULL); /* out-parameters are cleared on failure */
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "unknown flags", lanebus_create_queue(bus, "capi.x", 0, 8, &topic, &err));
  EXPECT_ERROR(LANEBUS_INVALID_NAME, "Bad Name", lanebus_create_topic(bus, "Bad Name!", 0, 0, &topic, &err));
  EXPECT_ERROR(LANEBUS_CONFLICT, "capi.events", lanebus_create_queue(bus, "capi.events", 0, 0, &topic, &err));
  EXPECT_ERROR(LANEBUS_CONFLICT, "capi.events", lanebus_create_topic(bus, "capi.events", 3, 0, &topic, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "", lanebus_create_topic(bus, "capi.ondisk", 0, LANEBUS_DURABLE, &topic, &err));
  EXPECT_ERROR(LANEBUS_NOT_FOUND, "capi.unknown", lanebus_find(bus, "capi.unknown", &topic, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_find(NULL, "capi.events", &topic, &err));

  MUST(lanebus_find(bus, "capi.events", &topic, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "topic must not be NULL", lanebus_publish(NULL, NULL, 0, "x", 1, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "empty payload", lanebus_publish(topic, NULL, 0, "", 0, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "empty payload", lanebus_publish(topic, NULL, 0, NULL, 5, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "key is NULL", lanebus_publish(topic, NULL, 3, "x", 1, &err));
  CHECK(lanebus_publish(topic, NULL, 0, NULL, 0, NULL) == LANEBUS_INVALID_ARGUMENT); /* no error struct: fine */
  {
    static char big[2u << 20];
    memset(big, 'x', sizeof big);
    EXPECT_ERROR(LANEBUS_PAYLOAD_TOO_LARGE, "", lanebus_publish(topic, NULL, 0, big, sizeof big, &err));
  }

  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_subscribe(bus, NULL, "g", ack_all, NULL, 0, &sub, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_subscribe(bus, topic, "g", NULL, NULL, 0, &sub, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_subscribe(bus, topic, NULL, ack_all, NULL, 0, &sub, &err));
  EXPECT_ERROR(LANEBUS_INVALID_NAME, "", lanebus_subscribe(bus, topic, "Bad Group", ack_all, NULL, 0, &sub, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "queue", lanebus_subscribe(bus, queue, "g", ack_all, NULL, 0, &sub, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "", lanebus_consume(bus, topic, ack_all, NULL, 0, &sub, &err));
  CHECK(sub == NULL);

  lanebus_dlq_list* list = NULL;
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "", lanebus_dlq_list_entries(bus, NULL, 0, &list, &err));
  CHECK(list == NULL && lanebus_dlq_list_size(NULL) == 0 && lanebus_dlq_list_at(NULL, 0) == NULL);
  lanebus_dlq_list_free(NULL);
  uint64_t id = 1;
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "", lanebus_dlq_replay(bus, &id, 1, "op", NULL, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_dlq_replay(bus, NULL, 2, "op", NULL, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_stats_json(NULL, NULL, &err));
  lanebus_string_free(NULL);
  CHECK(lanebus_unsubscribe(NULL, &err) == LANEBUS_OK);

  /* Store errors name the cause: a store directory under a regular file. */
  char path[] = "/tmp/lanebus-capi-file-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) {
    close(fd);
    char below[600];
    snprintf(below, sizeof below, "%s/store", path);
    lanebus_bus* other = NULL;
    memset(&err, 0, sizeof err);
    lanebus_code rc = lanebus_open("capi-bad-dir", below, 1, &other, &err);
    CHECK(rc != LANEBUS_OK && other == NULL && err.code == rc && strstr(err.message, path) != NULL);
    unlink(path);
  }

  MUST(lanebus_close(bus, &err));
  CHECK(lanebus_close(NULL, &err) == LANEBUS_OK);
  printf("ok: bad inputs give a code and a message, never a crash\n");
}

/* A handler that closes its own subscription and its bus: both BUSY, nothing freed. */
typedef struct self_closer {
  lanebus_bus* bus;
  lanebus_subscription* _Atomic sub;
  atomic_int unsubscribe_rc;
  atomic_int close_rc;
  atomic_int calls;
} self_closer;

static lanebus_outcome close_self(lanebus_message* m, void* user) {
  (void)m;
  self_closer* c = user;
  lanebus_subscription* sub = NULL;
  for (int i = 0; i < 10000 && (sub = atomic_load(&c->sub)) == NULL; ++i) sleep_ms(1);
  lanebus_error e;
  atomic_store(&c->unsubscribe_rc, (int)lanebus_unsubscribe(sub, &e));
  atomic_store(&c->close_rc, (int)lanebus_close(c->bus, NULL));
  atomic_fetch_add(&c->calls, 1);
  return LANEBUS_ACK;
}

static void closing_from_a_handler_is_busy(void) {
  static self_closer c;
  memset(&c, 0, sizeof c);
  atomic_init(&c.sub, NULL);
  atomic_init(&c.unsubscribe_rc, -1);
  atomic_init(&c.close_rc, -1);
  atomic_init(&c.calls, 0);
  MUST(lanebus_open("capi-busy", NULL, 1, &c.bus, &err));
  lanebus_topic* topic = NULL;
  MUST(lanebus_create_topic(c.bus, "capi.busy", 1, 0, &topic, &err));
  lanebus_subscription* sub = NULL;
  MUST(lanebus_subscribe(c.bus, topic, "g", close_self, &c, 0, &sub, &err));
  atomic_store(&c.sub, sub);
  MUST(lanebus_publish(topic, NULL, 0, "x", 1, &err));
  CHECK(wait_count(&c.calls, 1));
  CHECK(atomic_load(&c.unsubscribe_rc) == LANEBUS_BUSY);
  CHECK(atomic_load(&c.close_rc) == LANEBUS_BUSY);
  MUST(lanebus_unsubscribe(sub, &err)); /* from this thread: frees the detached handle */
  MUST(lanebus_close(c.bus, &err));
  printf("ok: unsubscribe and close from inside a handler return BUSY and free nothing\n");
}

static void names_and_version(void) {
  CHECK(strcmp(lanebus_code_name(LANEBUS_OK), "OK") == 0);
  CHECK(strcmp(lanebus_code_name(LANEBUS_WOULD_BLOCK), "WouldBlock") == 0);
  CHECK(strcmp(lanebus_code_name(LANEBUS_INTERNAL), "Internal") == 0);
  CHECK(strcmp(lanebus_code_name((lanebus_code)200), "Unknown") == 0);
  const char* v = lanebus_version();
  CHECK(v != NULL && v[0] >= '0' && v[0] <= '9' && strchr(v, '.') != NULL);
  printf("ok: lanebus_version() = %s; code names match the C++ names\n", v);
}

static atomic_int log_lines;

static void count_lines(lanebus_log_level level, const char* message, size_t length, void* user) {
  (void)level;
  (void)user;
  CHECK(message != NULL && strlen(message) == length);
  atomic_fetch_add(&log_lines, 1);
}

/* A log callback is not called for ordinary traffic (the events that do call
 * it are caused in tests/fault_test.cpp and tests/log_hook_test.cpp). */
static void log_callback_is_silent_on_the_hot_path(const char* root) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/logged", root);
  lanebus_bus* bus = NULL;
  MUST(lanebus_open_logged("capi-logged", dir, 2, count_lines, NULL, &bus, &err));
  lanebus_topic* topic = NULL;
  lanebus_topic* queue = NULL;
  MUST(lanebus_create_topic(bus, "capi.hot", 4, 0, &topic, &err));
  MUST(lanebus_create_queue(bus, "capi.hot-jobs", 2, LANEBUS_DURABLE, &queue, &err));
  static recorder r;
  recorder_init(&r);
  lanebus_subscription* s1 = NULL;
  lanebus_subscription* s2 = NULL;
  MUST(lanebus_subscribe(bus, topic, "g", ack_all, NULL, 0, &s1, &err));
  MUST(lanebus_consume(bus, queue, record, &r, 0, &s2, &err));
  for (int i = 0; i < 10000; ++i) MUST(lanebus_publish(topic, "k", 1, "p", 1, &err));
  for (int i = 0; i < 50; ++i) MUST(lanebus_publish(queue, "k", 1, "job", 3, &err));
  CHECK(wait_count(&r.done, 50));
  MUST(lanebus_close(bus, &err));
  CHECK(atomic_load(&log_lines) == 0);
  /* NULL callback: lanebus_open; NULL out-parameter: INVALID_ARGUMENT. */
  MUST(lanebus_open_logged("capi-quiet", NULL, 1, NULL, NULL, &bus, &err));
  MUST(lanebus_close(bus, &err));
  CHECK(lanebus_open_logged(NULL, NULL, 1, count_lines, NULL, NULL, &err) == LANEBUS_INVALID_ARGUMENT);
  printf("ok: lanebus_open_logged: 10,050 publishes, 0 log lines\n");
}

/* Headers (doc/tracing.md): published with lanebus_publish_headers, read in the
 * handler with lanebus_message_header; bad ones refused with a code. */
static char header_seen[256];
static atomic_int header_calls;
static lanebus_outcome read_headers(lanebus_message* m, void* user) {
  (void)user;
  size_t n = lanebus_message_header_count(m);
  size_t at = 0;
  for (size_t i = 0; i < n && at + 80 < sizeof header_seen; ++i) {
    lanebus_header h;
    if (lanebus_message_header(m, i, &h) != 0) break;
    at += (size_t)snprintf(header_seen + at, sizeof header_seen - at, "%.*s=%.*s;", (int)h.name_len, h.name,
                           (int)h.value_len, h.value);
  }
  lanebus_header none;
  if (lanebus_message_header(m, n, &none) != -1) header_seen[0] = '!';
  atomic_fetch_add(&header_calls, 1);
  return LANEBUS_ACK;
}

static void headers_travel(void) {
  lanebus_bus* bus = NULL;
  MUST(lanebus_open("capi-headers", NULL, 1, &bus, &err));
  lanebus_topic* topic = NULL;
  MUST(lanebus_create_topic(bus, "capi.traced", 1, 0, &topic, &err));
  atomic_init(&header_calls, 0);
  lanebus_subscription* sub = NULL;
  MUST(lanebus_subscribe(bus, topic, "reader", read_headers, NULL, 0, &sub, &err));
  static const char tp[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  lanebus_header hs[2] = {{"traceparent", 11, tp, sizeof tp - 1}, {"tenant", 6, "acme", 4}};
  MUST(lanebus_publish_headers(topic, "k", 1, "x", 1, hs, 2, &err));
  CHECK(wait_count(&header_calls, 1));
  CHECK(strcmp(header_seen, "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01;tenant=acme;") == 0);
  lanebus_header bad_tp = {"traceparent", 11, "00-zz", 5};
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "traceparent", lanebus_publish_headers(topic, "k", 1, "x", 1, &bad_tp, 1, &err));
  lanebus_header many[17];
  for (int i = 0; i < 17; ++i) many[i] = hs[1];
  EXPECT_ERROR(LANEBUS_PAYLOAD_TOO_LARGE, "at most 16",
               lanebus_publish_headers(topic, "k", 1, "x", 1, many, 17, &err));
  EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "NULL", lanebus_publish_headers(topic, "k", 1, "x", 1, NULL, 1, &err));
  MUST(lanebus_unsubscribe(sub, &err));
  MUST(lanebus_close(bus, &err));
  printf("ok: headers reach the C handler; bad headers are refused\n");
}

/* ---------------------------------------------------------------- delays and expiry */

static int64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

enum { kTimed = 8 };

/* Payloads "t0".."t7": when each arrived (wall clock) and its created_at. */
typedef struct timed_recorder {
  atomic_int done;
  atomic_int order_next;
  int64_t arrived[kTimed];
  int64_t created[kTimed];
  int order[kTimed]; /* payload numbers in arrival order */
} timed_recorder;

static lanebus_outcome record_time(lanebus_message* m, void* user) {
  timed_recorder* r = user;
  const int64_t now = wall_ns();
  const char* p = m->payload;
  if (m->payload_len == 2 && p[0] == 't' && p[1] >= '0' && p[1] < '0' + kTimed) {
    int i = p[1] - '0';
    r->arrived[i] = now;
    r->created[i] = m->created_at_ns;
    int k = atomic_fetch_add(&r->order_next, 1);
    if (k < kTimed) r->order[k] = i;
  }
  atomic_fetch_add(&r->done, 1); /* publishes the stores above to the test thread */
  return LANEBUS_ACK;
}

/* delay_ns / deliver_at_ns / ttl_ns through lanebus_publish_ex, in memory and
 * durable: never early, created_at = due time, due-time order, an expired
 * message never delivered and counted, the refusals named. */
static void delayed_and_expiring_publish(const char* root) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/delays", root);
  for (int durable = 0; durable < 2; ++durable) {
    lanebus_bus* bus = NULL;
    lanebus_topic* topic = NULL;
    lanebus_subscription* sub = NULL;
    timed_recorder* r = calloc(1, sizeof *r);
    atomic_init(&r->done, 0);
    atomic_init(&r->order_next, 0);
    MUST(lanebus_open("capi-delays", durable ? dir : NULL, 2, &bus, &err));
    MUST(lanebus_create_topic(bus, "capi.later", 2, durable ? LANEBUS_DURABLE : 0, &topic, &err));
    MUST(lanebus_subscribe(bus, topic, "g", record_time, r, 0, &sub, &err));
    const int64_t t0 = wall_ns();
    lanebus_publish_options o = {0};
    /* Due times 150 ms apart: a publisher stalled by a loaded machine does not reorder them. */
    o.delay_ns = 450000000; /* t0: 450 ms */
    MUST(lanebus_publish_ex(topic, "k", 1, "t0", 2, &o, &err));
    lanebus_publish_options at = {0};
    at.deliver_at_ns = t0 + 300000000; /* t1: at t0 + 300 ms, same key: before t0 */
    MUST(lanebus_publish_ex(topic, "k", 1, "t1", 2, &at, &err));
    MUST(lanebus_publish_ex(topic, "k", 1, "t2", 2, NULL, &err)); /* t2: now, not held back */
    lanebus_publish_options both = {0};
    both.delay_ns = 150000000; /* t3: delayed 150 ms into a 10 s TTL: delivered */
    both.ttl_ns = 10000000000LL;
    MUST(lanebus_publish_ex(topic, "k", 1, "t3", 2, &both, &err));
    CHECK(wait_count(&r->done, 4));
    CHECK(r->arrived[0] >= t0 + 450000000 - 1000000); /* never early (1 ms: the bus's clock against ours) */
    CHECK(r->arrived[1] >= t0 + 300000000 - 1000000);
    CHECK(r->created[1] == t0 + 300000000); /* it entered its lane at its due time */
    CHECK(r->created[0] >= t0 + 450000000 - 1000000);
    if (!(r->order[0] == 2 && r->order[1] == 3 && r->order[2] == 1 && r->order[3] == 0)) {
      fprintf(stderr, "%s: arrival order t%d t%d t%d t%d, expected t2 t3 t1 t0\n", durable ? "durable" : "in memory",
              r->order[0], r->order[1], r->order[2], r->order[3]);
      ++failures;
    }
    /* Expiry: a 1 ns TTL ends before any handler call can start. */
    lanebus_publish_options brief = {0};
    brief.ttl_ns = 1;
    MUST(lanebus_publish_ex(topic, "k", 1, "t4", 2, &brief, &err));
    char* json = NULL;
    int expired = 0;
    for (int i = 0; i < 5000 && !expired; ++i) {
      MUST(lanebus_stats_json(bus, &json, &err));
      expired = strstr(json, "\"expired\":1") != NULL;
      lanebus_string_free(json);
      if (!expired) sleep_ms(1);
    }
    CHECK(expired);
    CHECK(r->arrived[4] == 0);
    /* The refusals: code and a message naming the values. */
    lanebus_publish_options bad = {0};
    bad.delay_ns = 100000000;
    bad.ttl_ns = 50000000;
    EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "expire before it is due",
                 lanebus_publish_ex(topic, "k", 1, "x", 1, &bad, &err));
    CHECK(strstr(err.message, "ttl 50000000 ns") != NULL);
    bad.ttl_ns = 0;
    bad.deliver_at_ns = t0;
    EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "not both", lanebus_publish_ex(topic, "k", 1, "x", 1, &bad, &err));
    bad.deliver_at_ns = 0;
    bad.delay_ns = -5;
    EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "delay is negative", lanebus_publish_ex(topic, "k", 1, "x", 1, &bad, &err));
    bad.delay_ns = 0;
    bad.ttl_ns = -1;
    EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "ttl is -1 ns", lanebus_publish_ex(topic, "k", 1, "x", 1, &bad, &err));
    EXPECT_ERROR(LANEBUS_INVALID_ARGUMENT, "topic must not be NULL",
                 lanebus_publish_ex(NULL, "k", 1, "x", 1, &brief, &err));
    MUST(lanebus_unsubscribe(sub, &err));
    MUST(lanebus_close(bus, &err));
    free(r);
  }
  printf("ok: lanebus_publish_ex: delay, deliver_at and ttl, in memory and durable; refusals named\n");
}

int main(void) {
  char root[] = "/tmp/lanebus-capi-XXXXXX";
  if (mkdtemp(root) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  names_and_version();
  publish_reaches_handler();
  headers_travel();
  retry_then_ack();
  reject_to_dlq_then_replay(root);
  durable_queue_survives_reopen(root);
  bad_inputs();
  closing_from_a_handler_is_busy();
  log_callback_is_silent_on_the_hot_path(root);
  delayed_and_expiring_publish(root);
  if (failures == 0) {
    remove_tree(root);
    printf("capi_test: all checks passed\n");
    return 0;
  }
  fprintf(stderr, "capi_test: %d checks failed (store kept in %s)\n", failures, root);
  return 1;
}
